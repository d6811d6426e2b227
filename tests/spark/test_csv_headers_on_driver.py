"""The headers of a CSV stream's files read by the driver before the run (:func:`sluice_spark.drift.csv.known_headers`)
and looked up in the JVM give the rows the executors' own reading gives, for any mix of files the driver read and
files it did not (landed since its listing, or written again): the end-to-end runs of ``tests/spark/test_drift.py``
read every file through the driver, these compare both paths on one frame."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from sluice.catalog import load_catalog
from sluice.constants import CORRUPT_COLUMN, SOURCE_FILE_COLUMN
from sluice.model.types import quote
from sluice.storage.landing import spark_file_uri
from sluice_spark.drift import csv as csv_drift
from tests.helpers import write_catalog
from tests.spark.test_drift import CSV_EXPORTS, csv_stream

pytestmark = pytest.mark.spark

# A header whose names a SQL literal must keep as they are: a quote, a backslash, a substitution.
EXPORTS = {**CSV_EXPORTS, "e f.csv": "order_id,it's,${spark.app.name}\\x\no8,1,2\n"}


def test_the_drivers_headers_and_the_executors_give_the_same_rows(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, csv_stream("orders", "orders")))
    source = catalog.get("orders").source
    folder = tmp_path / "landing"
    folder.mkdir()
    for name, text in EXPORTS.items():
        (folder / name).write_text(text, encoding="utf-8")
    files = [(spark_file_uri(str(path)), path.stat().st_size, path.stat().st_mtime) for path in sorted(
        folder.iterdir())]
    frame = spark.read.format("csv").options(**source.options).option("enforceSchema", "true") \
        .schema(csv_drift.read_schema_ddl(source)).option("mode", "PERMISSIVE") \
        .option("columnNameOfCorruptRecord", CORRUPT_COLUMN).load(str(folder)) \
        .select(*[quote(name) for name in source.read_schema.names], CORRUPT_COLUMN,
                F.col("_metadata.file_path").alias(SOURCE_FILE_COLUMN), *csv_drift.file_version())

    def rows(headers: dict[tuple[str, int, int], str]) -> list[tuple[Any, ...]]:
        return sorted(tuple(str(value) for value in row) for row in csv_drift.conform(frame, source, headers)
                      .collect())

    every = csv_drift.known_headers(source, files)
    some = dict(list(every.items())[::2])
    stale = {(path, size + 1, modified): header for (path, size, modified), header in every.items()}

    by_executors = rows({})
    assert len(every) == len(EXPORTS) and every[(files[-1][0], files[-1][1], int(files[-1][2]))] == \
        "order_id,it's,${spark.app.name}\\x"
    assert rows(every) == rows(some) == rows(stale) == by_executors
    assert any("it's" in text and "${spark.app.name}\\\\x" in text for row in by_executors for text in row)

