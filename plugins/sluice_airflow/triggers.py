"""Triggers that poll on the triggerer, without a JVM: a stream's lag until it is within its thresholds, and a
stream's source for new data (the watcher of its arrival Asset)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

if TYPE_CHECKING:
    from pathlib import Path

    from sluice.lag.arrival import ArrivalWatch
    from sluice.paths import Roots


class _StoreAccess:
    """What a trigger that reads a stream's places needs: its roots, and the object store's credentials read from
    ``storage_conn_id`` on the triggerer and scoped to this trigger's own checks. The triggerer's environment,
    which other triggers share, never holds them; without the connection, the triggerer's own are used."""

    stream: str
    catalog: str | None
    storage_conn_id: str | None
    log: Any

    def _roots(self) -> Roots:
        raise NotImplementedError

    async def _credentials(self) -> dict[str, str] | None:
        """The connection's credentials, read again for each check (a session token expires during a long wait),
        each secret masked before anything is logged; None (the triggerer's own) without a connection."""
        from airflow.sdk.log import mask_secret

        from sluice.connections.storage import aconnection_environment, secrets_of
        from sluice.errors import SluiceError
        from sluice.storage.store import is_local

        if self.storage_conn_id is None or all(is_local(place) for place in await asyncio.to_thread(self._places)):
            return None
        try:
            env = await aconnection_environment(self.storage_conn_id)
        except SluiceError as exc:  # a connection of another type: say so, as the worker's check does
            raise SluiceError(f"connection {self.storage_conn_id!r}: {exc}") from None
        if env is None:
            self.log.info("No connection %r: the object store is reached with the triggerer's credentials",
                          self.storage_conn_id)
            return None
        for secret in secrets_of(env):
            mask_secret(secret)
        return env

    def _places(self) -> list[str]:
        from sluice.operations.gate import places

        return places(self._roots(), self.catalog, [self.stream])


class StreamLagTrigger(_StoreAccess, BaseTrigger):
    """Check a stream's lag every ``poke_interval`` seconds; fire once it is at ``max_status`` or better
    (``{"status": "success", "report": ...}``), or after a last check at ``deadline`` (``{"status": "timeout"}``).

    The check reads files, the checkpoint and Delta metadata; it runs in a thread so the triggerer's event loop
    never blocks on it.

    :param stream: catalog stream name
    :param catalog: catalog path; None for ``SLUICE_CATALOG`` or the bundled catalog
    :param roots: the deployment roots, ``{"landing": ..., "lake": ..., "checkpoints": ...}``
    :param max_status: the worst lag status that counts as caught up (OK, WARN, STALLED, CRITICAL)
    :param poke_interval: seconds between checks
    :param deadline: when to give up, in seconds since the epoch; None to wait for the deferral timeout
    :param storage_conn_id: the Airflow connection with the object store's credentials (only its id is serialized;
        see :class:`_StoreAccess`)
    """

    def __init__(self, *, stream: str, catalog: str | None, roots: dict[str, str], max_status: str = "OK",
                 poke_interval: float = 60.0, deadline: float | None = None,
                 storage_conn_id: str | None = None) -> None:
        super().__init__()
        self.stream = stream
        self.catalog = catalog
        self.roots = roots
        self.max_status = max_status
        self.poke_interval = poke_interval
        self.deadline = deadline
        self.storage_conn_id = storage_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "stream": self.stream, "catalog": self.catalog, "roots": dict(self.roots),
            "max_status": self.max_status, "poke_interval": self.poke_interval, "deadline": self.deadline,
            "storage_conn_id": self.storage_conn_id})

    def _roots(self) -> Roots:
        from sluice.paths import Roots

        return Roots(**self.roots)

    def _check(self, credentials: dict[str, str] | None) -> dict[str, Any]:
        from sluice.catalog import load_catalog
        from sluice.lag.observe import LagStatus
        from sluice.lag.store import check_against_history
        from sluice.storage.credentials import scoped

        with scoped(credentials):
            report = check_against_history(load_catalog(self.catalog).get(self.stream), self._roots())
        caught_up = report.status.rank <= LagStatus(self.max_status).rank
        return {"caught_up": caught_up, "report": report.to_dict(), "describe": report.describe()}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        checks = 0
        while True:
            result = await asyncio.to_thread(self._check, await self._credentials())
            checks += 1
            if result["caught_up"]:
                yield TriggerEvent({"status": "success", "checks": checks, "report": result["report"]})
                return
            wait = self.poke_interval
            if self.deadline is not None:
                left = self.deadline - time.time()
                if left <= 0:
                    yield TriggerEvent({"status": "timeout", "checks": checks, "report": result["report"]})
                    return
                wait = min(wait, left)  # the last check falls on the deadline
            self.log.info("%s; checking again in %.0fs", result["describe"], wait)
            await asyncio.sleep(wait)


