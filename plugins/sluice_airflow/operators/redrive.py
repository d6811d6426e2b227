"""A redrive: its params validated and its selection counted without Spark, then run as one Spark job."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from sluice.arguments import option_args
from sluice.constants import RunStatus
from sluice_airflow.operators.base import SluiceOperator, SparkAppOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from sluice.catalog import Catalog
    from sluice.operations.redrive import RedriveRequest

REFUSED = "redrive refused, nothing was read or written"


def _redrive_request(context: Context, catalog: Catalog) -> RedriveRequest:
    """The DAG run's params as a validated redrive request; a refusal fails the task without retries."""
    from sluice.operations.redrive import RedriveError, parse_request

    try:
        return parse_request(dict(context["params"]), catalog, run_id=str(context["run_id"]))
    except RedriveError as exc:
        raise AirflowFailException(f"{REFUSED}: {exc}") from None


class RedrivePlanOperator(SluiceOperator):
    """Validate the DAG run's redrive params and count the dead letters they select, per reason, without Spark.
    The plan is the XCom return value. Takes the :class:`SluiceOperator` arguments."""

    ui_color = "#f5e0df"

    def execute(self, context: Context) -> dict[str, Any]:
        from sluice.operations.redrive import plan_redrive

        catalog = self.stream_catalog()
        request = _redrive_request(context, catalog)
        plan = plan_redrive(request, catalog.get(request.stream), self.resolved_roots())
        self.log.info("Redrive of %s: %d dead letter(s) selected at version %s of the dead-letter table",
                      request.stream, plan.rows, plan.dead_letter_version)
        for reason in plan.reasons:
            self.log.info("%6d  %s", reason["rows"], reason["reason"])
        return plan.to_dict()


class RedriveOperator(SparkAppOperator):
    """Run the DAG run's redrive (its params, validated again) as one Spark job under the live stream's lock. The
    summary (selected, landed, still dead, dropped, Delta versions) is the XCom return value. An Airflow retry keeps
    the run id, so it finishes an interrupted redrive instead of starting another."""

    ui_color = "#efc9c6"

    def execute(self, context: Context) -> dict[str, Any]:
        request = _redrive_request(context, self.stream_catalog())
        with tempfile.TemporaryDirectory(prefix="sluice-redrive-") as folder:
            summary_file = Path(folder) / "summary.json"
            args = [*option_args({"catalog": self.catalog_path()}), *request.to_args(),
                    *self.resolved_roots().as_args(), *option_args({"summary-file": summary_file}),
                    *self.engine_args()]
            failure = self.submit("redrive_runner.py", args, name=f"sluice-redrive-{request.stream}")
            summary = self._hook.backfill_result(summary_file) if self._hook is not None else None
        if summary is None:
            raise AirflowException(f"redrive of {request.stream} produced no summary: {failure}")
        self.log.info("Redrive summary: %s", json.dumps(summary, sort_keys=True))
        if failure is not None or summary.get("status") != RunStatus.SUCCEEDED:
            message = f"redrive of {request.stream} failed: {summary.get('error') or failure}"
            if not summary.get("retryable", True):
                raise AirflowFailException(message)
            raise AirflowException(message)
        return dict(summary)
