"""The ``rs`` Delta streaming source against real Delta tables written by delta-rs, read by real availableNow queries.

The oracle is the source table itself, read as a batch by delta-rs at the versions each run should have covered.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from sluice.kinds.delta import delta_backlog, delta_next_version
from sluice.storage.checkpoint import CheckpointReader

pytestmark = pytest.mark.spark

DAY = dt.datetime(2026, 11, 22, tzinfo=dt.timezone.utc)


def append(table: Path, first: int, count: int) -> int:
    """Append ``count`` rows with ids from ``first``, partitioned by day; return the new version."""
    ids = list(range(first, first + count))
    write_deltalake(str(table), pa.table({
        "id": pa.array(ids, pa.int64()),
        "amount": pa.array([i / 4 for i in ids], pa.float64()),
        "at": pa.array([DAY + dt.timedelta(hours=i) for i in ids], pa.timestamp("us", tz="UTC")),
        "day": [(DAY + dt.timedelta(hours=i)).date().isoformat() for i in ids],
    }), mode="append", partition_by=["day"])
    return DeltaTable(str(table)).version()


def ids_at(table: Path, versions: range) -> list[int]:
    """The ids the given versions added, from delta-rs snapshots (files of version v minus files of v - 1)."""
    before = set() if versions.start == 0 else set(
        DeltaTable(str(table), version=versions.start - 1).to_pyarrow_table().column("id").to_pylist())
    after = DeltaTable(str(table), version=versions.stop - 1).to_pyarrow_table().column("id").to_pylist()
    return sorted(set(after) - before)


def run(spark: Any, table: Path, checkpoint: Path, *, on_batch: Callable[[int], None] | None = None,
        **options: str) -> list[tuple[int, list[Any]]]:
    """One availableNow run; returns each micro-batch's id and rows."""
    batches: list[tuple[int, list[Any]]] = []

    def collect(frame: Any, batch_id: int) -> None:
        batches.append((batch_id, sorted(frame.collect())))
        if on_batch is not None:
            on_batch(batch_id)

    reader = spark.readStream.format("sluice_delta")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load(str(table)).writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    return batches


def ids(batches: list[tuple[int, list[Any]]]) -> list[int]:
    return sorted(row.id for _, rows in batches for row in rows)


def test_each_run_reads_exactly_the_new_versions_once(spark: Any, tmp_path: Path) -> None:
    table, checkpoint = tmp_path / "silver", tmp_path / "ckpt"
    append(table, 0, 10)
    append(table, 10, 5)
    first = run(spark, table, checkpoint)
    assert ids(first) == ids_at(table, range(0, 2))
    row = next(r for _, rows in first for r in rows if r.id == 13)
    assert (row.amount, row.at, row.day) == (3.25, dt.datetime(2026, 11, 22, 13, 0), "2026-11-22")

    append(table, 15, 7)
    append(table, 22, 30)  # spans a second day partition
    second = run(spark, table, checkpoint)
    assert ids(second) == ids_at(table, range(2, 4))
    assert run(spark, table, checkpoint) == [], "nothing new: no batch"

    # The checkpoint's offset is the last version read, and the lag reads it as such.
    offset = CheckpointReader(checkpoint).committed_source_offset()
    assert offset == {"version": 3}
    append(table, 52, 3)
    backlog = delta_backlog(str(table), delta_next_version(offset))
    assert (backlog.versions, backlog.records) == (1, 3)


def test_rate_limit_reads_whole_versions_and_at_least_one(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "silver"
    for version in range(4):
        append(table, version * 10, 10)  # one file per version: ids of one day
    batches = run(spark, table, tmp_path / "ckpt", maxFilesPerTrigger="1")
    assert [len(rows) for _, rows in batches] == [10, 10, 10, 10]
    assert ids(batches) == list(range(40))


def test_starting_version_latest_and_timestamp(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "silver"
    for version in range(3):
        append(table, version * 10, 10)
    assert ids(run(spark, table, tmp_path / "v2", startingVersion="2")) == ids_at(table, range(2, 3))

    assert ids(run(spark, table, tmp_path / "latest", startingVersion="latest")) == []
    append(table, 30, 5)
    assert ids(run(spark, table, tmp_path / "latest", startingVersion="latest")) == list(range(30, 35))

    history = {commit["version"]: commit["timestamp"] for commit in DeltaTable(str(table)).history()}
    moment = dt.datetime.fromtimestamp(history[1] / 1000, dt.timezone.utc).isoformat()
    assert ids(run(spark, table, tmp_path / "ts", startingTimestamp=moment)) == ids_at(table, range(1, 4))


def test_available_now_stops_at_the_versions_committed_before_it_started(spark: Any, tmp_path: Path) -> None:
    table, checkpoint = tmp_path / "silver", tmp_path / "ckpt"
    append(table, 0, 10)
    append(table, 10, 10)
    # A writer commits while the run is in its first batch: the run must not read it, the next run must.
    first = run(spark, table, checkpoint, maxFilesPerTrigger="1", on_batch=lambda batch: batch == 0 and append(
        table, 100, 5))
    assert ids(first) == list(range(20))
    assert ids(run(spark, table, checkpoint)) == list(range(100, 105))


def test_a_version_that_removes_data_fails_unless_skipped(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "silver"
    append(table, 0, 10)
    DeltaTable(str(table)).delete("id < 3")
    append(table, 10, 2)
    with pytest.raises(Exception, match="version 1 removes or rewrites data") as failure:
        run(spark, table, tmp_path / "strict")
    assert "skipChangeCommits" in str(failure.value)
    assert ids(run(spark, table, tmp_path / "skip", skipChangeCommits="true")) == list(range(12))
    assert json.loads((tmp_path / "skip" / "offsets" / "0").read_text().splitlines()[2]) == {"version": 2}


def test_a_run_reads_additive_schema_changes_and_stops_at_any_other(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "silver"
    append(table, 0, 4)
    gained = pa.table({"id": pa.array([4], pa.int64()), "day": ["2026-11-23"], "note": ["new"]})
    write_deltalake(str(table), gained, mode="append", schema_mode="merge", partition_by=["day"])
    rows = [row for _, batch in run(spark, table, tmp_path / "additive") for row in batch]
    assert sorted((row.id, row.note) for row in rows) == [(0, None), (1, None), (2, None), (3, None), (4, "new")]

    # Retyped: the run reads with the latest schema, which version 0's files do not fit.
    write_deltalake(str(table), pa.table({"id": pa.array(["x"]), "day": ["2026-11-24"]}), mode="overwrite",
                    schema_mode="overwrite", partition_by=["day"])
    with pytest.raises(Exception, match="version 0 has the column 'id' as bigint") as failure:
        run(spark, table, tmp_path / "retyped")
    assert "additive schema changes only" in str(failure.value)
