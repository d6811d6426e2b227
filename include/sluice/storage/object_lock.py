"""One writer per checkpoint on an object store: the lock of :mod:`sluice.storage.lock`, published with the store's
conditional writes instead of a link.

- **Take:** create ``<checkpoint>/.sluice-lock.json`` only if it is absent (S3 ``If-None-Match: *``, a GCS
  ``ifGenerationMatch=0``, an Azure ``If-None-Match: *``). Of two runs racing, exactly one create succeeds.
- **Heartbeat:** replace it only if it is still the version this run wrote (``If-Match: <etag>``, a generation
  match). A run that finds another version has lost the lock, and says so.
- **Take over:** a stale lock (same rules as on a disk: heartbeat older than its expiry, or a holder provably gone)
  is replaced only if it is still the version that was judged stale, so two runs cannot both take it over.
- **Release:** the holder deletes it, after checking that it is still its own.

A store that cannot make these writes conditional (a NotSupported answer), or that accepts a second create of the
same object (a gateway that ignores the precondition), is refused: one writer per checkpoint cannot be had there.
The check is made once per bucket and process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict

from sluice.errors import SluiceError
from sluice.storage.lock import (
    DEFAULT_EXPIRY_SECONDS,
    HEARTBEAT_SECONDS,
    LOCK_FILE,
    HeldLock,
    LockHeld,
    LockInfo,
    StreamLock,
    _parse,
    process_space,
    process_start,
    read_lock,
)
from sluice.storage.store import AlreadyExists, Changed, Folder, NoConditionalWrites, folder, is_local

log = logging.getLogger(__name__)

PROBE_FOLDER = "_sluice_probe"
_checked: set[str] = set()


def read_object_lock(checkpoint: Folder) -> LockInfo | None:
    """The current lock of a checkpoint on an object store, or None."""
    found = checkpoint.versioned(LOCK_FILE)
    if found is None:
        return None
    entry = checkpoint.stat(LOCK_FILE)
    return _parse(found[0], entry.modified if entry is not None else time.time())


def require_conditional_writes(checkpoint: Folder) -> None:
    """Refuse a store whose create-if-absent is not honoured: create a probe object twice; the second must fail."""
    root = checkpoint.uri.split("://", 1)[0] + "://" + checkpoint.uri.split("://", 1)[1].split("/", 1)[0]
    if root in _checked:
        return
    probe = checkpoint.child(PROBE_FOLDER)
    name = f"{uuid.uuid4().hex}.json"
    why = (f"{checkpoint.uri}: the store does not honour conditional writes (create-if-absent), so Sluice cannot keep "
           "one writer per checkpoint there. Use a store that does (AWS S3, GCS, Azure Blob/ADLS Gen2, MinIO, R2), "
           "or a local or mounted checkpoint root")
    try:
        probe.create(name, b"{}")
        try:
            probe.create(name, b"{}")
        except AlreadyExists:
            _checked.add(root)
            return
    except NoConditionalWrites as exc:
        raise NoConditionalWrites(f"{why} ({exc})") from exc
    finally:
        with contextlib.suppress(Exception):
            probe.delete(name)
    raise NoConditionalWrites(why)


class ObjectLock(HeldLock):
    """Held for the length of one run on a checkpoint on an object store."""

    def __init__(self, checkpoint: Folder, stream: str, run_id: str, *,
                 expires_after_seconds: int = DEFAULT_EXPIRY_SECONDS, heartbeat_seconds: float = HEARTBEAT_SECONDS):
        super().__init__(checkpoint.where(LOCK_FILE), stream, run_id, expires_after_seconds=expires_after_seconds,
                         heartbeat_seconds=heartbeat_seconds)
        self.checkpoint = checkpoint
        self._version = ""

    def _payload(self) -> bytes:
        assert self._info is not None
        return json.dumps(asdict(self._info)).encode("utf-8")

    def acquire(self) -> None:
        require_conditional_writes(self.checkpoint)
        now = time.time()
        space, pid = process_space(), os.getpid()
        # Where the holder is, so that a run in the same process space sees it is gone (a SIGKILL) at once, as on a
        # disk; anywhere else only the expiry frees the lock.
        self._info = LockInfo(self.stream, self.run_id, space["host"], pid, now, now, self.expires_after_seconds,
                              self.token, boot_id=space["boot_id"], pid_namespace=space["pid_namespace"],
                              process_start=process_start(pid) or 0)
        for _ in range(5):
            try:
                self._version = self.checkpoint.create(LOCK_FILE, self._payload())
            except AlreadyExists:
                if not self._take_over_if_stale():
                    continue
            self._start_heartbeat()
            return
        raise SluiceError(f"stream '{self.stream}': could not take the lock {self.where} after 5 attempts")

    def _take_over_if_stale(self) -> bool:
        """Replace a stale lock, only if it is still the version judged stale; False to try again."""
        found = self.checkpoint.versioned(LOCK_FILE)
        if found is None:
            return False  # released meanwhile
        data, version = found
        entry = self.checkpoint.stat(LOCK_FILE)
        holder = _parse(data, entry.modified if entry is not None else time.time())
        if not holder.is_stale():
            raise LockHeld(self.stream, holder)
        try:
            self._version = self.checkpoint.replace(LOCK_FILE, self._payload(), version)
        except Changed:
            return False  # another run took it over first: look again
        log.warning("stream %s: took over the stale lock of run %r (heartbeat %.0fs ago)", self.stream,
                    holder.run_id, holder.age_seconds())
        return True

    def _heartbeat(self) -> None:
        assert self._info is not None
        while not self._stop.wait(self.heartbeat_seconds):
            self._info.heartbeat_at = time.time()
            try:
                self._version = self.checkpoint.replace(LOCK_FILE, self._payload(), self._version)
            except Changed:
                # A beat whose reply was lost changed the version under us: the lock is still ours if it holds our
                # token, and then its version is adopted.
                mine = self._own_version()
                if mine is None:
                    self._lose("another run replaced it")
                    return
                self._version = mine
            except Exception as exc:  # keep trying: a missed beat is harmless until the expiry
                log.warning("stream %s: lock heartbeat failed: %s", self.stream, exc)

    def _own_version(self) -> str | None:
        """The lock's current version if it holds this run's token, else None."""
        found = self.checkpoint.versioned(LOCK_FILE)
        if found is None:
            return None
        entry = self.checkpoint.stat(LOCK_FILE)
        holder = _parse(found[0], entry.modified if entry is not None else time.time())
        return found[1] if holder.token == self.token else None

    def _release(self) -> None:
        if self._own_version() is not None:
            self.checkpoint.delete(LOCK_FILE)


def read_lock_at(checkpoint: str) -> LockInfo | None:
    """The current lock of a checkpoint on any store (local: :func:`sluice.storage.lock.read_lock`)."""
    if is_local(checkpoint):
        return read_lock(checkpoint.removeprefix("file://"))
    return read_object_lock(folder(checkpoint))


def lock_for(checkpoint: str, stream: str, run_id: str, **options: float) -> HeldLock:
    """The lock of a checkpoint on any store: a lock file published by link on a disk, by a conditional create on
    an object store."""
    if is_local(checkpoint):
        return StreamLock(checkpoint.removeprefix("file://"), stream, run_id, **options)  # type: ignore[arg-type]
    return ObjectLock(folder(checkpoint), stream, run_id, **options)  # type: ignore[arg-type]


@contextlib.contextmanager
def waiting_lock(checkpoint: str, stream: str, run_id: str, wait_seconds: float) -> Iterator[HeldLock]:
    """The lock of a checkpoint on any store, waiting up to ``wait_seconds`` for a running stream to release it;
    :class:`LockHeld` when it does not."""
    deadline = time.monotonic() + wait_seconds
    while True:
        lock = lock_for(checkpoint, stream, run_id)
        try:
            lock.acquire()
        except LockHeld:
            if time.monotonic() >= deadline:
                raise
            time.sleep(min(5.0, max(deadline - time.monotonic(), 0.1)))
            continue
        try:
            yield lock
        finally:
            lock.release()
        return
