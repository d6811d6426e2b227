"""An Iceberg table as a streaming source (``source.type: iceberg``), on the pip-only engine, against the oracle.

Bronze is an Iceberg table written by Sluice's Iceberg sink, one append snapshot per batch; silver is a Delta
stream reading it by snapshot. Silver equals the oracle of the landing files after each run, a second run reads only
the snapshots committed since (its batches' source offsets start at the first one's end), a kill between silver's
commits then a rerun still equals the oracle, and a snapshot that is no append stops the read unless skipped.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.paths import Roots
from sluice.storage.checkpoint import CheckpointReader
from sluice.storage.delta import read_table
from sluice_spark.runner import run_streams
from tests.helpers import events_stream, expected_events, roots_in, write_catalog
from tests.spark.test_crash_recovery import kill_at_then_rerun, submit
from tests.spark.test_iceberg import iceberg_table

pytestmark = pytest.mark.spark

NOW = dt.datetime(2026, 11, 27, 8, 0, tzinfo=dt.timezone.utc)
COLUMNS = ["event_id", "event_type", "user_id", "amount", "event_date"]
SILVER_SCHEMA = {"event_id": "string not null", "event_type": "string not null", "user_id": "string not null",
                 "amount": "decimal(12,2)", "event_date": "date"}


def streams(**silver_source: Any) -> list[dict[str, Any]]:
    """Bronze (files -> Iceberg, one file per batch) and silver (Iceberg -> Delta, one snapshot per batch)."""
    bronze = events_stream(sink={"format": "iceberg", "table": "bronze.events", "engine": "rs"},
                           trigger={"max_files_per_trigger": 1})
    silver = {"name": "silver", "transform": "identity", "checkpoint": "silver/events", "schedule": "*/5 * * * *",
              "source": {"type": "iceberg", "table": "bronze.events", "schema": SILVER_SCHEMA,
                         "schema_evolution": "none", **silver_source},
              "sink": {"path": "silver/events", "engine": "rs"}, "trigger": {"max_files_per_trigger": 1}}
    return [bronze, silver]


def silver_rows(roots: Roots) -> list[tuple[Any, ...]]:
    rows = read_table(f"{roots.lake}/silver/events").select(COLUMNS).to_pylist()
    return sorted(((*(row[c] for c in COLUMNS[:4]), row["event_date"].isoformat()) for row in rows), key=repr)


def test_silver_reads_the_iceberg_bronze_by_snapshot_twice(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, *streams()))
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=41, malformed_rate=0.08)
    for index in range(3):
        producer.events_file(lines=30, now=NOW + dt.timedelta(minutes=index))
    bronze = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert bronze.status == "succeeded", bronze.error

    first = run_streams(spark, catalog, ["silver"], roots).streams[0]

    assert first.status == "succeeded", first.error
    expected_good, _ = expected_events(Path(roots.landing) / "events")
    assert silver_rows(roots) == expected_good
    read_first = len(expected_good)
    snapshots = [commit.snapshot_id for commit in iceberg_table(catalog, roots).commits()]
    checkpoint = CheckpointReader(catalog.get("silver").checkpoint_path(roots))
    assert checkpoint.committed_source_offset()["snapshot"] == snapshots[-1]
    assert len(checkpoint.commit_ids()) == 3  # one snapshot per batch

    # New files, new bronze snapshots: the second silver run reads those alone.
    producer.events_file(lines=20, now=NOW + dt.timedelta(minutes=5))
    assert run_streams(spark, catalog, ["events"], roots).streams[0].status == "succeeded"
    second = run_streams(spark, catalog, ["silver"], roots).streams[0]
    assert second.status == "succeeded", second.error
    expected_good, _ = expected_events(Path(roots.landing) / "events")
    assert silver_rows(roots) == expected_good
    new_batch = checkpoint.read_offsets(checkpoint.commit_ids()[-1]).sources[0]
    assert len(checkpoint.commit_ids()) == 4 and new_batch["snapshot"] != snapshots[-1]
    assert second.input_rows == len(expected_good) - read_first


def test_a_kill_between_silver_commits_then_a_rerun_equals_the_oracle(tmp_path: Path) -> None:
    catalog_path = write_catalog(tmp_path, *streams())
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=42, malformed_rate=0.1)
    for index in range(3):
        producer.events_file(lines=30, now=NOW + dt.timedelta(minutes=index))
    bronze = submit(catalog_path, roots, stream="events")
    output, _ = bronze.communicate(timeout=300)
    assert bronze.returncode == 0, output[-3000:]

    kill_at_then_rerun(catalog_path, roots, "between_commits:1", tmp_path / "faults", stream="silver")

    expected_good, _ = expected_events(Path(roots.landing) / "events")
    assert silver_rows(roots) == expected_good  # batch 1 once, not twice


def test_a_snapshot_that_is_no_append_stops_the_read_unless_skipped(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, *streams()))
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=43, malformed_rate=0.0)
    producer.events_file(lines=10, now=NOW)
    assert run_streams(spark, catalog, ["events"], roots).streams[0].status == "succeeded"
    table = iceberg_table(catalog, roots).table()
    forgotten = table.scan(selected_fields=("event_id",), limit=1).to_arrow().column("event_id")[0].as_py()
    table.delete(f"event_id = '{forgotten}'")  # a privacy request's delete: an overwrite snapshot
    removed = table.refresh().current_snapshot()
    assert removed.summary.operation.value in ("overwrite", "delete")
    producer.events_file(lines=10, now=NOW + dt.timedelta(minutes=1))
    assert run_streams(spark, catalog, ["events"], roots).streams[0].status == "succeeded"

    refused = run_streams(spark, catalog, ["silver"], roots).streams[0]

    assert refused.status == "failed"
    operation = removed.summary.operation.value
    assert (f"Iceberg table bronze.events: snapshot {removed.snapshot_id} is an {operation}, which removes or "
            "rewrites rows") in (refused.error or "")

    skipping = load_catalog(write_catalog(tmp_path, *streams(options={
        "streaming-skip-overwrite-snapshots": True, "streaming-skip-delete-snapshots": True})))
    skipped = run_streams(spark, skipping, ["silver"], roots).streams[0]
    assert skipped.status == "succeeded", skipped.error
    expected_good, _ = expected_events(Path(roots.landing) / "events")
    # Every append read, the delete not applied: silver keeps the rows bronze deleted.
    assert silver_rows(roots) == expected_good


def test_a_compaction_of_bronze_is_passed_over_and_silver_stays_equal_to_the_oracle(spark: Any,
                                                                                    tmp_path: Path) -> None:
    """Bronze's small files compacted (a replace snapshot) while silver has read some of bronze's appends and not
    the newest: silver's next runs read that append once and nothing of the compaction, and equal the oracle."""
    from sluice.operations.maintenance import maintain_stream

    catalog = load_catalog(write_catalog(tmp_path, *streams()))
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=44, malformed_rate=0.05)
    for index in range(3):
        producer.events_file(lines=20, now=NOW + dt.timedelta(minutes=index))
    assert run_streams(spark, catalog, ["events"], roots).streams[0].status == "succeeded"
    assert run_streams(spark, catalog, ["silver"], roots).streams[0].status == "succeeded"
    producer.events_file(lines=20, now=NOW + dt.timedelta(minutes=3))
    assert run_streams(spark, catalog, ["events"], roots).streams[0].status == "succeeded"
    table = iceberg_table(catalog, roots)
    before = sorted(table.table().scan().to_arrow().to_pylist(), key=repr)

    [report] = [r for r in maintain_stream(catalog.get("events"), catalog, roots, run_id="m1") if r.role == "sink"]

    assert (report.compacted_files_removed, report.compacted_files_added, report.files_after) == (4, 1, 1)
    assert sorted(table.table().scan().to_arrow().to_pylist(), key=repr) == before
    assert table.commits()[-1].operation == "replace"
    after = run_streams(spark, catalog, ["silver"], roots).streams[0]
    assert after.status == "succeeded", after.error
    expected_good, _ = expected_events(Path(roots.landing) / "events")
    assert silver_rows(roots) == expected_good
    producer.events_file(lines=20, now=NOW + dt.timedelta(minutes=4))
    assert run_streams(spark, catalog, ["events"], roots).streams[0].status == "succeeded"
    again = run_streams(spark, catalog, ["silver"], roots).streams[0]
    assert again.status == "succeeded", again.error
    expected_good, _ = expected_events(Path(roots.landing) / "events")
    assert silver_rows(roots) == expected_good
    checkpoint = CheckpointReader(catalog.get("silver").checkpoint_path(roots))
    assert checkpoint.committed_source_offset()["snapshot"] == table.commits()[-1].snapshot_id
