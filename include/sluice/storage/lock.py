"""One writer per checkpoint: a lock file that a run holds for its whole length.

The lock is ``<checkpoint>/.sluice-lock.json``, published atomically: a private temporary (random name, created
exclusively, never through a link) is linked into place, which fails if a lock exists. It records the owner, the
run id and a heartbeat that the holder refreshes. The owner is the host and pid, and what makes that pid mean
something: the kernel's boot id, the identity of the pid namespace and the process's start time.

A lock is stale when its heartbeat is older than its expiry (the holder's, at most ``MAX_EXPIRY_SECONDS``), or
when its holder is provably gone. Only a reader in the same pid namespace of the same boot of the same host can
prove that: docker compose gives two containers the same hostname but each its own pids, and a pid is reused once
its process ends (hence the start time). A lock from anywhere else, or one without those fields (written by an
older version, or on a platform without ``/proc``), becomes stale by expiry only.

Whatever sits at the lock path is untrusted. It is opened without following links and without blocking; anything
but a regular file is refused with :class:`LockFileError` (a FIFO would hang a reader, a link would redirect a
write). The content is bounded and checked; content that does not parse counts as held by an unknown owner since
the file's last change.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import stat
import tempfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sluice.errors import SluiceError

log = logging.getLogger(__name__)

LOCK_FILE = ".sluice-lock.json"
DEFAULT_EXPIRY_SECONDS = 300
# A holder's expiry is honoured up to this: a lock file cannot keep a stream locked for longer after its last beat.
MAX_EXPIRY_SECONDS = 3600
HEARTBEAT_SECONDS = 30
# A heartbeat further ahead of the reader's clock than this is not believed; the file's last change is used.
MAX_CLOCK_SKEW_SECONDS = 60
MAX_LOCK_BYTES = 64 * 1024
_MAX_TEXT = 1024
_MAX_PID = 2**31 - 1


class LockHeld(SluiceError):
    """Another live run holds the stream's lock."""

    def __init__(self, stream: str, holder: LockInfo) -> None:
        self.holder = holder
        super().__init__(
            f"stream '{stream}' is locked by run {holder.run_id!r} on {holder.host} (pid {holder.pid}), heartbeat "
            f"{holder.age_seconds():.0f}s ago. Wait for it to finish; if it is dead, its lock expires after "
            f"{holder.expires_after_seconds}s"
        )


