"""CSV files read under a drift policy by Spark's typed reader when their headers are the declared names
(:func:`sluice_spark.drift.csv.conform_checked`), and planned again by header when one is not.

Oracles: :func:`sluice_spark.drift.csv.conform` (the by-header path) over the same files, and Spark's own CSV reader
with the declared schema."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.constants import CORRUPT_COLUMN, RESCUED_COLUMN, SOURCE_FILE_COLUMN
from sluice.model.types import quote
from sluice.storage.delta import read_table
from sluice_spark.drift import csv as csv_drift
from sluice_spark.runner import run_streams
from tests.helpers import events_stream, roots_in, write_catalog

pytestmark = pytest.mark.spark

SCHEMA = {"order_id": "string not null", "amount": "decimal(12,2)", "note": "string", "at": "timestamp"}
OPTIONS = {"sep": ";", "quote": "'", "escape": "\\", "comment": "#", "multiLine": True, "nullValue": "NA",
           "ignoreLeadingWhiteSpace": True, "timestampFormat": "yyyy-MM-dd HH:mm"}
# Records that fit, values that do not (o4, o7), a quoted NULL marker, quoted spaces, multi-line values, and
# records with too few and too many fields (o8, o9).
EXPORT = ("order_id;amount;note;at\n# exported by the shop\n"
          "o1;9.50;'two\nlines; one value';2026-11-22 10:00\n"
          "o2;NA;'it\\'s quoted';2026-11-22 10:01\n"
          "o3;  1.25;;NA\n"
          "o4;x;'NA';later\n"
          "o5;2.00;' padded ';2026-11-22 10:02\n"
          "o6;3.00;'   ';2026-11-22 10:03\n"
          "o7;12345678901234.5;'big';2026-11-22 10:04\n"
          "o8;1.00\n"
          "o9;1.00;n;2026-11-22 10:05;extra\n")


def csv_stream(name: str, **options: Any) -> dict[str, Any]:
    source = {"type": "files", "format": "csv", "path": name, "options": {"header": True, **options},
              "schema": SCHEMA, "schema_evolution": "rescue"}
    return events_stream(name, source=source, transform="identity", sink={"path": f"bronze/{name}", "engine": "rs"})


def rows(frame: Any) -> dict[str, dict[str, Any]]:
    """A frame's rows by their record's text or order id (a malformed record's ``order_id`` is NULL on one side)."""
    found = {}
    for row in frame.collect():
        values = row.asDict(recursive=True)
        found[values["order_id"] or values[CORRUPT_COLUMN]] = values
    return found


def test_a_checked_read_gives_the_by_header_rows(spark: Any, tmp_path: Path) -> None:
    """Every column of every row (typed values, ``_corrupt_record``, ``_rescued_data``, the fields kept for a dead
    letter's reason) is the by-header path's, with the stream's quoting, escapes, comments, multi-line values,
    whitespace and nullValue; the values of the records Spark's reader typed whole are its own."""
    from pyspark.sql import functions as F

    folder = tmp_path / "landing" / "orders"
    folder.mkdir(parents=True)
    (folder / "export.csv").write_text(EXPORT, encoding="utf-8")
    source = load_catalog(write_catalog(tmp_path, csv_stream("orders", **OPTIONS))).get("orders").source
    names = source.read_schema.names

    def read(schema: str, enforce: str) -> Any:
        return spark.read.options(**source.options).option("enforceSchema", enforce).schema(schema) \
            .option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT_COLUMN).csv(str(folder))

    typed_ddl = f"{source.read_schema.ddl(nullable_only=True)}, `{CORRUPT_COLUMN}` STRING"
    by_header = csv_drift.conform(read(csv_drift.read_schema_ddl(source), "true").select(
        *map(quote, names), CORRUPT_COLUMN, F.col("_metadata.file_path").alias(SOURCE_FILE_COLUMN),
        *csv_drift.file_version()), source)
    checked = csv_drift.conform_checked(read(typed_ddl, "false").select(
        *map(quote, names), CORRUPT_COLUMN, F.col("_metadata.file_path").alias(SOURCE_FILE_COLUMN)), source)

    expected, found = rows(by_header), rows(checked)
    assert checked.schema == by_header.schema
    assert sorted(found) == sorted(expected) and len(found) == 9
    for key, row in expected.items():
        assert found[key] == row, key
    assert json.loads(found["o4"][RESCUED_COLUMN]) == {"amount": "x", "at": "later"}
    assert json.loads(found["o7"][RESCUED_COLUMN]) == {"amount": "12345678901234.5"}
    assert found["o1"]["note"] == "two\nlines; one value" and found["o5"]["note"] == " padded "
    # Spark's own reader: the records it typed whole.
    for row in read(typed_ddl, "false").where(F.col(CORRUPT_COLUMN).isNull()).collect():
        assert {name: found[row["order_id"]][name] for name in names} == {name: row[name] for name in names}
    assert found["o3"]["amount"] == Decimal("1.25") and found["o2"]["amount"] is None


def test_a_file_with_another_header_plans_the_stream_again_by_header(spark: Any, tmp_path: Path) -> None:
    """A run whose files all carry the declared header is read by Spark's typed reader; a file with another header
    fails that query, and the run plans the stream again by header: the batch lands whole, by name, once; later runs
    of the process read that stream by header from the start."""
    catalog = load_catalog(write_catalog(tmp_path, csv_stream("plain"), csv_stream("moved")))
    roots = roots_in(tmp_path)
    for name in ("plain", "moved"):
        (tmp_path / "landing" / name).mkdir(parents=True)
        (tmp_path / "landing" / name / "a.csv").write_text("order_id,amount,note,at\no1,1.00,n,2026-11-22T10:00:00Z\n"
                                                           "o2,x,n,2026-11-22T10:00:00Z\n")
    (tmp_path / "landing" / "moved" / "b.csv").write_text("at,extra,order_id,amount\n2026-11-22T11:00:00Z,e,o3,3.00\n")

    runs = run_streams(spark, catalog, ["plain", "moved"], roots).streams

    assert [run.status for run in runs] == ["succeeded"] * 2, [run.error for run in runs]
    assert csv_drift.checks_headers("plain", catalog.get("plain").source_path(roots)) is False  # outside a run
    with csv_drift.headers_checked_by_reader():
        assert csv_drift.checks_headers("plain", catalog.get("plain").source_path(roots))
        assert not csv_drift.checks_headers("moved", catalog.get("moved").source_path(roots))
    plain = {row["order_id"]: row for row in read_table(catalog.get("plain").sink_path(roots)).to_pylist()}
    moved = {row["order_id"]: row for row in read_table(catalog.get("moved").sink_path(roots)).to_pylist()}
    assert sorted(moved) == ["o1", "o2", "o3"] and sorted(plain) == ["o1", "o2"]
    assert json.loads(moved["o3"][RESCUED_COLUMN]) == {"extra": "e"} and moved["o3"]["amount"] == Decimal("3.00")
    assert json.loads(plain["o2"][RESCUED_COLUMN]) == json.loads(moved["o2"][RESCUED_COLUMN]) == {"amount": "x"}
    assert moved["o3"]["note"] is None and runs[1].input_rows == runs[1].output_rows == 3

    (tmp_path / "landing" / "moved" / "c.csv").write_text("order_id,amount,note,at\no4,4.00,n,2026-11-22T12:00:00Z\n")
    [again] = run_streams(spark, catalog, ["moved"], roots).streams

    assert again.status == "succeeded" and again.input_rows == 1, again.error
    assert len(read_table(catalog.get("moved").sink_path(roots)).to_pylist()) == 4
