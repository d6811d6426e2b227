"""Operations on an Iceberg sink, read through the table-format seam from the snapshot summaries: the health gate's
codes (a table ahead of its checkpoint, a checkpoint the table does not know, a healthy one), the lag's and the
Streams page's view of the newest snapshot, and maintenance expiring snapshots under which the stream still runs
exactly once.

One real Spark run (three batches) makes the world; each test restores it at the same path and damages it.
"""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import Catalog, load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.constants import CommitInfo
from sluice.operations.health import Health, check_stream
from sluice.paths import Roots
from tests.helpers import expected_events, fresh_world, keep_pristine, roots_in, write_catalog
from tests.spark.test_iceberg import iceberg_events, iceberg_rows, iceberg_table

pytestmark = pytest.mark.spark

NOW = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def golden(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three batches of one stream in an Iceberg table, by a real Spark run, kept pristine beside the world."""
    from sluice_spark.runner import run_streams

    folder = tmp_path_factory.mktemp("iceberg-ops") / "world"
    folder.mkdir()
    write_catalog(folder, iceberg_events())
    producer = DemoProducer(folder / "landing", seed=61, malformed_rate=0.05)
    for index in range(3):
        producer.events_file(lines=30, now=NOW + dt.timedelta(minutes=index))
    summary = run_streams(spark, load_catalog(folder / "catalog.yaml"), ["events"], roots_in(folder))
    assert summary.streams[0].status == "succeeded" and summary.streams[0].batches == 3
    return keep_pristine(folder)


@pytest.fixture
def world(golden: Path) -> tuple[Catalog, Roots, Path]:
    return fresh_world(golden)


def checkpoint_of(world: tuple[Catalog, Roots, Path]) -> Path:
    catalog, roots, _ = world
    return Path(catalog.get("events").checkpoint_path(roots))


def snapshot_of_batch(world: tuple[Catalog, Roots, Path], batch_id: int) -> int:
    """The oracle: the snapshot whose summary carries the batch, read by pyiceberg itself."""
    catalog, roots, _ = world
    [found] = [snapshot.snapshot_id for snapshot in iceberg_table(catalog, roots).table().snapshots()
               if snapshot.summary.additional_properties.get(CommitInfo.BATCH) == str(batch_id)]
    return int(found)


def test_a_healthy_iceberg_stream_is_ok(world: tuple[Catalog, Roots, Path]) -> None:
    report = check_stream(world[0].get("events"), world[1])
    assert report.status is Health.OK and report.codes == []
    assert report.facts["last_batch_id"] == 2


def test_an_old_checkpoint_puts_the_iceberg_table_ahead(world: tuple[Catalog, Roots, Path]) -> None:
    checkpoint = checkpoint_of(world)
    for log_name in ("offsets", "commits"):
        for batch in ("2", "1"):
            (checkpoint / log_name / batch).unlink()
            (checkpoint / log_name / f".{batch}.crc").unlink(missing_ok=True)
    report = check_stream(world[0].get("events"), world[1])
    assert report.status is Health.FAIL
    [iceberg] = [finding for finding in report.findings if finding.evidence.get("table") == "Iceberg table "
                 "bronze.events"]
    assert iceberg.code.value == "SINK_AHEAD_OF_CHECKPOINT"
    assert (iceberg.evidence["txn_version"], iceberg.evidence["latest_offsets_batch"]) == (2, 0)
    assert iceberg.evidence["reset_version"] == snapshot_of_batch(world, 0)
    assert f"snapshot {snapshot_of_batch(world, 0)}" in iceberg.message


def test_a_checkpoint_unknown_to_the_iceberg_table_fails(world: tuple[Catalog, Roots, Path]) -> None:
    (checkpoint_of(world) / "metadata").write_text('{"id":"5d9b0c9e-1111-4222-8333-944455556666"}')
    report = check_stream(world[0].get("events"), world[1])
    assert report.status is Health.FAIL and report.codes == ["QUERY_ID_UNKNOWN_TO_SINK"]
    assert report.findings[0].evidence["table"] == "Iceberg table bronze.events"


def test_a_lost_checkpoint_in_front_of_an_iceberg_table_fails(world: tuple[Catalog, Roots, Path]) -> None:
    shutil.rmtree(checkpoint_of(world))
    report = check_stream(world[0].get("events"), world[1])
    assert report.status is Health.FAIL and report.codes == ["NEW", "QUERY_ID_UNKNOWN_TO_SINK"]



def test_reset_refuses_an_iceberg_sink_and_changes_nothing(world: tuple[Catalog, Roots, Path]) -> None:
    from sluice.operations.repair import RepairError, reset_to_version

    checkpoint = checkpoint_of(world)
    before = sorted(path.name for path in checkpoint.parent.iterdir())
    with pytest.raises(RepairError, match="reset rolls back Delta sinks only"):
        reset_to_version(world[0].get("events"), world[1], 0)
    assert sorted(path.name for path in checkpoint.parent.iterdir()) == before


def test_the_streams_page_and_the_lag_read_the_iceberg_snapshots(world: tuple[Catalog, Roots, Path]) -> None:
    from sluice.lag.observe import observe
    from sluice.operations.streams_view import detail

    catalog, roots, _ = world
    stream = catalog.get("events")
    page = detail(stream, roots)
    versions = [row for row in page["versions"] if row["batch_id"] is not None]
    assert [(row["batch_id"], row["snapshot_id"], row["stream"]) for row in versions] == [
        (batch, snapshot_of_batch(world, batch), "events") for batch in (2, 1, 0)]
    assert page["health"]["status"] == "OK"
    observation = observe(stream, roots)
    assert observation.last_batch_id == 2 and observation.backlog.files == 0


EIGHT_DAYS = 8 * 86400


def test_maintenance_expires_old_snapshots_and_orphans_then_the_stream_runs_exactly_once(
        spark: Any, world: tuple[Catalog, Roots, Path]) -> None:
    """Eight days on, the three batches' small files are compacted into one (a replace snapshot), and every snapshot
    is past the 7-day retention but the one that holds the checkpoint's last batch and the compaction's; a stray
    data file (a crashed write) goes, the files compacted away stay while the kept batch's snapshot references them.
    The next run appends only the new file's rows: the guard still finds the query's batch in the snapshots that are
    left."""
    import time

    from sluice.operations.maintenance import maintain_stream
    from sluice_spark.runner import run_streams

    catalog, roots, folder = world
    table = iceberg_table(catalog, roots)
    stray = Path(table.table().metadata.location.removeprefix("file://")) / "data" / "00000-0-crashed.parquet"
    stray.write_bytes(b"PAR1")
    [report] = [r for r in maintain_stream(catalog.get("events"), catalog, roots, run_id="m1",
                                           now=time.time() + EIGHT_DAYS) if r.role == "sink"]
    assert (report.compacted_files_removed, report.compacted_files_added) == (3, 1)
    assert (report.snapshots_expired, report.vacuumed_files, report.files_after) == (2, 1, 1) and not stray.exists()
    assert [(s.summary.operation.value, s.summary.additional_properties.get(CommitInfo.BATCH))
            for s in table.table().snapshots()] == [("append", "2"), ("replace", None)]
    assert iceberg_rows(table) == expected_events(folder / "landing" / "events")[0]

    DemoProducer(folder / "landing", seed=62, malformed_rate=0.05).events_file(lines=20, now=NOW.replace(hour=9))
    summary = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert summary.status == "succeeded", summary.error
    assert iceberg_rows(table) == expected_events(folder / "landing" / "events")[0]
    assert table.batches(summary.query_id) == [2, 3]


def test_maintenance_keeps_the_snapshot_of_the_checkpoint_s_last_batch(world: tuple[Catalog, Roots, Path]) -> None:
    """The checkpoint recorded batch 1 only (batch 2 replays after a crash): batch 1's snapshot stays, so the guard
    can still tell what the table holds; under the retention nothing is expired at all."""
    import time

    from sluice.operations.maintenance import MaintenanceError, maintain_stream

    catalog, roots, _ = world
    checkpoint = checkpoint_of(world)
    (checkpoint / "commits" / "2").unlink()
    stream = catalog.get("events")
    [aged] = [r for r in maintain_stream(stream, catalog, roots, run_id="m2", dry_run=True,
                                         now=time.time() + EIGHT_DAYS) if r.role == "sink"]
    assert aged.snapshots_expired == 1
    [today] = [r for r in maintain_stream(stream, catalog, roots, run_id="m3") if r.role == "sink"]
    assert (today.snapshots_expired, today.version_after) == (0, 4)  # the three batches and the compaction
    with pytest.raises(MaintenanceError, match="vacuum_retention_hours"):
        maintain_stream(stream, catalog, roots, run_id="m4", vacuum_retention_hours=1)
