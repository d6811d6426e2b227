"""Checkpoint health checks against checkpoints that real Spark runs produced, then damaged on purpose.

Each fault is detected with its code; each repair followed by a run gives the exact expected table.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from sluice.catalog import Catalog, load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.operations.health import Health, check_stream
from sluice.operations.repair import RepairError, backup, quarantine_offsets, repin_query_id, reset_to_version
from sluice.paths import Roots
from sluice.storage.delta import table_history
from sluice.storage.lock import LockHeld, StreamLock, process_space
from sluice_spark.runner import run_streams
from tests.helpers import (
    events_stream,
    expected_events,
    fresh_world,
    keep_pristine,
    roots_in,
    table_rows,
    write_catalog,
)

pytestmark = pytest.mark.spark

NOW = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def golden(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three committed batches of one stream, produced by real Spark runs, kept pristine beside the world that
    each test damages. The world is restored at the same path, because the file source log records absolute
    paths: a checkpoint copied elsewhere would see every file as new."""
    folder = tmp_path_factory.mktemp("health") / "world"
    folder.mkdir()
    write_catalog(folder, events_stream(trigger={"max_files_per_trigger": 1}, alerts={"stale_after_seconds": 3600}))
    producer = DemoProducer(folder / "landing", seed=51, malformed_rate=0.05)
    for index in range(3):
        producer.events_file(lines=30, now=NOW + dt.timedelta(minutes=index))
    summary = run_streams(spark, load_catalog(folder / "catalog.yaml"), ["events"], roots_in(folder))
    assert summary.streams[0].batches == 3
    return keep_pristine(folder)


@pytest.fixture
def world(golden: Path) -> tuple[Catalog, Roots, Path]:
    return fresh_world(golden)


def report_of(world: tuple[Catalog, Roots, Path]):  # type: ignore[no-untyped-def]
    catalog, roots, _ = world
    return check_stream(catalog.get("events"), roots)


def checkpoint_of(world: tuple[Catalog, Roots, Path]) -> Path:
    catalog, roots, _ = world
    return Path(catalog.get("events").checkpoint_path(roots))


def remove(path: Path) -> None:
    """Delete a checkpoint log file and its checksum, as a lost or never-written file leaves the folder."""
    path.unlink()
    path.with_name(f".{path.name}.crc").unlink(missing_ok=True)


def bronze(world: tuple[Catalog, Roots, Path]) -> list[tuple[Any, ...]]:
    catalog, roots, _ = world
    return table_rows(catalog.get("events").sink_path(roots), ["event_id", "event_type", "user_id", "amount"])


def expected(world: tuple[Catalog, Roots, Path]) -> list[tuple[Any, ...]]:
    return [row[:4] for row in expected_events(world[2] / "landing" / "events")[0]]


def dead_letter_count(world: tuple[Catalog, Roots, Path]) -> int:
    catalog, roots, _ = world
    return len(table_rows(catalog.get("events").dead_letter_table_path(roots), ["raw_record"]))


def assert_next_run_gives_the_exact_tables(spark: Any, world: tuple[Catalog, Roots, Path], batches: int) -> None:
    summary = run_streams(spark, world[0], ["events"], world[1])
    assert summary.ok and summary.streams[0].batches == batches
    assert bronze(world) == expected(world)
    assert dead_letter_count(world) == expected_events(world[2] / "landing" / "events")[1]


def version_of_batch(path: str, batch_id: int) -> int:
    [version] = [entry["version"] for entry in table_history(path) if entry["batch_id"] == batch_id]
    return int(version)


def batches_in(checkpoint: Path, folder: str) -> list[int]:
    return sorted(int(p.name.removesuffix(".compact")) for p in (checkpoint / folder).iterdir() if p.name[0].isdigit())


