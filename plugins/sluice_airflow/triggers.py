"""Triggers that poll on the triggerer, without a JVM: a stream's lag until it is within its thresholds, and a
stream's source for new data (the watcher of its arrival Asset)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

if TYPE_CHECKING:
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


class StreamArrivalTrigger(_StoreAccess, BaseEventTrigger):
    """The watcher of a stream's arrival Asset (the catalog's ``arrival``): look at the stream's source every
    ``poll`` seconds for data its checkpoint has not processed (its lag probe: a landing folder's listing, a topic's
    end offsets, a table's versions; no JVM), and fire an event, which starts the stream's DAG, once new data has
    settled (:class:`sluice.lag.arrival.ArrivalWatch`). It never ends: the triggerer runs it for as long as the DAG
    is scheduled on the Asset.

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
        from sluice.lag.arrival import ArrivalWatch

        stream = load_catalog(self.catalog).get(self.stream)
        spec = stream.arrival
        queue_conn = getattr(getattr(stream.source, "notifications", None), "connection", None)
        if spec is None:
            raise SluiceError(f"stream {self.stream!r} has no arrival block in the catalog; nothing to watch")
        watch = ArrivalWatch(spec)
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
            await asyncio.sleep(watch.next_look_in(time.monotonic()))
