"""A stream's checkpoint: its health gate before a run, and an explicit repair."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from sluice.operations.gate import DEFAULT_LOCK_WAIT_SECONDS
from sluice_airflow.operators.base import SluiceOperator, gate_failure

if TYPE_CHECKING:
    from airflow.sdk import Context


class CheckpointHealthCheckOperator(SluiceOperator):
    """Check a stream's checkpoint before its run: FAIL stops the DAG run before Spark starts, WARN logs.

    The checks read plain files and Delta metadata; no JVM starts (:func:`sluice.operations.gate.checked_health`).
    The report is the task's XCom return value. A FAIL fails the task without retries, unless its only cause is
    another run holding the stream's lock (a backfill, the nightly maintenance): the task waits for that run to end,
    up to ``lock_wait_seconds``, and then retries. Takes the :class:`SluiceOperator` arguments.

    :param stream: catalog stream name (templated)
    :param fail_on_warn: treat WARN as FAIL
    :param lock_wait_seconds: how long to wait for another run to release the stream's lock before failing
    """

    template_fields: Sequence[str] = ("stream", *SluiceOperator.template_fields)
    ui_color = "#fdf2d0"

    def __init__(self, *, stream: str, fail_on_warn: bool = False,
                 lock_wait_seconds: float = DEFAULT_LOCK_WAIT_SECONDS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.fail_on_warn = fail_on_warn
        self.lock_wait_seconds = lock_wait_seconds

    def execute(self, context: Context) -> dict[str, Any]:
        from sluice.operations.gate import checked_health

        report, stops = checked_health(self.stream_catalog().get(self.stream), self.resolved_roots(),
                                       fail_on_warn=self.fail_on_warn,
                                       lock_deadline=time.monotonic() + self.lock_wait_seconds, log=self.log)
        result = report.to_dict()
        if stops:
            context["ti"].xcom_push(key="health_report", value=result)
            raise gate_failure(report.describe(), retry=report.waits_for_a_run)
        return result


class CheckpointRepairOperator(SluiceOperator):
    """Run one explicit repair action on a stream's checkpoint (see ``sluice.operations.repair``): history, backup,
    quarantine-offsets, repin-query-id or reset. Each changing action backs up what it changes beside the checkpoint
    and refuses while a run holds the stream's lock. The action's record is the task's XCom return value. Takes the
    :class:`SluiceOperator` arguments.

    :param stream: catalog stream name (templated)
    :param action: repair action name (templated)
    :param confirm: must render to true for an action that changes something (templated)
    :param version: for ``reset``, the sink table's Delta version to resume after (templated)
    """

    template_fields: Sequence[str] = ("stream", "action", "confirm", "version", *SluiceOperator.template_fields)
    ui_color = "#f9d5d3"

    def __init__(self, *, stream: str, action: str, confirm: bool | str = False, version: int | str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.action = action
        self.confirm = confirm
        self.version = version

    def _version(self) -> int | None:
        text = str(self.version).strip() if self.version is not None else ""
        if text in {"", "None", "null"}:
            return None
        try:
            return int(text)
        except ValueError:
            raise AirflowFailException(f"version: expected a Delta version number, got {self.version!r}") from None

    def execute(self, context: Context) -> dict[str, Any]:
        from sluice.errors import SluiceError
        from sluice.operations.repair import READ_ONLY_ACTIONS, run_and_log

        if self.action not in READ_ONLY_ACTIONS and str(self.confirm).strip().lower() not in {"true", "1", "yes"}:
            raise AirflowFailException("confirm: set it to true to run a repair; nothing was changed")
        try:
            result = run_and_log(self.action, self.stream_catalog().get(self.stream), self.resolved_roots(),
                                 run_id=self.task_run_id(context), version=self._version())
        except SluiceError as exc:
            raise AirflowFailException(f"repair refused, nothing was changed: {exc}") from exc
        self.log.info("Repair %s of stream %s: %s", self.action, self.stream, json.dumps(result, default=str))
        return result
