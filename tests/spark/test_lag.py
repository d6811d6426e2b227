"""Lag of real backlogs: files written, real Spark runs, more files written. The predicted unread files are checked
against what Spark's next run records in its source log, and the status follows the catalog's thresholds."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import Catalog, load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.lag.observe import LagStatus, check, observe
from sluice.lag.store import LagStore
from sluice.paths import Roots
from sluice.storage.checkpoint import CheckpointReader
from sluice_spark.runner import run_streams
from tests.helpers import events_stream, fresh_world, keep_pristine, roots_in, write_catalog

pytestmark = pytest.mark.spark

NOW = dt.datetime(2026, 11, 22, 9, 0, tzinfo=dt.timezone.utc)
ALERTS = {"warn_files": 2, "critical_files": 4, "stale_after_seconds": 600, "stall_observations": 3}


@pytest.fixture(scope="module")
def golden(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two files ingested by a real run: the stream is caught up."""
    folder = tmp_path_factory.mktemp("lag") / "world"
    folder.mkdir()
    write_catalog(folder, events_stream(alerts=ALERTS, backfill={"event_time_column": "event_time"}, source={
        **events_stream()["source"], "options": {"recursiveFileLookup": True, "pathGlobFilter": "*.json",
                                                 "maxFileAge": "1h"}}))
    producer = DemoProducer(folder / "landing", seed=7, malformed_rate=0.0)
    for index in range(2):
        producer.events_file(lines=20, now=NOW + dt.timedelta(minutes=index))
    run_streams(spark, load_catalog(folder / "catalog.yaml"), ["events"], roots_in(folder))
    return keep_pristine(folder)


@pytest.fixture
def world(golden: Path) -> tuple[Catalog, Roots, Path]:
    return fresh_world(golden)


def produce(folder: Path, count: int, *, seed: int) -> list[Path]:
    producer = DemoProducer(folder / "landing", seed=seed, malformed_rate=0.0)
    return [producer.events_file(lines=10, now=NOW + dt.timedelta(hours=1, minutes=5 * seed + i)).files[0]
            for i in range(count)]


def test_unread_files_and_bytes_are_exactly_what_the_next_run_reads(spark: Any, world: Any) -> None:
    catalog, roots, folder = world
    stream = catalog.get("events")
    assert observe(stream, roots).backlog.files == 0

    new = produce(folder, 3, seed=11)
    # Files Spark's listing skips or its maxFileAge horizon (1h behind the newest recorded file) excludes.
    day = new[0].parent
    (day / "_partial.json").write_text('{"event_id": "x"}\n')
    (day / ".hidden.json").write_text('{"event_id": "x"}\n')
    (day / "notes.txt").write_text("not json\n")
    archived = day / "events-archived.json"
    archived.write_text(new[0].read_text())
    old = time.time() - 3 * 3600
    os.utime(archived, (old, old))

    backlog = observe(stream, roots).backlog
    assert backlog.files == 3
    assert backlog.bytes == sum(path.stat().st_size for path in new)
    assert backlog.oldest_unread_at == min(path.stat().st_mtime for path in new)

    checkpoint = CheckpointReader(stream.checkpoint_path(roots))
    before = checkpoint.file_source_entries()
    run_streams(spark, catalog, ["events"], roots)
    read_by_spark = set(checkpoint.file_source_entries()) - set(before)
    assert read_by_spark == {str(path) for path in new}
    assert observe(stream, roots).backlog.files == 0


def test_status_moves_ok_warn_critical_and_back_to_ok_after_a_run(spark: Any, world: Any) -> None:
    catalog, roots, folder = world
    stream = catalog.get("events")
    statuses = [check(stream, roots).status]
    for seed in (21, 22):
        produce(folder, 2, seed=seed)
        statuses.append(check(stream, roots).status)
    assert statuses == [LagStatus.OK, LagStatus.WARN, LagStatus.CRITICAL]
    assert "4 files behind (critical at 4)" in check(stream, roots).reasons[0]

    run_streams(spark, catalog, ["events"], roots)
    report = check(stream, roots)
    assert report.status is LagStatus.OK, report.reasons
    assert report.observation.last_batch_id == 1
    newest = max(json.loads(line)["event_time"] for path in (folder / "landing").rglob("*.json")
                 for line in path.read_text().splitlines())
    assert dt.datetime.fromisoformat(report.observation.newest_event_time) == dt.datetime.fromisoformat(newest)


def test_a_growing_backlog_without_commits_is_stalled_then_stopped(world: Any, tmp_path: Path) -> None:
    """Real observations of a real landing zone, recorded in the lag store: the backlog grows over three
    observations while nothing commits (STALLED); later, past ``stale_after_seconds``, the stream is STOPPED."""
    catalog, roots, folder = world
    stream = catalog.get("events")
    store = LagStore(tmp_path / "lag.sqlite")
    start = time.time()
    observed = []
    for step in range(3):
        produce(folder, 1, seed=30 + step)
        report = check(stream, roots, history=store.observations("events"), now=start + 60 * step)
        store.record(report)
        observed.append(report)
    # One file, then two: WARN by count. The third observation completes the window of three.
    assert [r.status for r in observed] == [LagStatus.OK, LagStatus.WARN, LagStatus.STALLED]
    assert "grew from 1 to 3 over 3 observations" in observed[-1].reasons[-1]

    # A backlog that stays the same over a whole window is not a stall, even without commits.
    for minute in (3, 4):
        steady = check(stream, roots, history=store.observations("events"), now=start + 60 * minute)
        store.record(steady)
    assert steady.status is LagStatus.WARN, steady.reasons

    # Past the stop threshold, both since the last commit and for the oldest unread file.
    later = start + 60 * 60
    stopped = check(stream, roots, history=store.observations("events"), now=later)
    assert stopped.status is LagStatus.STOPPED
    assert any(reason.startswith("STOPPED: no commit for") for reason in stopped.reasons)
    store.record(stopped)
    assert [r.status for r in store.history("events")][-1] is LagStatus.STOPPED


def test_files_of_a_batch_that_never_committed_are_still_unread(spark: Any, world: Any) -> None:
    """A run killed after Spark planned batch 1 (offsets and source log written) and before it committed: the
    next run replays the batch, so its files are still backlog."""
    catalog, roots, folder = world
    stream = catalog.get("events")
    new = produce(folder, 2, seed=41)
    run_streams(spark, catalog, ["events"], roots)
    checkpoint = Path(stream.checkpoint_path(roots))
    (checkpoint / "commits" / "1").unlink()
    (checkpoint / "commits" / ".1.crc").unlink(missing_ok=True)

    backlog = observe(stream, roots).backlog
    assert (backlog.files, backlog.bytes) == (2, sum(path.stat().st_size for path in new))
    run_streams(spark, catalog, ["events"], roots)
    assert (checkpoint / "commits" / "1").exists()
    assert observe(stream, roots).backlog.files == 0
