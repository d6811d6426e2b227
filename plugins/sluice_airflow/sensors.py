"""Sensors: wait until a stream has caught up with its source."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf
from airflow.sdk.exceptions import AirflowSensorTimeout

from sluice.connections.storage import DEFAULT_CONNECTION as STORAGE_CONNECTION
from sluice.operations.gate import places, resolve_roots
from sluice_airflow.hooks import StorageConnectionHook
from sluice_airflow.triggers import StreamLagTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

    from sluice.lag.observe import LagReport

LAG_STATUSES = ("OK", "WARN", "STALLED", "CRITICAL")


class StreamLagSensor(BaseSensorOperator):
    """Succeed once a stream's lag status is ``max_status`` or better, for example before a job that needs the
    stream's table to be fresh. The lag is computed from the source and the checkpoint (``sluice.lag``), no JVM.

    Deferrable in the standard way: it checks once in the worker, then defers to :class:`StreamLagTrigger`,
    which polls on the triggerer. When ``timeout`` passes first, the task fails, or is skipped with
    ``soft_fail=True``. The XCom value is the last lag report.

    :param stream: catalog stream name (templated)
    :param max_status: the worst status that counts as caught up: OK (default), WARN, STALLED or CRITICAL
    :param catalog: catalog path; default ``SLUICE_CATALOG`` or the bundled catalog (templated)
    :param deferrable: wait on the triggerer instead of in a worker slot
    :param landing_root: as for the other Sluice operators (templated)
    :param lake_root: (templated)
    :param checkpoint_root: (templated)
    :param storage_conn_id: the object store's credentials, as for the other Sluice operators; the triggerer reads
        the connection itself and keeps it to this sensor's checks
    """

    template_fields: Sequence[str] = ("stream", "catalog", "landing_root", "lake_root", "checkpoint_root")
    ui_color = "#dceefb"

    def __init__(self, *, stream: str, max_status: str = "OK", catalog: str | None = None,
                 deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 landing_root: str | None = None, lake_root: str | None = None, checkpoint_root: str | None = None,
                 storage_conn_id: str = STORAGE_CONNECTION, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if max_status not in LAG_STATUSES:
            raise ValueError(f"max_status: expected one of {', '.join(LAG_STATUSES)}, got {max_status!r}")
        self.stream = stream
        self.max_status = max_status
        self.catalog = catalog
        self.deferrable = deferrable
        self.landing_root = landing_root
        self.lake_root = lake_root
        self.checkpoint_root = checkpoint_root
        self.storage_conn_id = storage_conn_id

    def _report(self) -> LagReport:
        from sluice.catalog import load_catalog
        from sluice.lag.store import check_against_history

        roots = resolve_roots(self.landing_root, self.lake_root, self.checkpoint_root)
        os.environ.update(StorageConnectionHook(self.storage_conn_id).environment(
            places(roots, self.catalog, [self.stream])))
        return check_against_history(load_catalog(self.catalog).get(self.stream), roots)

    def _caught_up(self, report: LagReport) -> bool:
        from sluice.lag.observe import LagStatus

        return report.status.rank <= LagStatus(self.max_status).rank

    def poke(self, context: Context) -> PokeReturnValue:
        report = self._report()
        self.log.info("%s", report.describe())
        return PokeReturnValue(is_done=self._caught_up(report), xcom_value=report.to_dict())

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        report = self._report()
        if self._caught_up(report):
            self.log.info("%s", report.describe())
            return report.to_dict()
        self.log.info("%s; deferring to the triggerer", report.describe())
        roots = resolve_roots(self.landing_root, self.lake_root, self.checkpoint_root)
        self.defer(
            trigger=StreamLagTrigger(stream=self.stream, catalog=self.catalog,
                                     roots={"landing": roots.landing, "lake": roots.lake,
                                            "checkpoints": roots.checkpoints},
                                     max_status=self.max_status, poke_interval=self.poke_interval,
                                     deadline=time.time() + self.timeout, storage_conn_id=self.storage_conn_id),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        from sluice.lag.observe import LagReport

        report = LagReport.from_dict(event["report"])
        if event["status"] != "success":
            raise AirflowSensorTimeout(f"{report.describe()} after {self.timeout:.0f}s (waited for "
                                       f"{self.max_status} or better)")
        self.log.info("%s (after %s check(s) on the triggerer)", report.describe(), event.get("checks"))
        return {**event["report"], "checks_on_triggerer": event.get("checks")}
