from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from sluice.lock import LOCK_FILE, LockHeld, StreamLock, read_lock


def test_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    with StreamLock(tmp_path, "events", "run-1"):
        holder = read_lock(tmp_path)
        assert holder is not None and (holder.run_id, holder.pid) == ("run-1", os.getpid())
        with pytest.raises(LockHeld, match="locked by run 'run-1'"):
            StreamLock(tmp_path, "events", "run-2").acquire()
    assert read_lock(tmp_path) is None


def test_expired_lock_is_taken_over(tmp_path: Path) -> None:
    long_ago = time.time() - 3600
    (tmp_path / LOCK_FILE).write_text(json.dumps({
        "stream": "events", "run_id": "old", "host": "elsewhere", "pid": 1, "acquired_at": long_ago,
        "heartbeat_at": long_ago, "expires_after_seconds": 300}))
    with StreamLock(tmp_path, "events", "new"):
        assert read_lock(tmp_path).run_id == "new"  # type: ignore[union-attr]
    assert list(tmp_path.glob(f"{LOCK_FILE}.stale-*")), "the stale lock is kept aside, not deleted"


def test_live_lock_on_another_host_is_respected(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_text(json.dumps({
        "stream": "events", "run_id": "remote", "host": "worker-7", "pid": 1, "acquired_at": time.time(),
        "heartbeat_at": time.time(), "expires_after_seconds": 300}))
    with pytest.raises(LockHeld, match="on worker-7"):
        StreamLock(tmp_path, "events", "mine").acquire()


def test_heartbeat_refreshes_the_lock(tmp_path: Path) -> None:
    lock = StreamLock(tmp_path, "events", "beating", heartbeat_seconds=0.05)
    lock.acquire()
    try:
        first = read_lock(tmp_path).heartbeat_at  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while read_lock(tmp_path).heartbeat_at == first:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no heartbeat"
            time.sleep(0.01)
    finally:
        lock.release()
    assert read_lock(tmp_path) is None


def test_release_leaves_a_lock_taken_over_by_another_run(tmp_path: Path) -> None:
    lock = StreamLock(tmp_path, "events", "same-run-id")
    lock.acquire()
    (tmp_path / LOCK_FILE).write_text(json.dumps({
        "stream": "events", "run_id": "same-run-id", "host": socket.gethostname(), "pid": os.getpid(),
        "acquired_at": time.time(), "heartbeat_at": time.time(), "token": "a-retry"}))
    lock.release()
    assert read_lock(tmp_path).token == "a-retry"  # type: ignore[union-attr]


def test_half_written_lock_counts_as_held_until_it_expires(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_text("")
    with pytest.raises(LockHeld):
        StreamLock(tmp_path, "events", "mine").acquire()
    old = time.time() - 3600
    os.utime(tmp_path / LOCK_FILE, (old, old))
    with StreamLock(tmp_path, "events", "mine"):
        assert read_lock(tmp_path).run_id == "mine"  # type: ignore[union-attr]


def test_no_temporary_file_is_left_behind(tmp_path: Path) -> None:
    with StreamLock(tmp_path, "events", "mine"):
        pass
    assert [p.name for p in tmp_path.iterdir()] == []
