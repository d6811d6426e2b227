"""The stream catalog: load it, validate it, ask it about its streams.

Loading is :mod:`sluice.catalog.loader` (the stream's own keys), :mod:`sluice.catalog.patterns` (its stateful
patterns) and the source and sink kinds (:mod:`sluice.kinds`); the whole catalog and the folders its streams must
not share are :mod:`sluice.catalog.streams`. What one stream declares is :mod:`sluice.model`.
"""

from __future__ import annotations

from sluice.catalog.loader import DEFAULT_CATALOG, cached_catalog, load_catalog, parse_catalog, parse_stream
from sluice.catalog.streams import Catalog

__all__ = ["DEFAULT_CATALOG", "Catalog", "cached_catalog", "load_catalog", "parse_catalog", "parse_stream"]