class LockFileError(SluiceError):
    """Something other than a regular file sits at the lock path: no run can take the lock until it is removed."""

    def __init__(self, path: Path, kind: str) -> None:
        self.path = path
        self.kind = kind
        super().__init__(
            f"the stream lock path {path} is a {kind}, not a regular file; Sluice refuses it (it only ever writes a "
            "regular file there). Find out how it got there, then remove it"
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
    # Where the pid means something (empty or 0 when unknown; then only the expiry can free the lock).
    boot_id: str = ""
    pid_namespace: str = ""
    process_start: int = 0

    def age_seconds(self, now: float | None = None) -> float:
        return (now or time.time()) - self.heartbeat_at

    def in_this_process_space(self) -> bool:
        """Whether this process sees the holder's pid: same host, same boot, same pid namespace, all known."""
        return (bool(self.boot_id) and bool(self.pid_namespace) and self.host == socket.gethostname()
                and self.boot_id == _boot_id() and self.pid_namespace == _pid_namespace())

    def is_stale(self, now: float | None = None) -> bool:
        if self.age_seconds(now) > min(self.expires_after_seconds, MAX_EXPIRY_SECONDS):
            return True
        return self.in_this_process_space() and not _holder_alive(self.pid, self.process_start)


def process_space() -> dict[str, str]:
    """This process's host, boot id and pid namespace, as a lock records them (empty when the platform cannot
    tell): a lock written with these fields and a dead pid is stale at once for a reader in this process space."""
    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid_namespace": _pid_namespace()}


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as source:
            return source.read(128).strip()
    except (OSError, ValueError):
        return ""


def _pid_namespace() -> str:
    try:
        namespace = os.stat("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{namespace.st_dev}:{namespace.st_ino}"


def _process_state(pid: int) -> tuple[str, int] | None:
    """Process ``pid``'s state letter and start time in clock ticks after boot (fields 3 and 22 of
    ``/proc/<pid>/stat``); None when ``/proc`` does not tell (no such process, no ``/proc``, or ``hidepid``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as source:
            raw = source.read(4096)
        # The command name (field 2) is in parentheses and may hold spaces and parentheses of its own.
        fields = raw[raw.rindex(b")") + 1:].split()
        return fields[0].decode("ascii"), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def process_start(pid: int) -> int | None:
    """Process ``pid``'s start time in clock ticks after boot, as a lock records it; None when unknown."""
    state = _process_state(pid)
    return state[1] if state else None


def _holder_alive(pid: int, process_start: int) -> bool:
    """Whether process ``pid`` of this pid namespace runs and is the process that took the lock, not a later one
    that was given the same pid."""
    state = _process_state(pid)
    if state is not None:
        letter, started = state
        # A zombie (Z, or X while it is reaped) has ended: only its exit status is left for its parent.
        return letter not in ("Z", "X") and (not process_start or started == process_start)
    try:  # /proc may hide other users' processes: the kernel still knows
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_path(checkpoint: str | os.PathLike[str]) -> Path:
    return Path(checkpoint) / LOCK_FILE


def read_lock(checkpoint: str | os.PathLike[str]) -> LockInfo | None:
    """The current lock, or None. Raises :class:`LockFileError` when the lock path is not a regular file."""
    return _read(lock_path(checkpoint))


_FILE_KINDS = ((stat.S_ISLNK, "symbolic link"), (stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
               (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))


def _kind(mode: int) -> str:
    return next((name for test, name in _FILE_KINDS if test(mode)), "special file")


def _read(path: Path) -> LockInfo | None:
    """A lock file's holder. An unreadable or invalid file counts as held by an unknown owner since its last
    change; anything but a regular file raises :class:`LockFileError`."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer. O_NOFOLLOW: a link fails (ELOOP) instead.
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:
        return _unreadable(path)
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise LockFileError(path, _kind(status.st_mode))
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_LOCK_BYTES:
            chunk = os.read(descriptor, MAX_LOCK_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return _unreadable(path)
    finally:
        os.close(descriptor)
    return _parse(b"".join(chunks), status.st_mtime)


def _unreadable(path: Path) -> LockInfo | None:
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError:
        return _unknown_owner(time.time())
    if not stat.S_ISREG(status.st_mode):
        raise LockFileError(path, _kind(status.st_mode))
    return _unknown_owner(min(status.st_mtime, time.time()))


def _unknown_owner(changed: float) -> LockInfo:
    return LockInfo(stream="?", run_id="?", host="?", pid=0, acquired_at=changed, heartbeat_at=changed)


def _parse(raw: bytes, modified: float) -> LockInfo:
    now = time.time()
    changed = min(modified, now)
    if len(raw) > MAX_LOCK_BYTES:
        return _unknown_owner(changed)
    try:
        return _validated(json.loads(raw.decode("utf-8")), changed, now)
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
        return _unknown_owner(changed)


def _validated(data: Any, changed: float, now: float) -> LockInfo:
    """The lock a file's JSON describes; ValueError, TypeError or KeyError when a field is missing, of the wrong
    type or out of range. Fields of later versions are ignored."""
    if not isinstance(data, dict):
        raise TypeError("a lock is a JSON object")

    def text(key: str, default: str | None = None) -> str:
        value = data.get(key, default)
        if not isinstance(value, str) or len(value) > _MAX_TEXT:
            raise ValueError(key)
        return value

    def integer(key: str, default: int | None, low: int, high: int | None = None) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            raise ValueError(key)
        return value

    def instant(key: str) -> float:
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise ValueError(key)
        return float(value)

    heartbeat_at = instant("heartbeat_at")
    if heartbeat_at > now + MAX_CLOCK_SKEW_SECONDS:
        heartbeat_at = changed
    return LockInfo(
        stream=text("stream"), run_id=text("run_id"), host=text("host"), pid=integer("pid", None, 1, _MAX_PID),
        acquired_at=min(instant("acquired_at"), heartbeat_at), heartbeat_at=heartbeat_at,
        expires_after_seconds=min(integer("expires_after_seconds", DEFAULT_EXPIRY_SECONDS, 1), MAX_EXPIRY_SECONDS),
        token=text("token", ""), boot_id=text("boot_id", ""), pid_namespace=text("pid_namespace", ""),
        process_start=integer("process_start", 0, 0),
    )


class HeldLock(ABC):
    """What every stream lock shares, whatever publishes it: its holder's identity and token, the heartbeat thread,
    how it is lost, and ``with lock: ...``."""

    def __init__(self, where: str, stream: str, run_id: str, *, expires_after_seconds: int = DEFAULT_EXPIRY_SECONDS,
                 heartbeat_seconds: float = HEARTBEAT_SECONDS):
        if isinstance(expires_after_seconds, bool) or not isinstance(expires_after_seconds, int) \
                or not 0 < expires_after_seconds <= MAX_EXPIRY_SECONDS:
            raise SluiceError(f"stream '{stream}': the lock's expires_after_seconds must be an integer from 1 to "
                              f"{MAX_EXPIRY_SECONDS}, not {expires_after_seconds!r}")
        if not 0 < heartbeat_seconds < expires_after_seconds:
            raise SluiceError(f"stream '{stream}': the lock's heartbeat_seconds must be above 0 and below its expiry "
                              f"({expires_after_seconds}s), not {heartbeat_seconds!r}")
        self.where = where
        self.stream = stream
        self.run_id = run_id
        self.expires_after_seconds = expires_after_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.token = uuid.uuid4().hex
        self.lost = False
        self._info: LockInfo | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @abstractmethod
    def acquire(self) -> None: ...

    @abstractmethod
    def _heartbeat(self) -> None: ...

    @abstractmethod
    def _release(self) -> None: ...

    def _start_heartbeat(self) -> None:
        self._thread = threading.Thread(target=self._heartbeat, name=f"sluice-lock-{self.stream}", daemon=True)
        self._thread.start()

    def _lose(self, why: str) -> None:
        self.lost = True
        log.error("stream %s: lost the lock %s: %s", self.stream, self.where, why)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._release()

    def __enter__(self) -> HeldLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class StreamLock(HeldLock):
    """Held for the length of one run: ``with StreamLock(checkpoint, stream, run_id): ...``."""

    def __init__(self, checkpoint: str | os.PathLike[str], stream: str, run_id: str, *,
                 expires_after_seconds: int = DEFAULT_EXPIRY_SECONDS, heartbeat_seconds: float = HEARTBEAT_SECONDS):
        self.path = lock_path(checkpoint)
        super().__init__(str(self.path), stream, run_id, expires_after_seconds=expires_after_seconds,
                         heartbeat_seconds=heartbeat_seconds)

    def _write_temporary(self, info: LockInfo) -> Path:
        """A new file beside the lock holding ``info``. Its name is random and it is created exclusively without
        following links (mode 0600), so that nothing planted in the folder can redirect the write."""
        descriptor, name = tempfile.mkstemp(prefix=f"{LOCK_FILE}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(descriptor, "wb") as temporary:
                temporary.write(json.dumps(asdict(info)).encode("utf-8"))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name)
            raise
        return Path(name)

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        now = time.time()
        pid = os.getpid()
        space = process_space()
        self._info = LockInfo(self.stream, self.run_id, space["host"], pid, now, now, self.expires_after_seconds,
                              self.token, boot_id=space["boot_id"], pid_namespace=space["pid_namespace"],
                              process_start=process_start(pid) or 0)
        temporary = self._write_temporary(self._info)
        try:
            for _ in range(5):
                try:
                    # link() publishes the complete file atomically and fails if a lock exists: no reader ever
                    # sees an empty or half-written lock.
                    os.link(temporary, self.path)
                except FileExistsError:
                    self._take_over_if_stale()
                    continue
                self._start_heartbeat()
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
        assert self._info is not None
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                # The new beat is written first, so that only the read and the rename are between the check and the
                # replace: a run that takes the lock over in that window is overwritten (a file system has no
                # compare-and-swap), and the window is kept as short as it can be.
                self._info.heartbeat_at = time.time()
                temporary = self._write_temporary(self._info)
                try:
                    current = _read(self.path)
                    if current is None or current.token != self.token:
                        self._lose("another run took it")
                        return
                    os.replace(temporary, self.path)
                finally:
                    temporary.unlink(missing_ok=True)
            except LockFileError as exc:
                self._lose(str(exc))
                return
            except OSError as exc:  # keep trying: a missed beat is harmless until the expiry
                log.warning("stream %s: lock heartbeat failed: %s", self.stream, exc)

    def _release(self) -> None:
        try:
            current = _read(self.path)
        except LockFileError as exc:
            log.error("stream %s: not releasing the lock: %s", self.stream, exc)
            return
        if current is not None and current.token == self.token:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