def test_healthy_checkpoint_reports_facts(world: tuple[Catalog, Roots, Path]) -> None:
    report = report_of(world)
    assert report.status is Health.OK and report.codes == []
    assert report.facts["last_batch_id"] == 2 and report.facts["batches_retained"] == 3
    assert report.facts["query_id"] and report.facts["seconds_since_last_commit"] >= 0
    assert report.to_dict()["status"] == "OK"


def test_new_stream_is_ok(tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, events_stream()))
    report = check_stream(catalog.get("events"), roots_in(tmp_path))
    assert report.status is Health.OK and report.codes == ["NEW"]


def test_missing_metadata(world: tuple[Catalog, Roots, Path]) -> None:
    (checkpoint_of(world) / "metadata").unlink()
    report = report_of(world)
    assert report.status is Health.FAIL and "METADATA_MISSING" in report.codes
    assert "repin-query-id" in report.describe()


def test_corrupt_metadata(world: tuple[Catalog, Roots, Path]) -> None:
    (checkpoint_of(world) / "metadata").write_text('{"id": "')
    assert "METADATA_CORRUPT" in report_of(world).codes


def test_torn_latest_offsets(world: tuple[Catalog, Roots, Path]) -> None:
    latest = checkpoint_of(world) / "offsets" / "2"
    latest.write_bytes(latest.read_bytes()[:25])
    remove(checkpoint_of(world) / "commits" / "2")
    report = report_of(world)
    assert report.status is Health.FAIL and "OFFSETS_CORRUPT" in report.codes
    assert report.findings[report.codes.index("OFFSETS_CORRUPT")].evidence["batch_id"] == 2


def test_uncommitted_batch_is_a_warning(world: tuple[Catalog, Roots, Path]) -> None:
    remove(checkpoint_of(world) / "commits" / "2")
    report = report_of(world)
    assert report.status is Health.WARN and report.codes == ["UNCOMMITTED_BATCH"]
    assert "will replay it" in report.findings[0].message


def test_gap_in_offsets(world: tuple[Catalog, Roots, Path]) -> None:
    remove(checkpoint_of(world) / "offsets" / "1")
    report = report_of(world)
    assert "GAP" in report.codes and "COMMIT_WITHOUT_OFFSETS" in report.codes
    assert report.findings[report.codes.index("GAP")].evidence["missing"] == [1]


def test_lost_file_source_log_fails_the_gate(world: tuple[Catalog, Roots, Path]) -> None:
    """Without sources/0 Spark fails the run with "batch 2 doesn't exist", which no retry can fix."""
    shutil.rmtree(checkpoint_of(world) / "sources" / "0")
    report = report_of(world)
    assert report.status is Health.FAIL and report.codes == ["SOURCE_LOG_MISSING"]
    assert report.findings[0].evidence["missing"] == [0, 1, 2]


def test_a_run_past_a_lost_file_source_log_is_not_retried(spark: Any, world: tuple[Catalog, Roots, Path]) -> None:
    """Should the gate be skipped, Spark's own failure is marked as one that a retry cannot fix."""
    shutil.rmtree(checkpoint_of(world) / "sources" / "0")
    DemoProducer(world[2] / "landing", seed=99).events_file(lines=5)
    [stream] = run_streams(spark, world[0], ["events"], world[1]).streams
    assert stream.status == "failed" and not stream.retryable, stream.error


def test_one_lost_file_source_log_batch_fails_the_gate(world: tuple[Catalog, Roots, Path]) -> None:
    remove(checkpoint_of(world) / "sources" / "0" / "1")
    report = report_of(world)
    assert report.status is Health.FAIL and report.codes == ["SOURCE_LOG_MISSING"]
    assert report.findings[0].evidence["missing"] == [1]


def test_commit_without_offsets(world: tuple[Catalog, Roots, Path]) -> None:
    shutil.copy(checkpoint_of(world) / "commits" / "2", checkpoint_of(world) / "commits" / "3")
    report = report_of(world)
    assert report.status is Health.FAIL and "COMMIT_WITHOUT_OFFSETS" in report.codes


