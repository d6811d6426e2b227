"""The Iceberg sink on the pip-only engine (pyiceberg), against the oracle of the events files.

A run's good rows land in the Iceberg table, read back by pyiceberg (not by the writer under test), one snapshot per
batch carrying its query id and batch id; its dead letters in the Delta dead-letter table. A run killed after a
batch's Iceberg commit and before its dead-letter commit replays that batch: the Iceberg table skips it, the
dead-letter table takes it, and both equal the oracle. A merge keeps the newest row per key across runs.

Spark's own Iceberg runtime does not load on Spark 4.2 (see docs/guides/iceberg.md), so there is no JVM engine to
test against, nor interop with it, yet.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.constants import CommitInfo
from sluice.kinds.iceberg import IcebergSink
from sluice.paths import Roots
from sluice.storage import runlog
from sluice.storage.delta import read_table
from sluice.storage.iceberg import IcebergTableFormat, remove_orphan_files
from sluice_spark.runner import run_streams
from tests.helpers import events_stream, expected_events, roots_in, write_catalog
from tests.spark.test_crash_recovery import kill_at_then_rerun

pytestmark = pytest.mark.spark

NOW = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)
COLUMNS = ["event_id", "event_type", "user_id", "amount", "event_date"]


def iceberg_events(**sink: Any) -> dict[str, Any]:
    return events_stream(sink={"format": "iceberg", "table": "bronze.events", "engine": "rs", **sink},
                         trigger={"max_files_per_trigger": 1})


def iceberg_table(catalog: Any, roots: Roots, stream: str = "events") -> IcebergTableFormat:
    sink = catalog.get(stream).sink
    assert isinstance(sink, IcebergSink)
    return IcebergTableFormat(sink.identifier, sink.catalog_properties(roots))


def iceberg_rows(table: IcebergTableFormat) -> list[tuple[Any, ...]]:
    """The table's rows as the oracle gives them, read by pyiceberg."""
    data = table.table().scan(selected_fields=tuple(COLUMNS)).to_arrow().to_pylist()
    return sorted(((*(row[c] for c in COLUMNS[:4]), row["event_date"].isoformat()) for row in data), key=repr)


def test_append_equals_the_oracle_one_snapshot_per_batch(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, iceberg_events()))
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=38, malformed_rate=0.08)
    for index in range(3):
        producer.events_file(lines=40, now=NOW + dt.timedelta(minutes=index))

    summary = run_streams(spark, catalog, ["events"], roots).streams[0]

    assert summary.status == "succeeded", summary.error
    expected_good, expected_bad = expected_events(Path(roots.landing) / "events")
    table = iceberg_table(catalog, roots)
    assert iceberg_rows(table) == expected_good
    assert read_table(catalog.get("events").dead_letter_table_path(roots)).num_rows == expected_bad
    assert (summary.output_rows, summary.dead_letter_rows) == (len(expected_good), expected_bad)
    commits = [commit for commit in table.commits() if commit.query_id]
    assert [(c.query_id, c.batch_id, c.operation) for c in commits] == [
        (summary.query_id, batch, "append") for batch in range(3)]
    assert sum(commit.rows or 0 for commit in commits) == len(expected_good)
    summaries = [dict(s.summary.additional_properties) for s in table.table().snapshots()]
    assert all(s[CommitInfo.STREAM] == "events" and s[CommitInfo.RUN] for s in summaries)

    # New files: exactly their rows, in new snapshots of the same query.
    producer.events_file(lines=25, now=NOW + dt.timedelta(minutes=5))
    # The summary's snapshot ids: none before the first run, the table's current one after each run.
    first_snapshot = table.table().current_snapshot().snapshot_id
    assert (summary.snapshot_id_before, summary.snapshot_id_after) == (None, first_snapshot)
    assert (summary.delta_version_before, summary.delta_version_after) == (None, None)

    again = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert again.status == "succeeded", again.error
    expected_good, expected_bad = expected_events(Path(roots.landing) / "events")
    assert iceberg_rows(table) == expected_good
    assert table.batches(summary.query_id) == [0, 1, 2, 3]
    last_snapshot = table.table().current_snapshot().snapshot_id
    assert (again.snapshot_id_before, again.snapshot_id_after) == (first_snapshot, last_snapshot)
    logged = [(row["snapshot_id_before"], row["snapshot_id_after"]) for row in runlog.runs(roots.lake, "events")]
    assert logged == [(None, first_snapshot), (first_snapshot, last_snapshot)]


