"""The snapshots a range backfill of an Iceberg source reads (no Spark): by sequence number or commit time, appends
only, a compaction passed over, an overwrite refused unless the source skips it, and every bad range refused by the
param it is about."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest

from sluice.errors import BackfillError
from sluice.operations.iceberg_range import plan_snapshot_range
from sluice.storage.iceberg import IcebergTableFormat, default_catalog_properties


def table_of(tmp_path: Path) -> IcebergTableFormat:
    """Three appends of 1, 2 and 3 rows (sequence numbers 1 to 3), then an overwrite of the whole table: a delete
    (4) and an append of 1 row (5)."""
    table = IcebergTableFormat("db.events", default_catalog_properties(str(tmp_path / "lake")))
    rows = pa.table({"id": pa.array([0], pa.int64())})
    table.ensure(rows.schema)
    for batch, size in enumerate((1, 2, 3)):
        table.commit_batch(pa.table({"id": pa.array(range(size), pa.int64())}), query_id="q", batch_id=batch,
                           metadata={})
    table.commit_batch(rows, query_id="q", batch_id=3, metadata={}, overwrite=True)
    return table


def test_a_sequence_range_counts_each_append_and_a_delete_is_refused_unless_skipped(tmp_path: Path) -> None:
    table = table_of(tmp_path)
    sequences = sorted(s.sequence_number for s in table.table().snapshots())
    assert sequences[:3] == [1, 2, 3]
    plan = plan_snapshot_range(table, start_version=2, end_version=3)
    assert (plan.first, plan.last, [v.version for v in plan.versions], plan.records) == (2, 3, [2, 3], 5)
    with pytest.raises(BackfillError, match="is an delete") as caught:
        plan_snapshot_range(table, start_version=1)
    assert caught.value.field == "start_version"
    skipped = plan_snapshot_range(table, start_version=1, options={"streaming-skip-delete-snapshots": "true"})
    assert (skipped.first, skipped.last, [v.version for v in skipped.versions], skipped.records) == (
        1, 5, [1, 2, 3, 5], 7)


def test_a_commit_time_range_takes_the_snapshots_committed_in_it(tmp_path: Path) -> None:
    table = table_of(tmp_path)
    second = next(s for s in table.table().snapshots() if s.sequence_number == 2)
    at = dt.datetime.fromtimestamp(second.timestamp_ms / 1000, dt.timezone.utc)
    plan = plan_snapshot_range(table, start=at, end=at + dt.timedelta(milliseconds=1))
    assert (plan.first, plan.last, plan.records) == (2, 2, 2)


def test_bad_ranges_are_refused_by_their_param(tmp_path: Path) -> None:
    missing = IcebergTableFormat("db.none", default_catalog_properties(str(tmp_path / "lake")))
    with pytest.raises(BackfillError, match="does not exist"):
        plan_snapshot_range(missing, start_version=1)
    table = table_of(tmp_path)
    now = dt.datetime.now(dt.timezone.utc)
    for kwargs, field in (({"start_version": 1, "end_version": 9}, "end_version"),
                          ({"start_version": 3, "end_version": 2}, "end_version"),
                          ({"end_version": 2}, "start_version"),
                          ({"start_version": 1, "start": now, "end": now}, "start_version"),
                          ({"start": now, "end": now}, "end"),
                          ({"start": now - dt.timedelta(days=2), "end": now - dt.timedelta(days=1)}, "start")):
        with pytest.raises(BackfillError) as caught:
            plan_snapshot_range(table, **kwargs)  # type: ignore[arg-type]
        assert caught.value.field == field, kwargs
