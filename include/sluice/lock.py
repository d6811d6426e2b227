"""One writer per checkpoint: a lock file that a run holds for its whole length.

The lock is ``<checkpoint>/.sluice-lock.json``, created atomically (``O_CREAT | O_EXCL``). It records the owner
(host and pid), the run id and a heartbeat that the holder refreshes. A lock whose heartbeat is older than its
expiry, or whose owner process is gone from this host, is stale: the next run moves it aside and takes over.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sluice.errors import SluiceError

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
    """The current lock, or None. An unreadable lock file counts as a lock with an unknown, stale holder."""
    path = lock_path(checkpoint)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return LockInfo(**data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):
        return LockInfo(stream="?", run_id="?", host="?", pid=0, acquired_at=0.0, heartbeat_at=0.0)


class StreamLock:
    """Held for the length of one run: ``with StreamLock(checkpoint, stream, run_id): ...``."""

    def __init__(self, checkpoint: str | os.PathLike[str], stream: str, run_id: str, *,
                 expires_after_seconds: int = DEFAULT_EXPIRY_SECONDS, heartbeat_seconds: float = HEARTBEAT_SECONDS):
        self.path = lock_path(checkpoint)
        self.stream = stream
        self.run_id = run_id
        self.expires_after_seconds = expires_after_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _info(self, acquired_at: float) -> LockInfo:
        return LockInfo(self.stream, self.run_id, socket.gethostname(), os.getpid(), acquired_at, time.time(),
                        self.expires_after_seconds)

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                handle = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = read_lock(self.path.parent)
                if holder is None:
                    continue  # released between our open and our read
                if not holder.is_stale():
                    raise LockHeld(self.stream, holder) from None
                # Move the stale lock aside atomically; if another run got there first, try again.
                with contextlib.suppress(FileNotFoundError):
                    os.rename(self.path, self.path.with_name(f"{LOCK_FILE}.stale-{int(time.time() * 1000)}"))
                continue
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(asdict(self._info(time.time())), out)
            self._thread = threading.Thread(target=self._heartbeat, name=f"sluice-lock-{self.stream}", daemon=True)
            self._thread.start()
            return
        raise SluiceError(f"stream '{self.stream}': could not take the lock {self.path} after 3 attempts")

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            current = read_lock(self.path.parent)
            if current is None or current.run_id != self.run_id:
                return  # taken over after we looked stale: the new holder owns the file now
            current.heartbeat_at = time.time()
            temporary = self.path.with_name(f"{LOCK_FILE}.{os.getpid()}.tmp")
            temporary.write_text(json.dumps(asdict(current)), encoding="utf-8")
            os.replace(temporary, self.path)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        current = read_lock(self.path.parent)
        if current is not None and current.run_id == self.run_id:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def __enter__(self) -> StreamLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
