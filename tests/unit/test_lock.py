from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from sluice.errors import SluiceError
from sluice.storage.lock import (
    DEFAULT_EXPIRY_SECONDS,
    LOCK_FILE,
    MAX_EXPIRY_SECONDS,
    LockFileError,
    LockHeld,
    StreamLock,
    process_space,
    read_lock,
)


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


def write_lock(folder: Path, **fields: object) -> Path:
    path = folder / LOCK_FILE
    now = time.time()
    path.write_text(json.dumps({"stream": "events", "run_id": "other", "host": "elsewhere", "pid": 1,
                                "acquired_at": now, "heartbeat_at": now, "expires_after_seconds": 300} | fields))
    return path


def a_pid_that_does_not_run_here() -> int:
    pid = 2**22 + 7
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid += 1


def test_a_live_holder_in_another_pid_namespace_of_this_host_holds_the_lock_until_expiry(tmp_path: Path) -> None:
    # docker compose pins the hostname: another container has the same host name but pids of its own.
    space = process_space()
    path = write_lock(tmp_path, run_id="other-container", host=socket.gethostname(), pid=a_pid_that_does_not_run_here(),
                      boot_id=space["boot_id"], pid_namespace="4:4026532999", process_start=12345)
    with pytest.raises(LockHeld, match="locked by run 'other-container'"):
        StreamLock(tmp_path, "events", "mine").acquire()
    holder = read_lock(tmp_path)
    assert holder is not None and not holder.is_stale() and holder.is_stale(time.time() + 301)

    long_ago = time.time() - 301
    path.write_text(json.dumps(json.loads(path.read_text()) | {"heartbeat_at": long_ago, "acquired_at": long_ago}))
    with StreamLock(tmp_path, "events", "mine"):
        assert read_lock(tmp_path).run_id == "mine"  # type: ignore[union-attr]


@pytest.mark.skipif(not process_space()["pid_namespace"], reason="needs /proc (Linux)")
def test_a_dead_holder_in_this_pid_namespace_is_stale_at_once(tmp_path: Path) -> None:
    write_lock(tmp_path, run_id="ghost", pid=a_pid_that_does_not_run_here(), **process_space())
    with StreamLock(tmp_path, "events", "mine"):
        assert read_lock(tmp_path).run_id == "mine"  # type: ignore[union-attr]


@pytest.mark.skipif(not process_space()["pid_namespace"], reason="needs /proc (Linux)")
def test_a_recycled_pid_is_not_taken_for_the_holder(tmp_path: Path) -> None:
    # This process runs, but it is not the one that took the lock: it started at another time.
    write_lock(tmp_path, run_id="ghost", pid=os.getpid(), process_start=1, **process_space())
    with StreamLock(tmp_path, "events", "mine"):
        assert read_lock(tmp_path).run_id == "mine"  # type: ignore[union-attr]


def test_a_lock_records_where_its_pid_means_something(tmp_path: Path) -> None:
    with StreamLock(tmp_path, "events", "mine"):
        holder = read_lock(tmp_path)
        assert holder is not None
        assert (holder.host, holder.boot_id, holder.pid_namespace) == tuple(process_space().values())
        if holder.pid_namespace:
            assert holder.process_start > 0 and not holder.is_stale()


def test_a_lock_of_an_older_version_on_this_host_expires_only(tmp_path: Path) -> None:
    # Without the pid namespace, the pid may belong to another container: only the heartbeat can tell.
    write_lock(tmp_path, run_id="old-version", host=socket.gethostname(), pid=a_pid_that_does_not_run_here())
    with pytest.raises(LockHeld, match="locked by run 'old-version'"):
        StreamLock(tmp_path, "events", "mine").acquire()


def run_with_timeout(call, seconds: float = 10):  # type: ignore[no-untyped-def]
    """call()'s result or exception, or None if it did not return in time (a hang fails the test, not the run)."""
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    return outcome[0] if outcome else None