def test_checkpoint_of_another_query(world: tuple[Catalog, Roots, Path]) -> None:
    latest = checkpoint_of(world) / "offsets" / "2"
    latest.write_text(latest.read_text().rstrip("\n") + '\n{"logOffset":7}')
    assert "SOURCE_COUNT_MISMATCH" in report_of(world).codes


def test_old_backup_restored_puts_the_sink_ahead(world: tuple[Catalog, Roots, Path]) -> None:
    checkpoint = checkpoint_of(world)
    for log_name in ("offsets", "commits"):
        remove(checkpoint / log_name / "2")
        remove(checkpoint / log_name / "1")
    report = report_of(world)
    assert report.status is Health.FAIL and "SINK_AHEAD_OF_CHECKPOINT" in report.codes
    evidence = report.findings[report.codes.index("SINK_AHEAD_OF_CHECKPOINT")].evidence
    assert (evidence["txn_version"], evidence["latest_offsets_batch"]) == (2, 0)


def test_lost_checkpoint_is_a_likely_duplicate_load(world: tuple[Catalog, Roots, Path]) -> None:
    shutil.rmtree(checkpoint_of(world))
    report = report_of(world)
    assert report.status is Health.FAIL and report.codes == ["NEW", "QUERY_ID_UNKNOWN_TO_SINK"]


def test_checkpoint_copied_from_another_stream(world: tuple[Catalog, Roots, Path]) -> None:
    (checkpoint_of(world) / "metadata").write_text('{"id":"5d9b0c9e-1111-4222-8333-944455556666"}')
    report = report_of(world)
    assert report.status is Health.FAIL and report.codes == ["QUERY_ID_UNKNOWN_TO_SINK"]


def test_stale_stream_is_a_warning(world: tuple[Catalog, Roots, Path]) -> None:
    two_hours_ago = time.time() - 7200
    os.utime(checkpoint_of(world) / "commits" / "2", (two_hours_ago, two_hours_ago))
    report = report_of(world)
    assert report.status is Health.WARN and report.codes == ["STALE"]


def test_held_lock_fails_and_blocks_a_run(spark: Any, world: tuple[Catalog, Roots, Path]) -> None:
    catalog, roots, _ = world
    path = catalog.get("events").sink_path(roots)
    version = DeltaTable(path).version()
    with StreamLock(checkpoint_of(world), "events", "other-run"):
        report = report_of(world)
        assert report.status is Health.FAIL and report.codes == ["LOCKED"]
        DemoProducer(roots.landing, seed=52).events_file(lines=10, now=NOW)
        with pytest.raises(LockHeld, match="locked by run 'other-run'"):
            run_streams(spark, catalog, ["events"], roots)
    assert DeltaTable(path).version() == version
    assert report_of(world).codes == []


def test_lock_of_a_dead_process_is_stale(world: tuple[Catalog, Roots, Path]) -> None:
    lock = checkpoint_of(world) / ".sluice-lock.json"
    lock.write_text(json.dumps({"stream": "events", "run_id": "ghost", "pid": 2**22 + 7, "acquired_at": time.time(),
                                "heartbeat_at": time.time()} | process_space()))
    assert "LOCKED" not in report_of(world).codes
    with StreamLock(checkpoint_of(world), "events", "mine"):
        assert json.loads(lock.read_text())["run_id"] == "mine"


def test_quarantine_torn_offsets_then_run_gives_the_exact_table(spark: Any, world: tuple[Catalog, Roots, Path]) -> None:
    catalog, roots, _ = world
    checkpoint = checkpoint_of(world)
    with pytest.raises(RepairError, match="committed batch"):
        quarantine_offsets(catalog.get("events"), roots)
    # A crash while Spark wrote the offsets of batch 3, planned for a file that arrived since.
    DemoProducer(roots.landing, seed=53).events_file(lines=20, now=NOW + dt.timedelta(hours=1))
    (checkpoint / "offsets" / "3").write_text('v1\n{"batchWatermarkMs":0,')
    assert "OFFSETS_CORRUPT" in report_of(world).codes

    result = quarantine_offsets(catalog.get("events"), roots)

    assert "3" in result["moved"] and Path(result["backup"], "offsets", "3").exists()
    assert report_of(world).status is Health.OK
    assert run_streams(spark, catalog, ["events"], roots).ok
    assert bronze(world) == expected(world)


