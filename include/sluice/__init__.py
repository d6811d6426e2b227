"""Sluice core: the stream catalog, its validation, and the pure-Python helpers shared by DAGs, plugins and apps.

Nothing in this package imports pyspark or Airflow at module level, so DAG parsing, health checks and lag checks
stay cheap.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from sluice.errors import CatalogError, SluiceError

try:
    # One version, pyproject.toml's, as the installed package's metadata records it.
    __version__ = version("sluice")
except PackageNotFoundError:  # run from a checkout that was never installed (PYTHONPATH=include)
    __version__ = "0+unknown"

__all__ = ["CatalogError", "SluiceError", "__version__"]
