"""One writer per checkpoint: a lock file that a run holds for its whole length.

The lock is ``<checkpoint>/.sluice-lock.json``, created atomically (``O_CREAT | O_EXCL``). It records the owner
(host and pid), the run id and a heartbeat that the holder refreshes. A lock whose heartbeat is older than its
expiry, or whose owner process is gone from this host, is stale: the next run moves it aside and takes over.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from sluice.errors import SluiceError

log = logging.getLogger(__name__)

LOCK_FILE = ".sluice-lock.json"
DEFAULT_EXPIRY_SECONDS = 300
HEARTBEAT_SECONDS = 30


class LockHeld(SluiceError):
    """Another live run holds the stream's lock."""

    def __init__(self, stream: str, holder: LockInfo) -> None:
        self.holder = holder
        super().__init__(
            f"stream '{stream}' is locked by run {holder.run_id!r} on {holder.host} (pid {holder.pid}), heartbeat "
            f"{holder.age_seconds():.0f}s ago. Wait for it to finish; if it is dead, its lock expires after "
            f"{holder.expires_after_seconds}s"
        )


@dataclass
class LockInfo:
    stream: str
    run_id: str
    host: str
    pid: int
    acquired_at: float
    heartbeat_at: float
    expires_after_seconds: int = DEFAULT_EXPIRY_SECONDS
    # Unique per acquisition: an Airflow retry reuses the run id, and must not take over its own stuck attempt.
    token: str = ""

    def age_seconds(self, now: float | None = None) -> float:
        return (now or time.time()) - self.heartbeat_at

    def is_stale(self, now: float | None = None) -> bool:
        if self.age_seconds(now) > self.expires_after_seconds:
            return True
        if self.host == socket.gethostname():
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        return False


def lock_path(checkpoint: str | os.PathLike[str]) -> Path:
    return Path(checkpoint) / LOCK_FILE


def read_lock(checkpoint: str | os.PathLike[str]) -> LockInfo | None:
    """The current lock, or None."""
    return _read(lock_path(checkpoint))


def _read(path: Path) -> LockInfo | None:
    """A lock file's holder. An unreadable file counts as held by an unknown owner since its last change."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return LockInfo(**data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):
        try:
            changed = path.stat().st_mtime
        except FileNotFoundError:
            return None
        return LockInfo(stream="?", run_id="?", host="?", pid=0, acquired_at=changed, heartbeat_at=changed)


class StreamLock:
    """Held for the length of one run: ``with StreamLock(checkpoint, stream, run_id): ...``."""

    def __init__(self, checkpoint: str | os.PathLike[str], stream: str, run_id: str, *,
                 expires_after_seconds: int = DEFAULT_EXPIRY_SECONDS, heartbeat_seconds: float = HEARTBEAT_SECONDS):
        self.path = lock_path(checkpoint)
        self.stream = stream
        self.run_id = run_id
        self.expires_after_seconds = expires_after_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.token = uuid.uuid4().hex
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write_temporary(self, info: LockInfo) -> Path:
        temporary = self.path.with_name(f"{LOCK_FILE}.{self.token}.tmp")
        temporary.write_text(json.dumps(asdict(info)), encoding="utf-8")
        return temporary

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        now = time.time()
        info = LockInfo(self.stream, self.run_id, socket.gethostname(), os.getpid(), now, now,
                        self.expires_after_seconds, self.token)
        temporary = self._write_temporary(info)
        try:
            for _ in range(5):
                try:
                    # link() publishes the complete file atomically and fails if a lock exists: no reader ever
                    # sees an empty or half-written lock.
                    os.link(temporary, self.path)
                except FileExistsError:
                    self._take_over_if_stale()
                    continue
                self._thread = threading.Thread(target=self._heartbeat, name=f"sluice-lock-{self.stream}",
                                                daemon=True)
                self._thread.start()
                return
        finally:
            temporary.unlink(missing_ok=True)
        raise SluiceError(f"stream '{self.stream}': could not take the lock {self.path} after 5 attempts")

    def _take_over_if_stale(self) -> None:
        holder = _read(self.path)
        if holder is None:
            return  # released meanwhile: try again
        if not holder.is_stale():
            raise LockHeld(self.stream, holder)
        aside = self.path.with_name(f"{LOCK_FILE}.stale-{time.time_ns()}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        moved = _read(aside)
        if moved is not None and moved.token != holder.token and not moved.is_stale():
            # Another run replaced the stale lock between our read and our rename: give its lock back.
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)
            aside.unlink(missing_ok=True)
            raise LockHeld(self.stream, moved)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                current = _read(self.path)
                if current is None or current.token != self.token:
                    self.lost = True
                    log.error("stream %s: lost the lock %s to another run", self.stream, self.path)
                    return
                current.heartbeat_at = time.time()
                os.replace(self._write_temporary(current), self.path)
            except OSError as exc:  # keep trying: a missed beat is harmless until the expiry
                log.warning("stream %s: lock heartbeat failed: %s", self.stream, exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        current = _read(self.path)
        if current is not None and current.token == self.token:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def __enter__(self) -> StreamLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