def test_repin_after_lost_metadata_then_run_adds_no_duplicate(spark: Any, world: tuple[Catalog, Roots, Path]) -> None:
    catalog, roots, _ = world
    checkpoint = checkpoint_of(world)
    original = json.loads((checkpoint / "metadata").read_text())["id"]
    (checkpoint / "metadata").unlink()
    remove(checkpoint / "commits" / "2")  # and the last batch must be replayed: only the pinned id dedups it

    result = repin_query_id(catalog.get("events"), roots)

    assert result["query_id"] == original and result["changed"]
    assert report_of(world).codes == ["UNCOMMITTED_BATCH"]
    assert run_streams(spark, catalog, ["events"], roots).ok
    assert bronze(world) == expected(world)


def test_backup_copies_everything_but_the_lock(world: tuple[Catalog, Roots, Path]) -> None:
    catalog, roots, _ = world
    (checkpoint_of(world) / ".sluice-lock.json.stale-1").write_text("{}")
    copy = Path(backup(catalog.get("events"), roots)["backup"])
    assert copy.parent == checkpoint_of(world).parent
    assert sorted(p.name for p in (copy / "offsets").iterdir() if p.name.isdigit()) == ["0", "1", "2"]
    assert not list(copy.glob(".sluice-lock*"))


def test_a_repair_leaves_a_row_in_the_run_log(world: tuple[Catalog, Roots, Path]) -> None:
    from sluice.operations.repair import run_and_log
    from sluice.storage import runlog

    catalog, roots, _ = world
    stream = catalog.get("events")
    result = run_and_log("backup", stream, roots, run_id="repair/manual__1/repair")
    with pytest.raises(RepairError, match="reset needs the Delta version"):
        run_and_log("reset", stream, roots, run_id="repair/manual__2/repair")
    run_and_log("history", stream, roots, run_id="repair/manual__3/repair")  # reads only: no row

    rows = {row["run_id"]: row for row in runlog.runs(roots.lake, "events") if row["kind"] == "repair"}
    assert sorted(rows) == ["repair/manual__1/repair", "repair/manual__2/repair"]
    done, refused = rows["repair/manual__1/repair"], rows["repair/manual__2/repair"]
    assert (done["status"], done["dag_id"]) == ("succeeded", "repair")
    assert json.loads(done["note"]) == {"action": "backup", "version": None, **result}
    assert refused["status"] == "failed" and "reset needs the Delta version" in refused["error"]


def test_run_that_loses_its_lock_stops_and_fails(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import functools
    import threading

    from sluice.storage.object_lock import lock_for
    from sluice_spark.runner import run as runner

    monkeypatch.setattr(runner, "lock_for", functools.partial(lock_for, heartbeat_seconds=0.05))
    catalog = load_catalog(write_catalog(tmp_path, events_stream(trigger={"max_files_per_trigger": 1})))
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=54)
    for index in range(40):
        producer.events_file(lines=5, now=NOW + dt.timedelta(minutes=index))
    lock_file = Path(catalog.get("events").checkpoint_path(roots)) / ".sluice-lock.json"

    def steal_once_running() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (lock_file.parent / "commits" / "0").exists():
            time.sleep(0.02)
        stolen = json.loads(lock_file.read_text()) | {"run_id": "thief", "token": "thief-token"}
        # Written whole (a rename), and again until it stays: the heartbeat checks the lock then replaces it, and a
        # theft between the two is overwritten (no file system compare-and-swap), which a loaded machine can hit.
        while time.monotonic() < deadline:
            lock_file.with_name("thief.tmp").write_text(json.dumps(stolen))
            os.replace(lock_file.with_name("thief.tmp"), lock_file)
            time.sleep(0.5)  # ten heartbeats
            if json.loads(lock_file.read_text())["run_id"] == "thief":
                return

    thief = threading.Thread(target=steal_once_running)
    thief.start()
    stream = run_streams(spark, catalog, ["events"], roots).streams[0]
    thief.join()

    assert stream.status == "failed" and "lost the stream's lock" in stream.error
    assert stream.batches < 40, "the run stopped early"
    assert json.loads(lock_file.read_text())["run_id"] == "thief", "the new holder's lock is left alone"


