"""The pandas UDF that reads each CSV file's header on the executors (:func:`sluice_spark.drift.csv.header_text`).

A module of its own because pandas takes about half a second to import, and a run pays for every import of the
modules it loads: only a stream whose CSV files are matched by their headers needs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
from pyspark.sql import functions as F


def header_udf(options: tuple[tuple[str, str], ...],
               header_of: Callable[[str, tuple[Any, Any], tuple[tuple[str, str], ...]], str | None]) -> Any:
    """A pandas UDF: a file (its ``_metadata.file_path``), its modification time and size -> its header's text, as
    ``header_of`` reads it, each file read once per batch of rows."""

    @F.pandas_udf("string")  # type: ignore[call-overload]
    def header(files: pd.Series, modified: pd.Series, sizes: pd.Series) -> pd.Series:
        # A batch of rows holds a few files (each at one version): each is looked up once.
        versions = pd.DataFrame({"file": files, "modified": modified, "size": sizes}).drop_duplicates("file")
        found = {row.file: header_of(row.file, (row.modified, row.size), options)
                 for row in versions.itertuples(index=False)}
        return files.map(found)

    return header
