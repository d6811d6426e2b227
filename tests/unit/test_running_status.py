"""A stream that is running, as ``make status`` and the Streams page's data show it: RUNNING with its run id and since
when, not a checkpoint FAIL; ``status --reasons`` says why for the HEALTH column too; the nightly maintenance is no
run of the stream. Real lock files and a real run log (delta-rs), no Spark."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from sluice.catalog import load_catalog
from sluice.cli import status
from sluice.operations import streams_view
from sluice.operations.health import check_stream
from sluice.storage import runlog
from sluice.storage.lock import LOCK_FILE, StreamLock
from sluice.times import iso_utc
from tests.helpers import events_stream, roots_in, write_catalog

RUN_ID = "ingest_events/manual__2026-11-27T16:50:00+00:00/run_stream"


def health_column(lines: list[str]) -> str:
    """The first stream's HEALTH cell of ``make status``'s table."""
    return lines[1][lines[0].index("HEALTH"):lines[0].index("TREND")].strip()


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    catalog = write_catalog(tmp_path, events_stream())
    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    checkpoint = Path(load_catalog(catalog).get("events").checkpoint_path(roots_in(tmp_path)))
    checkpoint.mkdir(parents=True)
    return catalog, checkpoint


def test_a_live_run_holding_the_lock_is_running_not_a_failure(world: tuple[Path, Path],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    catalog, checkpoint = world
    stream = load_catalog(catalog).get("events")
    roots = roots_in(checkpoint.parents[2])
    with StreamLock(checkpoint, "events", RUN_ID):
        report = check_stream(stream, roots)
        # The gate still waits for the run: that is what keeps two writers apart.
        assert report.status.value == "FAIL" and report.waits_for_a_run
        assert report.shown_status == "RUNNING" and report.running is not None
        assert report.running["run_id"] == RUN_ID and report.running["pid"] > 0
        assert abs(time.time() - datetime.fromisoformat(report.running["since"]).timestamp()) < 60
        assert [finding["severity"] for finding in report.shown_findings() if finding["code"] == "LOCKED"] == [
            "RUNNING"]

        assert status.main(["--catalog", str(catalog), "--reasons"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert health_column(lines) == "RUNNING"
        assert f"events: RUNNING run {RUN_ID!r} since {report.running['since']}" in "\n".join(lines)
        assert any(line.startswith("events: health LOCKED [RUNNING]: run ") for line in lines)

        assert status.main(["--catalog", str(catalog), "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["health"] == "RUNNING" and printed["running"]["run_id"] == RUN_ID

        (listed,) = streams_view.overview(load_catalog(catalog), roots)
        assert (listed["health"], listed["running"]["run_id"], listed["health_codes"]) == ("RUNNING", RUN_ID, [])
        assert listed["running"]["link"] == ("/dags/ingest_events/runs/manual__2026-11-27T16%3A50%3A00%2B00%3A00"
                                             "/tasks/run_stream")
        detail = streams_view.detail(stream, roots)
        assert detail["health"]["status"] == "RUNNING" and detail["health"]["gate"] == "FAIL"

    released = check_stream(stream, roots)
    assert released.shown_status == "OK" and released.running is None


def test_a_lock_sluice_cannot_use_stays_a_failure_with_its_reason(world: tuple[Path, Path],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    catalog, checkpoint = world
    (checkpoint / LOCK_FILE).mkdir()  # a folder where the lock file goes: no run can take the lock
    assert status.main(["--catalog", str(catalog), "--reasons"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert health_column(lines) == "FAIL LOCKED"
    assert any(line.startswith("events: health LOCKED [FAIL]: ") and "directory" in line for line in lines), lines
    (listed,) = streams_view.overview(load_catalog(catalog), roots_in(checkpoint.parents[2]))
    assert (listed["health"], listed["running"], listed["health_codes"]) == ("FAIL", None, ["LOCKED"])


def test_every_health_code_shown_gets_its_reason(world: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    catalog, checkpoint = world
    (checkpoint / "offsets").mkdir()
    (checkpoint / "offsets" / "99999999999999999999").write_text("v1\n")  # past 2**63-1: no batch Spark writes
    assert status.main(["--catalog", str(catalog), "--reasons"]) == 0
    lines = capsys.readouterr().out.splitlines()
    status_, *codes = health_column(lines).split()
    assert status_ == "WARN" and codes == ["ODD_LOG_FILE"]
    for code in codes:
        assert any(line.startswith(f"events: health {code} [") for line in lines), (code, lines)


def test_maintenance_is_listed_apart_from_the_streams_runs(world: tuple[Path, Path]) -> None:
    catalog, checkpoint = world
    roots = roots_in(checkpoint.parents[2])
    now = time.time()
    run = runlog.run_row(None, kind="run", stream="events", run_id=RUN_ID, status="SUCCESS",
                         started_at=iso_utc(now - 60), ended_at=iso_utc(now - 50), input_rows=10, output_rows=10,
                         dead_letter_rows=0)
    runlog.record_runs(roots.lake, [run])
    runlog.log_operation(roots.lake, stream="events", run_id="delta_maintenance/scheduled__1/maintain",
                         kind="maintenance", started=now - 30, status="SUCCESS", error=None, note={})
    detail = streams_view.detail(load_catalog(catalog).get("events"), roots)
    assert [row["run_id"] for row in detail["runs"]] == [RUN_ID]
    assert [(row["kind"], row["link"]) for row in detail["operations"]] == [
        ("maintenance", "/dags/delta_maintenance/runs/scheduled__1/tasks/maintain")]


def test_a_run_is_named_when_another_finding_fails_the_check(world: tuple[Path, Path],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    catalog, checkpoint = world
    landing = checkpoint.parents[2] / "landing" / "events"
    landing.mkdir(parents=True)
    (landing / "elsewhere.json").symlink_to("/etc/hostname")
    with StreamLock(checkpoint, "events", RUN_ID):
        assert status.main(["--catalog", str(catalog), "--reasons"]) == 0
        lines = capsys.readouterr().out.splitlines()
        (listed,) = streams_view.overview(load_catalog(catalog), roots_in(checkpoint.parents[2]))
    assert health_column(lines) == "FAIL LANDING_SYMLINK"
    assert any(line.startswith(f"events: RUNNING run {RUN_ID!r} since ") for line in lines)
    assert any(line.startswith("events: health LANDING_SYMLINK [FAIL]: ") for line in lines)
    assert (listed["health"], listed["running"]["run_id"], listed["health_codes"]) == ("FAIL", RUN_ID,
                                                                                      ["LANDING_SYMLINK"])


def test_the_batch_a_live_run_is_writing_is_part_of_the_run_and_a_fault_once_it_stopped(
        world: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A run plans a batch (its offsets file) before it commits it: while the run lives, that one uncommitted batch
    is the run's work in progress, not "the last run stopped during it"."""
    catalog, checkpoint = world
    stream = load_catalog(catalog).get("events")
    roots = roots_in(checkpoint.parents[2])
    (checkpoint / "metadata").write_text('{"id":"5d9b0c9e-1111-4222-8333-944455556666"}')
    (checkpoint / "offsets").mkdir()
    (checkpoint / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}\n'
                                              '{"logOffset":0}')
    (checkpoint / "sources" / "0").mkdir(parents=True)  # the files that batch 0 reads
    (checkpoint / "sources" / "0" / "0").write_text('v1\n{"path":"file:///landing/a.json","timestamp":0,"batchId":0}')
    with StreamLock(checkpoint, "events", RUN_ID):
        report = check_stream(stream, roots)
        assert {finding.code.value for finding in report.findings} >= {"LOCKED", "UNCOMMITTED_BATCH"}
        assert report.shown_status == "RUNNING" and report.shown_codes() == []
        assert status.main(["--catalog", str(catalog), "--reasons"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert health_column(lines) == "RUNNING"
        assert "events: health UNCOMMITTED_BATCH [RUNNING]: batch 0 is being written by the running run" in lines

    stopped = check_stream(stream, roots)
    assert stopped.shown_status == "WARN" and stopped.shown_codes() == ["UNCOMMITTED_BATCH"]
    assert status.main(["--catalog", str(catalog), "--reasons"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert health_column(lines) == "WARN UNCOMMITTED_BATCH"
    assert any(line.startswith("events: health UNCOMMITTED_BATCH [WARN]: batch 0 was planned but never committed")
               for line in lines)