def test_new_checkpoint_whose_query_the_sink_knows_is_sink_ahead(world: tuple[Catalog, Roots, Path]) -> None:
    for folder in ("offsets", "commits", "sources"):
        shutil.rmtree(checkpoint_of(world) / folder)
    report = report_of(world)
    assert report.status is Health.FAIL and report.codes[:2] == ["NEW", "SINK_AHEAD_OF_CHECKPOINT"]


def test_reset_after_a_version_rolls_back_and_the_next_run_reads_the_rest(
    spark: Any, world: tuple[Catalog, Roots, Path]
) -> None:
    catalog, roots, _ = world
    stream = catalog.get("events")
    checkpoint = checkpoint_of(world)
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    version = version_of_batch(stream.sink_path(roots), 0)
    rows_at_version = table_rows(stream.sink_path(roots), ["event_id", "event_type", "user_id", "amount"],
                                 version=version)
    assert 0 < len(rows_at_version) < len(expected(world))

    result = reset_to_version(stream, roots, version)

    assert result["resumes_after_batch"] == 0 and result["tables"]["sink"]["restored"]
    assert bronze(world) == rows_at_version
    assert [batches_in(checkpoint, f) for f in ("offsets", "commits", "sources/0")] == [[0], [0], [0]]
    assert Path(result["backup"], "offsets", "2").exists() and Path(result["moved_to"], "commits", "2").exists()
    assert DeltaTable(stream.sink_path(roots)).transaction_version(query_id) == 0
    newest = table_history(stream.sink_path(roots), limit=1)[0]
    assert (newest["operation"], newest["query_id"], newest["reset_after_batch"]) == ("RESTORE", query_id, 0)
    assert report_of(world).codes == []

    assert_next_run_gives_the_exact_tables(spark, world, batches=2)


def test_reset_resolves_a_restored_old_backup(spark: Any, world: tuple[Catalog, Roots, Path]) -> None:
    catalog, roots, _ = world
    stream = catalog.get("events")
    checkpoint = checkpoint_of(world)
    for folder in ("offsets", "commits", "sources/0"):
        for batch in ("1", "2"):
            remove(checkpoint / folder / batch)
    report = report_of(world)
    finding = report.findings[report.codes.index("SINK_AHEAD_OF_CHECKPOINT")]
    reachable = finding.evidence["reset_version"]
    assert reachable == version_of_batch(stream.sink_path(roots), 0)
    assert f"reset --stream events --version {reachable}" in finding.message
    newest = DeltaTable(stream.sink_path(roots)).version()
    with pytest.raises(RepairError, match=f"newest committed batch is 0.*Reset to version {reachable} or earlier"):
        reset_to_version(stream, roots, newest)
    assert DeltaTable(stream.sink_path(roots)).version() == newest, "a refused reset changes nothing"

    reset_to_version(stream, roots, reachable)

    assert report_of(world).status is Health.OK
    assert_next_run_gives_the_exact_tables(spark, world, batches=2)


