"""A backfill (and a maintenance) waits for the live stream's lock instead of writing beside a running stream."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from sluice.operations.backfill import BackfillError
from sluice.storage.lock import LockHeld, StreamLock, read_lock
from sluice.storage.object_lock import waiting_lock
from sluice_spark.backfill import hadoop_glob


def test_backfill_waits_for_a_running_stream_then_holds_the_lock(tmp_path: Path) -> None:
    live = StreamLock(tmp_path, "events", "live-run")
    live.acquire()
    releasing = threading.Event()

    def finish_the_live_run() -> None:
        time.sleep(0.3)
        # Set before the release: set after it, the backfill could take the lock in between and see it unset.
        releasing.set()
        live.release()

    threading.Thread(target=finish_the_live_run).start()
    with waiting_lock(str(tmp_path), "events", "backfill/run-1", wait_seconds=30):
        assert releasing.is_set(), "the backfill got the lock only after the live run released it"
        holder = read_lock(tmp_path)
        assert holder is not None and holder.run_id == "backfill/run-1"
    assert read_lock(tmp_path) is None


def test_backfill_gives_up_after_its_wait(tmp_path: Path) -> None:
    with StreamLock(tmp_path, "events", "live-run"), pytest.raises(LockHeld, match="live-run"), \
            waiting_lock(str(tmp_path), "events", "backfill/run-2", wait_seconds=0.2):
        pytest.fail("the backfill must not run while the stream holds the lock")


def test_glob_matches_exactly_the_planned_files() -> None:
    assert hadoop_glob(["/l/e/2026-03-29/b.json", "/l/e/2026-03-28/a,1.json"]) == \
        "/l/e/{2026-03-28/a\\,1.json,2026-03-29/b.json}"
    assert hadoop_glob(["s3a://bucket/l/e/b.json", "s3a://bucket/l/f/a.json"]) == "s3a://bucket/l/{e/b.json,f/a.json}"
    assert hadoop_glob(["s3a://bucket/b.json", "s3a://bucket/a.json"]) == "s3a://bucket/{a.json,b.json}"
    with pytest.raises(BackfillError, match="more than one store"):
        hadoop_glob(["s3a://bucket/l/b.json", "s3a://bucket2/l/a.json"])


def test_a_frozen_plan_that_is_no_regular_file_is_refused_without_hanging(tmp_path: Path) -> None:
    import os

    from sluice.catalog import load_catalog
    from sluice.operations.backfill import parse_request
    from sluice.storage.store import LocalFolder, NotReadable
    from sluice_spark.backfill import _frozen_plan
    from tests.unit.test_hostile_reads import returns

    catalog = load_catalog()
    request = parse_request({"stream": "events_bronze", "start": "2026-11-01T00:00:00Z",
                             "end": "2026-11-02T00:00:00Z"}, catalog, run_id="r")
    os.mkfifo(tmp_path / "plan.json")
    with pytest.raises(NotReadable, match=r"plan\.json: not a regular file"):
        returns(lambda: _frozen_plan(LocalFolder(tmp_path), request, catalog.get("events_bronze"), None))