def test_a_fifo_at_the_lock_path_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / LOCK_FILE
    os.mkfifo(fifo)
    try:
        for call in (lambda: read_lock(tmp_path), lambda: StreamLock(tmp_path, "events", "mine").acquire()):
            outcome = run_with_timeout(call)
            assert isinstance(outcome, LockFileError), f"expected a LockFileError, got {outcome!r}"
            assert str(fifo) in str(outcome) and "is a FIFO" in str(outcome)
    finally:  # release a reader that blocked on the FIFO
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "left in place for a human to look at"


def test_a_lock_cannot_claim_an_expiry_beyond_the_maximum(tmp_path: Path) -> None:
    old = time.time() - MAX_EXPIRY_SECONDS - 10
    write_lock(tmp_path, run_id="forever", acquired_at=old, heartbeat_at=old, expires_after_seconds=10**12)
    holder = read_lock(tmp_path)
    assert holder is not None and holder.expires_after_seconds == MAX_EXPIRY_SECONDS and holder.is_stale()
    with StreamLock(tmp_path, "events", "mine"):
        assert read_lock(tmp_path).run_id == "mine"  # type: ignore[union-attr]


def test_a_heartbeat_far_in_the_future_counts_from_the_files_last_change(tmp_path: Path) -> None:
    path = write_lock(tmp_path, run_id="future", heartbeat_at=1e12)
    holder = read_lock(tmp_path)
    assert holder is not None and holder.heartbeat_at <= time.time() and not holder.is_stale()
    old = time.time() - 3600
    os.utime(path, (old, old))
    with StreamLock(tmp_path, "events", "mine"):
        assert read_lock(tmp_path).run_id == "mine"  # type: ignore[union-attr]


@pytest.mark.parametrize("fields", [
    {"pid": -1}, {"pid": "1"}, {"pid": True}, {"expires_after_seconds": 0}, {"expires_after_seconds": "300"},
    {"heartbeat_at": "now"}, {"heartbeat_at": float("nan")}, {"heartbeat_at": 10**400}, {"run_id": None},
    {"host": "x" * 100_000},
])
def test_a_lock_with_bad_fields_is_held_by_an_unknown_owner_until_it_expires(tmp_path: Path,
                                                                             fields: dict[str, object]) -> None:
    path = write_lock(tmp_path, **fields)
    holder = read_lock(tmp_path)
    assert holder is not None and holder.run_id == "?" and holder.expires_after_seconds == DEFAULT_EXPIRY_SECONDS
    with pytest.raises(LockHeld, match="locked by run '\\?'"):
        StreamLock(tmp_path, "events", "mine").acquire()
    old = time.time() - DEFAULT_EXPIRY_SECONDS - 10
    os.utime(path, (old, old))
    with StreamLock(tmp_path, "events", "mine"):
        assert read_lock(tmp_path).run_id == "mine"  # type: ignore[union-attr]


