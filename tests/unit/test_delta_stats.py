"""Delta file statistics from Parquet footers: exact or absent, never approximate."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sluice_spark.rs.stats import file_stats as _file_stats
from sluice_spark.rs.stats import partition_string as _partition_string


def stats_of(tmp_path: Path, table: pa.Table) -> dict:
    path = tmp_path / "f.parquet"
    pq.write_table(table, path)
    return json.loads(_file_stats(pq.ParquetFile(path).metadata, table.num_rows))


def test_bounds_and_null_counts(tmp_path: Path) -> None:
    table = pa.table({
        "n": [3, None, 1],
        "s": ["b", "a", None],
        "d": pa.array([Decimal("1.10"), Decimal("9.99"), None], pa.decimal128(12, 2)),
        "day": [dt.date(2026, 1, 2), dt.date(2026, 1, 1), None],
    })
    stats = stats_of(tmp_path, table)
    assert stats["numRecords"] == 3
    assert stats["nullCount"] == {"n": 1, "s": 1, "d": 1, "day": 1}
    assert stats["minValues"] == {"n": 1, "s": "a", "d": 1.1, "day": "2026-01-01"}
    assert stats["maxValues"] == {"n": 3, "s": "b", "d": 9.99, "day": "2026-01-02"}


def test_timestamp_upper_bound_rounds_up_to_the_millisecond(tmp_path: Path) -> None:
    moments = [dt.datetime(2026, 1, 1, 0, 0, 0, 1500, tzinfo=dt.timezone.utc),
               dt.datetime(2026, 1, 1, 0, 0, 0, 2001, tzinfo=dt.timezone.utc)]
    stats = stats_of(tmp_path, pa.table({"t": pa.array(moments, pa.timestamp("us", tz="UTC"))}))
    assert stats["minValues"]["t"] == "2026-01-01T00:00:00.001Z"
    assert stats["maxValues"]["t"] == "2026-01-01T00:00:00.003Z"


def test_long_strings_and_wide_decimals_have_no_bounds(tmp_path: Path) -> None:
    table = pa.table({
        "s": ["x" * 40, "y"],
        "d": pa.array([Decimal("12345678901234567.1"), Decimal("1.0")], pa.decimal128(20, 1)),
    })
    stats = stats_of(tmp_path, table)
    assert "s" not in stats["minValues"] and "d" not in stats["minValues"]
    assert stats["nullCount"] == {"s": 0, "d": 0}


def test_partition_values_follow_the_delta_protocol() -> None:
    assert _partition_string(None) is None
    assert _partition_string(True) == "true"
    assert _partition_string(dt.date(2026, 11, 22)) == "2026-11-22"
    assert _partition_string(dt.datetime(2026, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))) == \
        "2026-01-01 00:00:00.000000"
