"""Triggers that poll on the triggerer: a stream's lag, checked without a JVM until it is within its thresholds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class StreamLagTrigger(BaseTrigger):
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
    :param storage_conn_id: the Airflow connection with the object store's credentials (only its id is serialized).
        The trigger reads it on the triggerer and scopes it to its own checks: the triggerer's environment, which
        other triggers share, never holds it. Without the connection, the triggerer's own credentials are used.
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
        from sluice.paths import Roots

        return places(Roots(**self.roots), self.catalog, [self.stream])

    def _check(self, credentials: dict[str, str] | None) -> dict[str, Any]:
        from sluice.catalog import load_catalog
        from sluice.lag.observe import LagStatus
        from sluice.lag.store import check_against_history
        from sluice.paths import Roots
        from sluice.storage.credentials import scoped

        with scoped(credentials):
            report = check_against_history(load_catalog(self.catalog).get(self.stream), Roots(**self.roots))
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