def test_reset_to_before_the_first_batch_reads_everything_again(spark: Any, world: tuple[Catalog, Roots, Path]) -> None:
    catalog, roots, _ = world
    stream = catalog.get("events")
    checkpoint = checkpoint_of(world)

    result = reset_to_version(stream, roots, 0)

    assert result["resumes_after_batch"] == -1
    assert [p.name for p in checkpoint.rglob("*") if p.is_file()] == ["metadata"], "only the query id is left"
    assert bronze(world) == [] and dead_letter_count(world) == 0
    assert report_of(world).codes == ["NEW"]
    assert_next_run_gives_the_exact_tables(spark, world, batches=3)


def test_reset_refusals_change_nothing(world: tuple[Catalog, Roots, Path]) -> None:
    catalog, roots, _ = world
    stream = catalog.get("events")
    checkpoint = checkpoint_of(world)
    before = (sorted(str(p) for p in checkpoint.rglob("*")), DeltaTable(stream.sink_path(roots)).version())
    with pytest.raises(RepairError, match=r"^version: 99 is not a version of .* which has versions 0 to \d+$"):
        reset_to_version(stream, roots, 99)
    with pytest.raises(RepairError, match="version: expected a Delta version number"):
        reset_to_version(stream, roots, "1")  # type: ignore[arg-type]
    for out_of_range in (-1, 2**63, 10**30):
        with pytest.raises(RepairError, match="version: expected a Delta version number from 0 to"):
            reset_to_version(stream, roots, out_of_range)
    with StreamLock(checkpoint, "events", "live-run"), pytest.raises(RepairError, match="live-run"):
        reset_to_version(stream, roots, 1)
    assert (sorted(str(p) for p in checkpoint.rglob("*")), DeltaTable(stream.sink_path(roots)).version()) == before
    assert not list(checkpoint.parent.glob("events.reset-*"))
    (checkpoint / "metadata").unlink()
    with pytest.raises(RepairError, match="no query id"):
        reset_to_version(stream, roots, 1)


def test_reset_of_a_fan_out_stream_restores_every_table_it_writes(spark: Any, tmp_path: Path) -> None:
    """The fan-out table is one of the stream's tables: a reset restores it with the sink and the dead-letter table,
    so the rerun's batches are written to it again instead of skipped, and the health check stays OK."""
    write_catalog(tmp_path, events_stream(
        trigger={"max_files_per_trigger": 1},
        fan_out=[{"path": "bronze/purchases", "where": "event_type = 'purchase'"}]))
    catalog, roots = load_catalog(tmp_path / "catalog.yaml"), roots_in(tmp_path)
    stream = catalog.get("events")
    producer = DemoProducer(tmp_path / "landing", seed=52, malformed_rate=0.05)
    for index in range(3):
        producer.events_file(lines=40, now=NOW + dt.timedelta(minutes=index))
    assert run_streams(spark, catalog, ["events"], roots).streams[0].batches == 3
    purchases = str(Path(roots.lake) / "bronze" / "purchases")
    columns = ["event_id", "event_type", "user_id", "amount"]
    good, bad = expected_events(tmp_path / "landing" / "events")
    wanted_purchases = sorted((row[:4] for row in good if row[1] == "purchase"), key=repr)
    assert wanted_purchases and table_rows(purchases, columns) == wanted_purchases

    result = reset_to_version(stream, roots, version_of_batch(stream.sink_path(roots), 0))

    assert result["resumes_after_batch"] == 0 and result["tables"]["fan_out[0]"]["restored"]
    assert check_stream(stream, roots).codes == []
    rerun = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert rerun.status == "succeeded" and rerun.batches == 2, rerun.error
    assert table_rows(stream.sink_path(roots), columns) == sorted((row[:4] for row in good), key=repr)
    assert table_rows(purchases, columns) == wanted_purchases, "the fan-out table equals its batch oracle"
    assert len(table_rows(stream.dead_letter_table_path(roots), ["raw_record"])) == bad
    assert check_stream(stream, roots).codes == []