@pytest.mark.parametrize("fault", ["between_commits:1", "before_commit:1", "after_commit:1"])
def test_a_run_killed_at_a_crash_point_then_rerun_gives_the_exact_tables(tmp_path: Path, fault: str) -> None:
    """``between_commits:1``: batch 1 is in the Iceberg table, not in the dead-letter table, and Spark has not
    recorded it done; the rerun replays it, the Iceberg table skips it (and removes the replay's files).
    ``before_commit:1``: batch 1's data files are written by the executors, not committed: orphans, which the
    orphan removal deletes, leaving the table whole. ``after_commit:1``: both tables hold batch 1, Spark has not
    recorded it: both skip the replay."""
    catalog_path = write_catalog(tmp_path, iceberg_events())
    catalog = load_catalog(catalog_path)
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=39, malformed_rate=0.1)
    for index in range(3):
        producer.events_file(lines=40, now=NOW + dt.timedelta(minutes=index))
    summary_file = tmp_path / "summary.json"

    kill_at_then_rerun(catalog_path, roots, fault, tmp_path / "faults", summary=summary_file)

    expected_good, expected_bad = expected_events(Path(roots.landing) / "events")
    table = iceberg_table(catalog, roots)
    assert iceberg_rows(table) == expected_good  # batch 1 once, not twice
    assert read_table(catalog.get("events").dead_letter_table_path(roots)).num_rows == expected_bad
    query_id = json.loads(summary_file.read_text())["streams"][0]["query_id"]
    assert table.batches(query_id) == [0, 1, 2]
    orphans = remove_orphan_files(table, older_than=time.time() + 60)
    assert bool(orphans) == (fault == "before_commit:1")
    assert iceberg_rows(table) == expected_good


def test_merge_keeps_the_newest_row_per_key(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, events_stream(
        sink={"format": "iceberg", "table": "silver.users", "engine": "rs", "mode": "merge", "keys": ["user_id"],
              "sequence_by": "event_time"},
        source={**events_stream()["source"], "schema_evolution": "none"},
        transform={"sql": "SELECT user_id, event_id, event_time FROM source"})))
    roots = roots_in(tmp_path)
    folder = Path(roots.landing) / "events"
    folder.mkdir(parents=True)

    def event(event_id: str, user: str, minute: int) -> str:
        return json.dumps({"event_id": event_id, "event_type": "click", "user_id": user,
                           "event_time": f"2026-11-22T10:{minute:02d}:00Z"})

    (folder / "a.json").write_text("\n".join([event("e1", "u1", 1), event("e2", "u1", 5), event("e3", "u2", 2)]))
    first = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert first.status == "succeeded", first.error
    (folder / "b.json").write_text("\n".join([event("e4", "u1", 3), event("e5", "u2", 9), event("e6", "u3", 1)]))
    second = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert second.status == "succeeded", second.error

    table = iceberg_table(catalog, roots)
    rows = sorted((row["user_id"], row["event_id"]) for row in table.table().scan().to_arrow().to_pylist())
    # u1's e4 (10:03) arrives after e2 (10:05): older than the row the table holds, it changes nothing.
    assert rows == [("u1", "e2"), ("u2", "e5"), ("u3", "e6")]
    assert table.batches(first.query_id) == [0, 1]


