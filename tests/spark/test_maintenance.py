"""Delta maintenance on tables that real runs wrote: bronze written by five runs of the runner (rs engine), silver
reading it by version.

The oracles: bronze's rows computed from the landed files with the json module (``expected_events``), and the
silver table read by delta-rs before and after.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.lag.observe import check
from sluice.operations.health import Health, check_stream
from sluice.operations.maintenance import MaintenanceError, maintain, maintain_table, readers_of
from sluice.storage import runlog
from sluice.storage.lock import LockHeld, StreamLock
from sluice_spark.runner import run_streams
from tests.helpers import events_stream, expected_events, roots_in, table_rows, write_catalog
from tests.spark.test_silver import SILVER

pytestmark = pytest.mark.spark

NOW = dt.datetime(2026, 11, 23, 9, 0, tzinfo=dt.timezone.utc)
BRONZE = ["event_id", "event_type", "user_id", "amount", "event_date"]


def bronze_rows(path: str) -> list[tuple[Any, ...]]:
    return [(*row[:4], row[4].isoformat()) for row in table_rows(path, BRONZE)]


def commit_actions(table: str, version: int) -> list[dict[str, Any]]:
    text = (Path(table) / "_delta_log" / f"{version:020d}.json").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_compaction_keeps_the_rows_and_gives_readers_nothing_new(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, events_stream(), SILVER))
    roots = roots_in(tmp_path)
    bronze, silver = str(tmp_path / "lake" / "bronze" / "events"), str(tmp_path / "lake" / "silver" / "events")
    producer = DemoProducer(tmp_path / "landing", seed=23, malformed_rate=0.1)
    for minute in range(5):  # five scheduled runs of one small file each
        producer.events_file(lines=30, now=NOW + dt.timedelta(minutes=minute))
        run_streams(spark, catalog, ["events"], roots)
    run_streams(spark, catalog, ["events_silver"], roots)
    silver_before = table_rows(silver, ["event_id", "event_date"])
    bronze_version, files_before = DeltaTable(bronze).version(), len(DeltaTable(bronze).file_uris())
    assert files_before >= 5

    # A running stream holds its lock: maintenance waits for it, and gives up after its wait with LockHeld.
    held = StreamLock(catalog.get("events").checkpoint_path(roots), "events", "a-running-stream")
    with held, pytest.raises(LockHeld):
        from sluice.operations.maintenance import maintain_stream

        maintain_stream(catalog.get("events"), catalog, roots, run_id="waits", lock_wait_seconds=0.2)
    assert DeltaTable(bronze).version() == bronze_version, "nothing was done without the lock"

    report = maintain(catalog, roots, run_id="nightly")
    sink = next(table for table in report["events"] if table["role"] == "sink")
    assert sink["files_before"] == files_before and sink["files_after"] < files_before
    assert sink["compacted_files_removed"] > sink["compacted_files_added"] > 0
    assert sink["checkpoint_version"] == bronze_version + 1 and sink["skipped"] == []
    assert (Path(bronze) / "_delta_log" / "_last_checkpoint").exists()

    # The rows are those of the landed files, and the compaction's commit says it changed no data.
    assert bronze_rows(bronze) == expected_events(tmp_path / "landing" / "events")[0]
    actions = commit_actions(bronze, bronze_version + 1)
    assert actions[0]["commitInfo"]["operation"] == "OPTIMIZE"
    assert actions[0]["commitInfo"]["sluice.maintenance.runId"] == "nightly"
    changes = [action.get("add") or action.get("remove") for action in actions if "add" in action or "remove" in action]
    assert changes and all(change["dataChange"] is False for change in changes)

    # Silver reads bronze by version: the compaction's version holds nothing new for it, and does not age its lag.
    waiting = check(catalog.get("events_silver"), roots).observation.backlog
    assert (waiting.versions, waiting.records, waiting.oldest_unread_at) == (1, 0, None)
    summary = run_streams(spark, catalog, ["events_silver"], roots).streams[0]
    assert (summary.input_rows, summary.output_rows) == (0, 0)
    assert table_rows(silver, ["event_id", "event_date"]) == silver_before

    # The next runs go on exactly once after maintenance: a new file, bronze and silver take it once.
    producer.events_file(lines=30, now=NOW + dt.timedelta(minutes=10))
    run_streams(spark, catalog, ["events"], roots)
    run_streams(spark, catalog, ["events"], roots)
    assert bronze_rows(bronze) == expected_events(tmp_path / "landing" / "events")[0]
    run_streams(spark, catalog, ["events_silver"], roots)
    assert table_rows(silver, ["event_id", "event_date"]) == table_rows(bronze, ["event_id", "event_date"])
    for name in ("events", "events_silver"):
        assert check_stream(catalog.get(name), roots).status is Health.OK, name

    # The run log holds a maintenance row per stream, and the refusal for the lock; it was maintained too.
    rows = {(row["stream"], row["run_id"]): row for row in runlog.runs(roots.lake) if row["kind"] == "maintenance"}
    assert sorted(rows) == [("events", "nightly"), ("events", "waits"), ("events_silver", "nightly")]
    assert rows[("events", "waits")]["status"] == "failed" and "is locked by run" in rows[("events", "waits")]["error"]
    assert rows[("events", "nightly")]["status"] == rows[("events_silver", "nightly")]["status"] == "succeeded"
    assert [table["role"] for table in report["_sluice"]] == ["run_log", "run_log"]


def test_vacuum_refuses_a_retention_under_the_tables_own(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, events_stream()))
    roots = roots_in(tmp_path)
    DemoProducer(tmp_path / "landing", seed=5).events_file(lines=20, now=NOW)
    run_streams(spark, catalog, ["events"], roots)
    bronze = str(tmp_path / "lake" / "bronze" / "events")
    version = DeltaTable(bronze).version()
    with pytest.raises(MaintenanceError, match=r"vacuum_retention_hours: 24 hours is under the retention of .* "
                                               r"\(delta.deletedFileRetentionDuration: 168 hours\)"):
        maintain(catalog, roots, ["events"], vacuum_retention_hours=24)
    assert DeltaTable(bronze).version() == version, "nothing was changed"
    # More than the table's own is allowed, and a dry run changes nothing.
    report = maintain(catalog, roots, ["events"], vacuum_retention_hours=200, dry_run=True)
    assert report["events"][0]["vacuum_retention_hours"] == 200
    assert DeltaTable(bronze).version() == version


def test_vacuum_waits_for_a_reader_behind_the_retention(spark: Any, tmp_path: Path) -> None:
    """With a retention of 0 hours, bronze's files removed by a compaction are vacuumed at once, unless silver has
    not read the versions that added them: then the vacuum is skipped and says why."""
    catalog = load_catalog(write_catalog(tmp_path, events_stream(), SILVER))
    roots = roots_in(tmp_path)
    producer = DemoProducer(tmp_path / "landing", seed=31, malformed_rate=0.0)
    for minute in range(2):
        producer.events_file(lines=20, now=NOW + dt.timedelta(minutes=minute))
        run_streams(spark, catalog, ["events"], roots)
    bronze = str(tmp_path / "lake" / "bronze" / "events")
    DeltaTable(bronze).alter.set_table_properties({"delta.deletedFileRetentionDuration": "interval 0 hours"})
    assert [reader.stream for reader in readers_of(bronze, catalog, roots)] == ["events_silver"]

    DeltaTable(bronze).optimize.compact()
    # A write that crashed before its commit leaves a file no version references.
    orphan = next(Path(bronze).rglob("*.parquet")).with_name("part-crashed-writer.parquet")
    orphan.write_bytes(b"PAR1")
    report = maintain_table(bronze, "sink", readers=readers_of(bronze, catalog, roots))
    assert report.vacuumed_files == 0
    assert report.skipped[0].startswith("vacuum: events_silver still has versions to read older than the retention")

    run_streams(spark, catalog, ["events_silver"], roots)  # silver catches up: nothing it needs is old any more
    rows = table_rows(bronze, ["event_id"])
    report = maintain_table(bronze, "sink", readers=readers_of(bronze, catalog, roots))
    assert report.vacuumed_files > 1 and not any(note.startswith("vacuum") for note in report.skipped)
    assert not orphan.exists()
    assert table_rows(bronze, ["event_id"]) == rows
    assert table_rows(str(tmp_path / "lake" / "silver" / "events"), ["event_id"]) == rows