def test_a_huge_lock_file_is_not_read_whole(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_bytes(b" " * (64 << 20))
    holder = read_lock(tmp_path)
    assert holder is not None and holder.run_id == "?"


def test_a_symlink_at_the_heartbeats_temporary_name_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path.parent / f"{tmp_path.name}-victim"
    victim.write_text("precious")
    lock = StreamLock(tmp_path, "events", "beating", heartbeat_seconds=0.05)
    lock.acquire()
    try:
        # Anyone who can read the lock learns its token; the old heartbeat wrote '<lock>.<token>.tmp'.
        token = read_lock(tmp_path).token  # type: ignore[union-attr]
        (tmp_path / f"{LOCK_FILE}.{token}.tmp").symlink_to(victim)
        first = read_lock(tmp_path).heartbeat_at  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while (read_lock(tmp_path).heartbeat_at - first) < 0.2:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no heartbeat"
            time.sleep(0.01)
        assert not lock.lost
    finally:
        lock.release()
    assert victim.read_text() == "precious"
    assert not (tmp_path / LOCK_FILE).exists()


def test_temporaries_are_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    modes: list[int] = []
    real_link = os.link

    def spying_link(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        modes.append(stat.S_IMODE(os.lstat(source).st_mode))
        real_link(source, target)

    monkeypatch.setattr(os, "link", spying_link)
    with StreamLock(tmp_path, "events", "mine"):
        pass
    assert modes == [0o600]


def test_a_symlink_at_the_lock_path_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere.json"
    long_ago = time.time() - 3600
    content = json.dumps({"stream": "events", "run_id": "old", "host": "elsewhere", "pid": 1,
                          "acquired_at": long_ago, "heartbeat_at": long_ago})
    elsewhere.write_text(content)
    (tmp_path / LOCK_FILE).symlink_to(elsewhere)
    with pytest.raises(LockFileError, match="is a symbolic link"):
        read_lock(tmp_path)
    with pytest.raises(LockFileError, match="is a symbolic link"):
        StreamLock(tmp_path, "events", "mine").acquire()
    assert (tmp_path / LOCK_FILE).is_symlink() and elsewhere.read_text() == content


def test_a_folder_at_the_lock_path_is_refused(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).mkdir()
    with pytest.raises(LockFileError, match="is a directory"):
        StreamLock(tmp_path, "events", "mine").acquire()


@pytest.mark.parametrize(("expiry", "heartbeat"), [(0, 1), (MAX_EXPIRY_SECONDS + 1, 30), (300.0, 30), (True, 0.5),
                                                   (300, 0), (300, 300), (300, float("nan"))])
def test_bad_lock_arguments_are_refused(tmp_path: Path, expiry: int, heartbeat: float) -> None:
    with pytest.raises(SluiceError, match=r"expires_after_seconds|heartbeat_seconds"):
        StreamLock(tmp_path, "events", "mine", expires_after_seconds=expiry, heartbeat_seconds=heartbeat)


def test_the_health_check_reports_a_fifo_at_the_lock_path_without_hanging(tmp_path: Path) -> None:
    from sluice.catalog import load_catalog
    from sluice.operations.health import Health, check_stream
    from tests.helpers import events_stream, roots_in, write_catalog

    stream = load_catalog(write_catalog(tmp_path, events_stream())).get("events")
    roots = roots_in(tmp_path)
    checkpoint = Path(stream.checkpoint_path(roots))
    checkpoint.mkdir(parents=True)
    os.mkfifo(checkpoint / LOCK_FILE)
    try:
        report = run_with_timeout(lambda: check_stream(stream, roots))
    finally:
        with contextlib.suppress(OSError):
            os.close(os.open(checkpoint / LOCK_FILE, os.O_WRONLY | os.O_NONBLOCK))
    assert report is not None, "the health check hung on the FIFO"
    assert not isinstance(report, BaseException), report
    assert report.status is Health.FAIL and "LOCKED" in report.codes  # type: ignore[attr-defined]
    [finding] = [f for f in report.findings if f.code == "LOCKED"]  # type: ignore[attr-defined]
    assert "is a FIFO" in finding.message and finding.evidence["kind"] == "FIFO"
    assert not report.waits_for_a_run, "nothing clears a FIFO but a person"  # type: ignore[attr-defined]


def test_the_health_check_waits_only_for_a_run_that_holds_the_lock(tmp_path: Path) -> None:
    from sluice.catalog import load_catalog
    from sluice.operations.health import check_stream
    from tests.helpers import events_stream, roots_in, write_catalog

    stream = load_catalog(write_catalog(tmp_path, events_stream())).get("events")
    roots = roots_in(tmp_path)
    checkpoint = Path(stream.checkpoint_path(roots))
    checkpoint.mkdir(parents=True)
    with StreamLock(checkpoint, "events", "backfill/events/manual__1"):
        held = check_stream(stream, roots)
    assert "LOCKED" in held.codes and held.waits_for_a_run
    assert not check_stream(stream, roots).waits_for_a_run, "released: nothing to wait for"


@pytest.mark.skipif(not process_space()["pid_namespace"], reason="needs /proc (Linux)")
def test_a_holder_that_ended_but_was_not_reaped_yet_is_dead(tmp_path: Path) -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while (Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z":
            assert time.monotonic() < deadline, "the child did not end"
            time.sleep(0.01)
        write_lock(tmp_path, run_id="zombie", pid=child.pid, **process_space())
        with StreamLock(tmp_path, "events", "mine"):
            assert read_lock(tmp_path).run_id == "mine"  # type: ignore[union-attr]
    finally:
        child.wait()
