"""The health gate in the core, without Airflow or a JVM: a stream held by another run's lock is checked again until
that run ends, or left out with a retry when the wait runs out; a checkpoint that needs a repair is left out without
one, and a group's other streams still run."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

import sluice.operations.gate as gate
from sluice.catalog import load_catalog
from sluice.operations.gate import check_streams, checked_health, places, resolve_roots
from sluice.storage.lock import StreamLock
from tests.helpers import events_stream, roots_in, write_catalog


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate, "LOCK_POLL_SECONDS", 0.05)


def streams(tmp_path: Path) -> list:  # type: ignore[type-arg]
    catalog = load_catalog(str(write_catalog(tmp_path, events_stream("clicks"), events_stream("views"))))
    return catalog.select(["clicks", "views"])


def test_the_gate_waits_for_another_runs_lock_and_passes_once_it_is_released(tmp_path: Path) -> None:
    clicks, _ = streams(tmp_path)
    roots = roots_in(tmp_path)
    checkpoint = Path(clicks.checkpoint_path(roots))
    checkpoint.mkdir(parents=True)
    held = StreamLock(checkpoint, "clicks", "backfill/run-1")
    held.acquire()
    started = time.monotonic()  # before the timer starts: its 0.3 s count from no later than this
    threading.Timer(0.3, held.release).start()
    report, stops = checked_health(clicks, roots, lock_deadline=time.monotonic() + 30)
    assert not stops and not report.waits_for_a_run, report.describe()
    assert 0.3 <= time.monotonic() - started < 10


def test_a_lock_still_held_after_the_wait_leaves_the_stream_out_with_a_retry(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clicks, views = streams(tmp_path)
    roots = roots_in(tmp_path)
    checkpoint = Path(clicks.checkpoint_path(roots))
    checkpoint.mkdir(parents=True)
    with StreamLock(checkpoint, "clicks", "maintenance/run-2"), caplog.at_level(logging.INFO, logger=gate.__name__):
        result = check_streams([clicks, views], roots, lock_wait_seconds=0.2)
    assert result.stopped == ["clicks"] and result.retry
    assert "maintenance/run-2" in result.refusals[0]
    assert set(result.reports) == {"clicks", "views"} and result.reports["views"]["status"] != "FAIL"
    assert "another run holds the stream's lock" in caplog.text


def test_a_checkpoint_that_needs_a_repair_is_left_out_without_a_retry(tmp_path: Path) -> None:
    clicks, views = streams(tmp_path)
    roots = roots_in(tmp_path)
    Path(clicks.checkpoint_path(roots)).parent.mkdir(parents=True)
    Path(clicks.checkpoint_path(roots)).write_text("not a folder")  # a checkpoint path that is a file
    result = check_streams([clicks, views], roots, lock_wait_seconds=0)
    assert result.stopped == ["clicks"] and not result.retry, result.refusals


def test_roots_fall_back_to_the_environment_and_places_cover_the_streams(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path / "data"))
    roots = resolve_roots(None, str(tmp_path / "lake"), None)
    assert roots.lake == str(tmp_path / "lake") and roots.landing.startswith(str(tmp_path / "data"))
    catalog = write_catalog(tmp_path, events_stream("clicks"))
    found = places(roots, str(catalog), ["clicks"])
    assert found[:3] == [roots.landing, roots.lake, roots.checkpoints] and len(found) > 3
    assert places(roots, str(tmp_path / "missing.yaml")) == found[:3], "a catalog that does not load: the roots"
