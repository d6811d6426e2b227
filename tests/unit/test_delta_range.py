"""Planning a range backfill of a Delta source against real delta-rs tables: the versions a version range or a time
range selects, their counts for a dry run, and the refusals that name their param before anything is read."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from sluice.operations.backfill import BackfillError
from sluice.operations.delta_range import plan_version_range


def append(table: str, ids: list[int], **options: object) -> int:
    write_deltalake(table, pa.table({"id": pa.array(ids, pa.int64())}), mode="append", **options)  # type: ignore[arg-type]
    return DeltaTable(table).version()


def refused(field: str, fragment: str, table: str, **params: object) -> None:
    with pytest.raises(BackfillError) as caught:
        plan_version_range(table, **params)  # type: ignore[arg-type]
    assert caught.value.field == field and fragment in str(caught.value), str(caught.value)


def test_a_version_range_counts_what_each_version_adds(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    for first in (0, 10, 20):
        append(table, list(range(first, first + 10 - first // 10)))
    plan = plan_version_range(table, start_version=1, end_version=2)
    assert (plan.first, plan.last) == (1, 2)
    assert [(v.version, v.files, v.records) for v in plan.versions] == [(1, 1, 9), (2, 1, 8)]
    assert plan.records == 17 and plan.bytes > 0
    assert plan_version_range(table, start_version=0).last == 2  # the end defaults to the latest


def test_a_time_range_selects_the_versions_committed_in_it(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    append(table, [1])
    time.sleep(0.05)
    middle = dt.datetime.now(dt.timezone.utc)
    time.sleep(0.05)  # a commit's timestamp is in whole milliseconds: one in middle's millisecond could be before it
    append(table, [2, 3])
    append(table, [4])
    plan = plan_version_range(table, start=middle, end=middle + dt.timedelta(hours=1))
    assert [v.version for v in plan.versions] == [1, 2] and plan.records == 3
    refused("start", "no version of", table, start=middle + dt.timedelta(hours=1), end=middle + dt.timedelta(hours=2))
    refused("end", "is not after start", table, start=middle, end=middle)


def test_bad_ranges_are_refused_by_name(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    append(table, [1])
    append(table, [2])
    refused("end_version", "has no version 5; its latest is 1", table, start_version=0, end_version=5)
    refused("end_version", "0 is before start_version 1", table, start_version=1, end_version=0)
    refused("start_version", "expected a table version", table, start_version=-1)
    refused("start_version", "give one", table)
    refused("start_version", "not both", table, start_version=0, start=dt.datetime.now(dt.timezone.utc))
    DeltaTable(table).alter.set_table_properties({"delta.logRetentionDuration": "interval 30 days"})
    refused("start_version", "versions 2 to 2", table, start_version=2)  # a property set adds no rows


def test_a_vacuumed_version_and_a_cleaned_up_log_are_refused_naming_the_version(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    append(table, [1, 2])
    append(table, [3])
    write_deltalake(table, pa.table({"id": pa.array([9], pa.int64())}), mode="overwrite")
    DeltaTable(table).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    refused("start_version", "version 0 of", table, start_version=0, end_version=1)
    refused("start_version", "was vacuumed", table, start_version=1, end_version=1)
    append(table, [10])
    DeltaTable(table).create_checkpoint()
    (tmp_path / "t" / "_delta_log" / f"{0:020d}.json").unlink()
    refused("start_version", "gone from its log (log retention); the earliest version the log holds is 1", table,
            start_version=0)
    assert plan_version_range(table, start_version=3).records == 1


def test_appends_refuse_an_update_and_changes_need_the_change_feed(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    append(table, [1, 2, 3])
    DeltaTable(table).delete("id = 2")
    refused("start_version", "version 1 of", table, start_version=0)
    refused("start_version", "did not record its changes", table, start_version=0, changes=True)
    DeltaTable(table).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    DeltaTable(table).delete("id = 3")
    plan = plan_version_range(table, start_version=2, changes=True)
    assert [(v.version, v.changes, v.records) for v in plan.versions] == [(3, True, None)]
    assert plan.records is None