def test_a_merge_into_a_day_partitioned_table_takes_late_updates_into_older_days(spark: Any, tmp_path: Path) -> None:
    """``partition_by: [day(event_time)]`` under merge, against the oracle of the newest event per user: a late
    update of u1 lands in its older day, u2's older event changes nothing, u4 arrives in a day before all others;
    each row in the partition of its own day."""
    catalog = load_catalog(write_catalog(tmp_path, events_stream(
        sink={"format": "iceberg", "table": "silver.users_by_day", "engine": "rs", "mode": "merge",
              "keys": ["user_id"], "sequence_by": "event_time", "partition_by": ["day(event_time)"]},
        source={**events_stream()["source"], "schema_evolution": "none"},
        transform={"sql": "SELECT user_id, event_id, event_time FROM source"})))
    roots = roots_in(tmp_path)
    folder = Path(roots.landing) / "events"
    folder.mkdir(parents=True)

    def event(event_id: str, user: str, day: int, minute: int) -> str:
        return json.dumps({"event_id": event_id, "event_type": "click", "user_id": user,
                           "event_time": f"2026-11-{day:02d}T10:{minute:02d}:00Z"})

    (folder / "a.json").write_text("\n".join([event("e1", "u1", 20, 1), event("e2", "u2", 21, 5),
                                              event("e3", "u3", 22, 2)]))
    first = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert first.status == "succeeded", first.error
    (folder / "b.json").write_text("\n".join([event("e4", "u1", 20, 9), event("e5", "u2", 20, 0),
                                              event("e6", "u4", 19, 0)]))
    second = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert second.status == "succeeded", second.error

    table = iceberg_table(catalog, roots)
    read = table.table().scan().to_arrow().to_pylist()
    assert sorted((row["user_id"], row["event_id"]) for row in read) == [
        ("u1", "e4"), ("u2", "e2"), ("u3", "e3"), ("u4", "e6")]
    assert table.partitioning == ["day(event_time)"] and table.batches(first.query_id) == [0, 1]
    assert {row["event_id"]: row["event_time"].day for row in read} == {"e4": 20, "e2": 21, "e3": 22, "e6": 19}
    epoch = dt.date(1970, 1, 1)
    assert {task.file.partition[0] for task in table.table().scan().plan_files()} == {
        (dt.date(2026, 11, day) - epoch).days for day in (19, 20, 21, 22)}  # u2's day-21 row kept its file


def test_complete_mode_overwrites_the_table_with_each_result(spark: Any, tmp_path: Path) -> None:
    """An aggregate in complete mode: each batch's whole result replaces the table in one overwrite snapshot."""
    catalog = load_catalog(write_catalog(tmp_path, {
        **events_stream(aggregate={"group_by": ["user_id"], "measures": {"events": "count(*)"}}),
        "sink": {"format": "iceberg", "table": "gold.per_user", "engine": "rs", "mode": "complete"}}))
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=40, malformed_rate=0.1)

    def expected() -> list[tuple[str, int]]:
        good, _ = expected_events(Path(roots.landing) / "events", rescue=False)
        counts: dict[str, int] = {}
        for row in good:
            counts[row[2]] = counts.get(row[2], 0) + 1
        return sorted(counts.items())

    for run in range(2):
        producer.events_file(lines=50, now=NOW + dt.timedelta(minutes=run))
        summary = run_streams(spark, catalog, ["events"], roots).streams[0]
        assert summary.status == "succeeded", summary.error
        table = iceberg_table(catalog, roots)
        data = table.table().scan().to_arrow().to_pylist()
        assert sorted((row["user_id"], row["events"]) for row in data) == expected()
    # pyiceberg's overwrite: a delete of the table's files, then an append, in one transaction.
    last = [commit for commit in table.commits() if commit.batch_id == table.recorded_batch(summary.query_id)]
    assert [commit.operation for commit in last] == ["delete", "append"]


