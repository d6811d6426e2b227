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
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.constants import CommitInfo
from sluice.kinds.iceberg import IcebergSink
from sluice.paths import Roots
from sluice.storage.delta import read_table
from sluice.storage.iceberg import IcebergTableFormat
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
    again = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert again.status == "succeeded", again.error
    expected_good, expected_bad = expected_events(Path(roots.landing) / "events")
    assert iceberg_rows(table) == expected_good
    assert table.batches(summary.query_id) == [0, 1, 2, 3]


def test_a_batch_replayed_after_a_kill_is_skipped_by_the_iceberg_table(tmp_path: Path) -> None:
    """Killed at ``between_commits:1``: batch 1 is in the Iceberg table, not in the dead-letter table, and Spark has
    not recorded it done. The rerun replays it: the Iceberg table holds it already and skips it."""
    catalog_path = write_catalog(tmp_path, iceberg_events())
    catalog = load_catalog(catalog_path)
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=39, malformed_rate=0.1)
    for index in range(3):
        producer.events_file(lines=40, now=NOW + dt.timedelta(minutes=index))
    summary_file = tmp_path / "summary.json"

    kill_at_then_rerun(catalog_path, roots, "between_commits:1", tmp_path / "faults", summary=summary_file)

    expected_good, expected_bad = expected_events(Path(roots.landing) / "events")
    table = iceberg_table(catalog, roots)
    assert iceberg_rows(table) == expected_good  # batch 1 once, not twice
    assert read_table(catalog.get("events").dead_letter_table_path(roots)).num_rows == expected_bad
    query_id = json.loads(summary_file.read_text())["streams"][0]["query_id"]
    assert table.batches(query_id) == [0, 1, 2]


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