class _FolderChanges:
    """What the OS says of a local landing folder (inotify, through ``watchfiles``): the watcher waits for a change
    or its next look, whichever comes first, so a file is looked at when it lands rather than up to a ``poll``
    later. The looks stay: they are what decides, and they catch what no event tells (a folder made after the
    watch began, a file system without notifications). The watch holds one thread of the triggerer."""

    def __init__(self, folder: Path, log: Any) -> None:
        self.folder, self.log = folder, log
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failed = False
        self._woken = 0.0

    # A folder that changes all the time (a file uploaded in many writes) is looked at this often at most.
    MIN_GAP_SECONDS = 0.2

    async def wait(self, seconds: float) -> None:
        """Until the folder changes, at most ``seconds``."""
        if self._task is None and not self._failed and self.folder.is_dir():
            self._task = asyncio.create_task(self._watch())
        if self._task is None or self._task.done():
            self._task = None
            await asyncio.sleep(seconds)
            return
        until = time.monotonic() + seconds
        gap = min(self._woken + self.MIN_GAP_SECONDS, until) - time.monotonic()
        if gap > 0:
            await asyncio.sleep(gap)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout=max(until - time.monotonic(), 0.0))
        if self.changed.is_set():
            self._woken = time.monotonic()
        self.changed.clear()

    async def _watch(self) -> None:
        try:
            from watchfiles import awatch

            async for _ in awatch(self.folder, watch_filter=None, step=20, recursive=True):
                self.changed.set()
        except FileNotFoundError:
            pass  # the folder went away: watched again once it is back
        except (ImportError, OSError, RuntimeError) as exc:  # no inotify here, or out of watches: the looks go on
            self._failed = True
            self.log.warning("Cannot watch %s for changes (%s); looking at it every poll only", self.folder, exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class StreamArrivalTrigger(_StoreAccess, BaseEventTrigger):
    """The watcher of a stream's arrival Asset (the catalog's ``arrival``): look at the stream's source every
    ``poll`` seconds for data its checkpoint has not processed (its lag probe: a landing folder's listing, a topic's
    end offsets, a table's versions; no JVM), and fire an event, which starts the stream's DAG, once new data has
    settled (:class:`sluice.lag.arrival.ArrivalWatch`). It never ends: the triggerer runs it for as long as the DAG
    is scheduled on the Asset. A local landing folder is also looked at as soon as it changes (:class:`_FolderChanges`).

    The roots and the catalog are the triggerer's (``SLUICE_*``, ``SLUICE_CATALOG``), as the run's are the
    worker's: nothing of the deployment is frozen into the serialized DAG.

    :param stream: catalog stream name
    :param storage_conn_id: the object store's credentials, read on the triggerer and kept to this trigger's checks
    """

    def __init__(self, *, stream: str, storage_conn_id: str | None = None) -> None:
        super().__init__()
        self.stream = stream
        self.catalog = None
        self.storage_conn_id = storage_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"stream": self.stream, "storage_conn_id": self.storage_conn_id})

    def _roots(self) -> Roots:
        from sluice.paths import Roots

        return Roots.from_env()

    def _look(self, credentials: dict[str, str] | None, queue: dict[str, str] | None = None) -> frozenset[str]:
        from sluice.catalog import load_catalog
        from sluice.lag.arrival import unread
        from sluice.storage.credentials import scoped

        with scoped(credentials):
            return unread(load_catalog(self.catalog).get(self.stream), self._roots(), queue_credentials=queue)

    async def _queue_credentials(self, conn_id: str | None) -> dict[str, str] | None:
        """The ``AWS_*`` of the notification queue's own connection (``source.notifications.connection``), read
        again for each look as the store's are, masked; None without one (the store's credentials serve)."""
        from airflow.sdk.log import mask_secret

        from sluice.connections.storage import aconnection_environment, secrets_of
        from sluice.errors import SluiceError

        if conn_id is None:
            return None
        env = await aconnection_environment(conn_id)
        if env is None:
            raise SluiceError(f"connection {conn_id!r} (source.notifications.connection) is not defined")
        for secret in secrets_of(env):
            mask_secret(secret)
        return {name: value for name, value in env.items() if name.startswith("AWS_")}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from sluice.catalog import load_catalog
        from sluice.errors import SluiceError
        from sluice.lag.arrival import ArrivalWatch, local_folder

        stream = load_catalog(self.catalog).get(self.stream)
        spec = stream.arrival
        queue_conn = getattr(getattr(stream.source, "notifications", None), "connection", None)
        if spec is None:
            raise SluiceError(f"stream {self.stream!r} has no arrival block in the catalog; nothing to watch")
        watch = ArrivalWatch(spec)
        folder = local_folder(stream, self._roots())
        changes = _FolderChanges(folder, self.log) if folder is not None else None
        try:
            async for event in self._watched(watch, changes, queue_conn):
                yield event
        finally:
            if changes is not None:
                await changes.close()

    async def _watched(self, watch: ArrivalWatch, changes: _FolderChanges | None,
                       queue_conn: str | None) -> AsyncIterator[TriggerEvent]:
        from sluice.errors import SluiceError

        spec = watch.spec
        while True:
            try:
                unread_now = await asyncio.to_thread(self._look, await self._credentials(),
                                                     await self._queue_credentials(queue_conn))
            except (SluiceError, OSError) as exc:  # a store that is briefly away: look again, as a listing would
                self.log.warning("Cannot look at stream %s's source: %s; looking again in %ss", self.stream, exc,
                                 spec.poll_seconds)
                await asyncio.sleep(spec.poll_seconds)
                continue
            now = time.monotonic()
            arrival = watch.look(unread_now, now)
            if arrival is not None:
                self.log.info("Stream %s: %d new unread item(s) (e.g. %s); starting a run", self.stream, arrival.new,
                              ", ".join(arrival.examples))
                yield TriggerEvent({"stream": self.stream, "new": arrival.new,
                                    "waited_seconds": round(arrival.waited_seconds, 1),
                                    "examples": list(arrival.examples)})
            wait = watch.next_look_in(time.monotonic())
            await (changes.wait(wait) if changes is not None else asyncio.sleep(wait))