def day_events(folder: Path, name: str, rows: list[tuple[str, str, str]]) -> None:
    """A landing file of events (id, user, event time), every line good."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("\n".join(json.dumps({"event_id": event_id, "event_type": "click", "user_id": user,
                                                     "event_time": at, "amount": 1.5})
                                          for event_id, user, at in rows), encoding="utf-8")


@pytest.mark.parametrize("engine", ["rs", "jvm"])
def test_a_batch_larger_than_one_task_commits_its_files_in_one_snapshot(spark: Any, tmp_path: Path,
                                                                        engine: str) -> None:
    """Three landing files in one batch: three tasks, each writing its own data file on an executor, and one append
    snapshot holding them all; beside a dead-letter table on the jvm engine (delta-spark) too."""
    catalog = load_catalog(write_catalog(tmp_path, events_stream(
        sink={"format": "iceberg", "table": "bronze.events", "engine": engine})))
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=41, malformed_rate=0.05)
    for index in range(3):
        producer.events_file(lines=60, now=NOW + dt.timedelta(minutes=index))

    summary = run_streams(spark, catalog, ["events"], roots).streams[0]

    assert summary.status == "succeeded", summary.error
    expected_good, expected_bad = expected_events(Path(roots.landing) / "events")
    table = iceberg_table(catalog, roots)
    assert iceberg_rows(table) == expected_good
    assert (summary.output_rows, summary.dead_letter_rows) == (len(expected_good), expected_bad)
    snapshots = table.table().snapshots()
    assert len(snapshots) == 1 and table.batches(summary.query_id) == [0]
    files = table.table().inspect.data_files()
    assert files.num_rows >= 2
    assert int(snapshots[0].summary["added-data-files"]) == files.num_rows
    assert sum(files.column("record_count").to_pylist()) == len(expected_good)


def test_partition_transforms_place_each_row_in_its_partition(spark: Any, tmp_path: Path) -> None:
    """``day(event_time)`` and ``bucket(4, user_id)``: every data file holds the rows of one partition, its values as
    pyiceberg's own transforms compute them; a scan of one day plans that day's files only."""
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan
    from pyiceberg.transforms import BucketTransform, DayTransform
    from pyiceberg.types import StringType, TimestamptzType

    catalog = load_catalog(write_catalog(tmp_path, events_stream(sink={
        "format": "iceberg", "table": "bronze.events", "engine": "rs",
        "partition_by": ["day(event_time)", "bucket(4, user_id)"]})))
    roots = roots_in(tmp_path)
    folder = Path(roots.landing) / "events"
    day_events(folder, "a.json", [(f"a{i}", f"u{i % 5}", f"2026-11-{20 + i % 3}T{i % 24:02d}:15:00Z")
                                  for i in range(40)])
    day_events(folder, "b.json", [(f"b{i}", f"u{i % 7}", f"2026-11-{21 + i % 2}T23:59:59Z") for i in range(30)])

    summary = run_streams(spark, catalog, ["events"], roots).streams[0]

    assert summary.status == "succeeded", summary.error
    table = iceberg_table(catalog, roots)
    assert iceberg_rows(table) == expected_events(folder)[0]
    assert table.partitioning == ["day(event_time)", "bucket(4, user_id)"]
    day, bucket = DayTransform().transform(TimestamptzType()), BucketTransform(4).transform(StringType())
    iceberg = table.table()
    tasks = list(iceberg.scan().plan_files())
    for task in tasks:
        import pyarrow.parquet as pq

        data = pq.read_table(task.file.file_path.removeprefix("file://")).to_pylist()
        assert {(day(int(row["event_time"].timestamp() * 1_000_000)), bucket(row["user_id"])) for row in data} == \
            {(task.file.partition[0], task.file.partition[1])}
    one_day = iceberg.scan(row_filter=And(GreaterThanOrEqual("event_time", "2026-11-21T00:00:00+00:00"),
                                          LessThan("event_time", "2026-11-22T00:00:00+00:00")))
    planned = list(one_day.plan_files())
    day_21 = day(int(dt.datetime(2026, 11, 21, tzinfo=dt.timezone.utc).timestamp() * 1_000_000))
    assert planned and {task.file.partition[0] for task in planned} == {day_21}
    assert len(planned) < len(tasks)
    assert sorted(row["event_id"] for row in one_day.to_arrow().to_pylist()) == sorted(
        [f"a{i}" for i in range(40) if i % 3 == 1] + [f"b{i}" for i in range(30) if i % 2 == 0])


def test_a_replace_backfill_overwrites_the_range_once_and_twice_is_the_same(spark: Any, tmp_path: Path) -> None:
    """The backfill DAG's ``replace`` on an Iceberg sink: the rows of the range (the files read, the event-time
    range) are swapped in one overwrite snapshot; the rows outside the range stay as they were (corrupted here);
    a second backfill of the same range gives the same table."""
    import os

    import pyarrow as pa

    from sluice.operations.backfill import parse_request
    from sluice_spark.backfill import run_backfill

    utc = dt.timezone.utc
    start, end = NOW + dt.timedelta(minutes=50), NOW + dt.timedelta(hours=2, minutes=10)
    catalog = load_catalog(write_catalog(tmp_path, events_stream(
        sink={"format": "iceberg", "table": "bronze.events", "engine": "rs"},
        source={**events_stream()["source"], "options": {"recursiveFileLookup": True, "pathGlobFilter": "*.json",
                                                          "maxFileAge": "1h"}},
        backfill={"event_time_column": "event_time", "max_range_days": 3})))
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=61, malformed_rate=0.05, late_rate=0.2)
    for hour in range(3):
        produced = producer.events_file(lines=30, now=NOW + dt.timedelta(hours=hour))
        stamp = (NOW + dt.timedelta(hours=hour)).timestamp()
        os.utime(produced.files[0], (stamp, stamp))
    assert run_streams(spark, catalog, ["events"], roots).ok
    table = iceberg_table(catalog, roots)
    iceberg = table.table()
    held = iceberg.scan().to_arrow()
    iceberg.overwrite(held.set_column(held.schema.get_field_index("event_type"), "event_type",
                                      pa.array(["corrupt"] * held.num_rows, pa.large_string())))
    landing = Path(roots.landing) / "events"
    times = {json.loads(line)["event_id"]: dt.datetime.fromisoformat(json.loads(line)["event_time"])
             for path in landing.rglob("*.json") for line in path.read_text().splitlines()
             if line.startswith("{") and _parses(line)}
    wanted = expected_events(landing, between=(start, end))[0]

    def in_range(row: tuple[Any, ...]) -> bool:
        return start <= times[row[0]].astimezone(utc) < end

    def request(run_id: str) -> Any:
        return parse_request({"stream": "events", "start": start.isoformat(), "end": end.isoformat(),
                              "mode": "replace"}, catalog, run_id=run_id)

    outside = [row for row in iceberg_rows(table) if not in_range(row)]
    summary = run_backfill(spark, catalog, request("first"), roots)

    assert summary.ok, summary.error
    assert summary.rows_written == len(wanted) and summary.rows_replaced == len(wanted)
    after = iceberg_rows(table)
    assert sorted(row for row in after if in_range(row)) == sorted(wanted)
    assert [row for row in after if not in_range(row)] == outside and all(row[1] == "corrupt" for row in outside)
    assert table.commits()[-1].operation == "overwrite"
    again = run_backfill(spark, catalog, request("second"), roots)
    assert again.ok, again.error
    assert iceberg_rows(table) == after


def _parses(line: str) -> bool:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and isinstance(record.get("event_id"), str) and \
        isinstance(record.get("event_time"), str)
