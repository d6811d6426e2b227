"""Sluice core: the stream catalog, its validation, and the pure-Python helpers shared by DAGs, plugins and apps.

Nothing in this package imports pyspark or Airflow at module level, so DAG parsing, health checks and lag checks
stay cheap.
"""

from __future__ import annotations

from sluice.errors import CatalogError, SluiceError

__all__ = ["CatalogError", "SluiceError"]
