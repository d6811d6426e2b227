"""Operations on an Iceberg table without Spark: the compaction of its small files (one ``replace`` snapshot, the
rows and their values unchanged, a crash before its commit changing nothing), snapshot expiry held back by the
streams that read the table, and the Streams page's snapshot ids.

The oracle is the table's rows as pyiceberg reads them before the maintenance, compared whole (every column's value).
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sluice.constants import CommitInfo
from sluice.errors import SluiceError
from sluice.storage.iceberg import IcebergTableFormat, default_catalog_properties, remove_orphan_files
from sluice.storage.iceberg_compaction import commit_rewrite, rewrite_small_files
from sluice.storage.iceberg_snapshots import check_readable, history_after


def events(ids: range, tag: str = "live") -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "tag": [f"{tag}{i}" for i in ids],
                     "amount": pa.array([i * 1.5 for i in ids], pa.float64()),
                     "day": pa.array([dt.date(2026, 11, 20 + i % 3) for i in ids], pa.date32())})


def table_of_small_files(tmp_path: Path, spec: list[str], batches: int = 4) -> IcebergTableFormat:
    """A table of ``batches`` appends of ten rows each: one file per batch and partition."""
    table = IcebergTableFormat("db.t", default_catalog_properties(str(tmp_path / "lake")))
    table.ensure(events(range(1)).schema, spec)
    for batch in range(batches):
        table.commit_batch(events(range(batch * 10, batch * 10 + 10)), query_id="q", batch_id=batch, metadata={})
    return table


def held(table: IcebergTableFormat) -> list[dict[str, Any]]:
    return sorted(table.table().scan().to_arrow().to_pylist(), key=lambda row: row["id"])


def data_files(table: IcebergTableFormat) -> list[dict[str, Any]]:
    return table.table().inspect.data_files().select(["file_path", "partition", "record_count"]).to_pylist()


@pytest.mark.parametrize("spec", [[], ["day(day)"]], ids=["unpartitioned", "partitioned"])
def test_compaction_rewrites_each_partition_s_small_files_in_one_replace_snapshot(tmp_path: Path,
                                                                                  spec: list[str]) -> None:
    table = table_of_small_files(tmp_path, spec)
    before, files_before = held(table), data_files(table)
    partitions = sorted({repr(file["partition"]) for file in files_before})
    assert len(files_before) == 4 * len(partitions)

    rewrite = rewrite_small_files(table)
    snapshot = commit_rewrite(table, rewrite, {CommitInfo.MAINTENANCE: "m1"})

    assert held(table) == before  # every row, every value, once
    files_after = data_files(table)
    assert sorted(repr(file["partition"]) for file in files_after) == partitions  # one file per partition
    assert (len(rewrite.removed), len(rewrite.added), rewrite.rows) == (len(files_before), len(partitions), 40)
    current = table.table().current_snapshot()
    assert current.snapshot_id == snapshot and current.summary.operation.value == "replace"
    summary = current.summary.additional_properties
    assert (summary["total-records"], summary["total-data-files"], summary[CommitInfo.MAINTENANCE]) == (
        "40", str(len(partitions)), "m1")
    assert table.recorded_batch("q") == 3  # the exactly-once guard walks past it
    assert table.commit_batch(events(range(30, 40)), query_id="q", batch_id=3, metadata={}) is False
    # A reader passes over it: it adds no row to read, to a read limit or to a lag.
    last_batch = table.table().snapshots()[-2]
    [replace] = history_after(table.table(), {"snapshot": last_batch.snapshot_id,
                                              "sequence": last_batch.sequence_number}, identifier="db.t")
    assert (replace.operation, replace.files, replace.records) == ("replace", 0, 0)
    assert check_readable(replace, {}, identifier="db.t") is False
    # Nothing small is left to pair: a second compaction commits nothing.
    assert commit_rewrite(table, rewrite_small_files(table), {}) is None
    assert len(table.table().snapshots()) == 5


def test_compaction_leaves_files_at_the_target_size_and_a_lone_small_file_alone(tmp_path: Path) -> None:
    table = table_of_small_files(tmp_path, [], batches=3)
    sizes = sorted(file["file_size_in_bytes"] for file in table.table().inspect.data_files().to_pylist())
    # A target under every file: nothing is small.
    assert rewrite_small_files(table, target_bytes=sizes[0]).removed == []
    # A target that takes two files and not three: one pair, and the third file stays as it is.
    rewrite = rewrite_small_files(table, target_bytes=sizes[0] + sizes[1] + 1)
    assert len(rewrite.removed) == 2
    assert rewrite_small_files(table, dry_run=True).added == [] and len(table.table().snapshots()) == 3


def test_a_compaction_refuses_a_table_that_moved_on_and_keeps_it_as_it_is(tmp_path: Path) -> None:
    table = table_of_small_files(tmp_path, [])
    rewrite = rewrite_small_files(table)
    table.commit_batch(events(range(40, 45)), query_id="q", batch_id=4, metadata={})
    before = held(table)
    with pytest.raises(SluiceError, match="has a new snapshot since its compaction read it; nothing was committed"):
        commit_rewrite(table, rewrite, {})
    assert held(table) == before and len(table.table().snapshots()) == 5
    assert not any(Path(file.file_path.removeprefix("file://")).exists() for file in rewrite.added)


CRASH = """
import os, signal, sys
from sluice.storage.iceberg import IcebergTableFormat, default_catalog_properties
from sluice.storage.iceberg_compaction import rewrite_small_files
rewrite = rewrite_small_files(IcebergTableFormat("db.t", default_catalog_properties(sys.argv[1])))
print(len(rewrite.added), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # after the new files are written, before the commit
"""


def test_a_compaction_killed_before_its_commit_leaves_the_table_as_it_was(tmp_path: Path) -> None:
    table = table_of_small_files(tmp_path, ["day(day)"])
    before, snapshots = held(table), [s.snapshot_id for s in table.table().snapshots()]

    crashed = subprocess.run([sys.executable, "-c", CRASH, str(tmp_path / "lake")], capture_output=True, text=True,
                             env={**os.environ}, timeout=120)

    assert crashed.returncode == -signal.SIGKILL and crashed.stdout.strip() == "3", crashed.stderr
    assert held(table) == before and [s.snapshot_id for s in table.table().snapshots()] == snapshots
    # Its files are orphans, removed once older than the retention; then a compaction runs as if none had crashed.
    import time

    assert len(remove_orphan_files(table, older_than=time.time() + 10)) == 3
    assert commit_rewrite(table, rewrite_small_files(table), {}) is not None and held(table) == before


# --- expiry guarded by the streams that read the table ---------------------------------------------------------------

EIGHT_DAYS = 8 * 86400


def bronze_and_silver(tmp_path: Path) -> tuple[Any, Any, IcebergTableFormat, list[int]]:
    """A bronze stream's Iceberg table of four batches, and a silver stream that reads it as its source."""
    from sluice.catalog import load_catalog
    from sluice.kinds.iceberg import IcebergSink
    from tests.helpers import events_stream, roots_in, write_catalog

    bronze = events_stream(sink={"format": "iceberg", "table": "bronze.events", "engine": "rs"})
    silver = {"name": "silver", "transform": "identity", "checkpoint": "silver/events", "schedule": "*/5 * * * *",
              "source": {"type": "iceberg", "table": "bronze.events", "schema": {"id": "bigint not null"}},
              "sink": {"path": "silver/events"}}
    catalog = load_catalog(write_catalog(tmp_path, bronze, silver))
    roots = roots_in(tmp_path)
    sink = catalog.get("events").sink
    assert isinstance(sink, IcebergSink)
    table = IcebergTableFormat(sink.identifier, sink.catalog_properties(roots))
    table.ensure(events(range(1)).schema)
    for batch in range(4):
        table.commit_batch(events(range(batch * 10, batch * 10 + 10)), query_id="q", batch_id=batch, metadata={})
    return catalog, roots, table, [snapshot.snapshot_id for snapshot in table.table().snapshots()]


def silver_read_up_to(catalog: Any, roots: Any, committed: int, planned: int | None = None) -> None:
    """Silver's checkpoint as Spark writes it: batch 0 read the table up to snapshot ``committed``; a batch 1 up to
    ``planned`` was planned, not committed."""
    import json

    from tests.unit.test_lag import spark_checkpoint

    def offset(snapshot: int) -> str:
        return json.dumps({"snapshot": snapshot, "sequence": 0})

    spark_checkpoint(Path(catalog.get("silver").checkpoint_path(roots)),
                     {0: offset(committed), **({1: offset(planned)} if planned is not None else {})}, committed=[0])


def test_expiry_keeps_every_snapshot_from_the_one_a_reader_has_read_up_to(tmp_path: Path) -> None:
    """Eight days on, every snapshot is past the retention: the ones before silver's committed offset go, the
    one it read up to and every later one stay (its planned, uncommitted batch is read again), and silver's next
    read finds its place and the appends after it."""
    import time

    from sluice.operations.maintenance import IcebergReader, iceberg_readers_of, maintain_iceberg_table

    catalog, roots, table, snapshots = bronze_and_silver(tmp_path)
    silver_read_up_to(catalog, roots, committed=snapshots[1], planned=snapshots[3])
    readers = iceberg_readers_of(catalog.get("events").sink, catalog, roots)
    assert readers == [IcebergReader("silver", snapshots[1])]

    report = maintain_iceberg_table(table, "sink", checkpoint=catalog.get("events").checkpoint_path(roots),
                                    now=time.time() + EIGHT_DAYS, readers=readers)

    kept = [snapshot.snapshot_id for snapshot in table.table().snapshots()]
    assert report.snapshots_expired == 1 and kept[:3] == snapshots[1:]
    assert any(note.startswith("expiry: silver still has snapshots to read") for note in report.skipped)
    unread = history_after(table.table(), {"snapshot": snapshots[1], "sequence": 0}, identifier="bronze.events")
    assert [snapshot.snapshot_id for snapshot in unread if check_readable(snapshot, {}, identifier="db")] == \
        snapshots[2:]
    # Without the reader, the same maintenance would have expired all four batches' snapshots but the current.
    assert report.version_after == 4


def test_a_reader_that_has_read_nothing_keeps_every_snapshot_and_one_caught_up_keeps_none(tmp_path: Path) -> None:
    import time

    from sluice.operations.maintenance import iceberg_readers_of, maintain_iceberg_table

    catalog, roots, table, _ = bronze_and_silver(tmp_path)
    checkpoint = catalog.get("events").checkpoint_path(roots)
    later = time.time() + EIGHT_DAYS
    readers = iceberg_readers_of(catalog.get("events").sink, catalog, roots)
    assert [reader.snapshot_id for reader in readers] == [-1]  # no checkpoint yet: it reads the whole history
    report = maintain_iceberg_table(table, "sink", checkpoint=checkpoint, now=later, readers=readers)
    assert report.snapshots_expired == 0 and len(table.table().snapshots()) == 5  # the four and the compaction's

    current = table.table().current_snapshot().snapshot_id
    silver_read_up_to(catalog, roots, committed=current)
    readers = iceberg_readers_of(catalog.get("events").sink, catalog, roots)
    report = maintain_iceberg_table(table, "sink", checkpoint=checkpoint, now=later, readers=readers)
    assert report.snapshots_expired == 4 and not report.skipped
    assert [snapshot.snapshot_id for snapshot in table.table().snapshots()] == [current]
    assert held(table) == sorted(events(range(40)).to_pylist(), key=lambda row: row["id"])


def test_the_streams_page_shows_each_snapshot_id_as_text(tmp_path: Path) -> None:
    """An Iceberg snapshot id is past JavaScript's exact integers (2**53): the page gets it as text too."""
    from sluice.operations.streams_view import _versions

    catalog, roots, _, snapshots = bronze_and_silver(tmp_path)
    versions = _versions(catalog.get("events"), roots)
    assert [row["snapshot"] for row in versions] == [str(snapshot) for snapshot in reversed(snapshots)]
    assert [row["snapshot_id"] for row in versions] == list(reversed(snapshots))
