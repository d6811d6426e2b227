"""A backfill: its params validated and planned without Spark, then run as a bounded Spark job."""

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
    from sluice.operations.backfill import BackfillRequest


def _backfill_request(context: Context, catalog: Catalog) -> BackfillRequest:
    """The DAG run's params as a validated backfill request; a refusal fails the task without retries."""
    from sluice.operations.backfill import BackfillError, parse_request

    try:
        return parse_request(dict(context["params"]), catalog, run_id=str(context["run_id"]))
    except BackfillError as exc:
        raise AirflowFailException(f"backfill refused, nothing was read or written: {exc}") from None


class BackfillPlanOperator(SluiceOperator):
    """Validate the DAG run's backfill params and plan the backfill without Spark: the files it would read, the
    files left to the live stream, and the rows ``replace`` would swap out. The plan is the XCom return value.
    Takes the :class:`SluiceOperator` arguments, which must be those of the backfill that follows.
    """

    ui_color = "#e8dff5"

    def execute(self, context: Context) -> dict[str, Any]:
        from sluice.errors import SluiceError, printable
        from sluice.operations.backfill import plan_backfill

        catalog = self.stream_catalog()
        request = _backfill_request(context, catalog)
        try:
            plan = plan_backfill(request, catalog.get(request.stream), self.resolved_roots())
        except SluiceError as exc:  # what the landing zone or the checkpoint holds: a retry finds the same
            raise AirflowFailException(f"backfill refused, nothing was read or written: {printable(str(exc))}") \
                from None
        result = plan.to_dict(sample=100)
        self.log.info("Backfill of %s from %s to %s (%s, by %s): %d file(s), %d bytes; %d left to the live stream; "
                      "%d already held; %d row(s) to replace", request.stream, request.start, request.end,
                      request.mode, request.select_by, result["file_count"], result["file_bytes"],
                      plan.pending_files, plan.held_files, plan.rows_to_replace)
        if plan.versions is not None:  # a Delta source's range
            for version in plan.versions["versions"]:
                self.log.info("Upstream version %(version)s committed %(committed_at)s: %(files)s file(s), "
                              "%(bytes)s bytes, %(records)s record(s)", version)
        if plan.offsets is not None:  # a Kafka source's range
            for key, counts in plan.offsets["partitions"].items():
                self.log.info("Partition %s: offsets %s to %s, %s offset(s), %s to read", key, counts["first"],
                              counts["last"], counts["offsets"], counts["to_read"])
        for note in plan.notes:
            self.log.info("%s", note)
        return result


class BackfillOperator(SparkAppOperator):
    """Run the DAG run's backfill (its params, validated again) as a bounded availableNow Spark job with its own
    checkpoint, under the live stream's lock. The summary (rows read, written, replaced and dead-lettered, Delta
    versions, duration) is the XCom return value. Takes the :class:`SparkAppOperator` arguments.
    """

    ui_color = "#d9c8f0"
    _stream: str | None = None

    def secret_env(self) -> dict[str, str]:
        """The object store's credentials, and those of the connections the backfilled stream's kinds need (a
        Kafka source's brokers): read here, in the worker at run time, never on the command line."""
        from sluice_airflow.hooks import StreamConnectionsHook

        env = super().secret_env()
        if self._stream is not None:
            env.update(StreamConnectionsHook(self.stream_catalog().select([self._stream])).environment())
        return env

    def execute(self, context: Context) -> dict[str, Any]:
        request = _backfill_request(context, self.stream_catalog())
        self._stream = request.stream
        with tempfile.TemporaryDirectory(prefix="sluice-backfill-") as folder:
            summary_file = Path(folder) / "summary.json"
            args = [*option_args({"catalog": self.catalog_path()}), *request.to_args(),
                    *self.resolved_roots().as_args(), *option_args({"summary-file": summary_file}),
                    *self.engine_args()]
            failure = self.submit("backfill_runner.py", args, name=f"sluice-backfill-{request.stream}")
            summary = self._hook.backfill_result(summary_file) if self._hook is not None else None
        if summary is None:
            raise AirflowException(f"backfill of {request.stream} produced no summary: {failure}")
        self.log.info("Backfill summary: %s", json.dumps(summary, sort_keys=True))
        if failure is not None or summary.get("status") != RunStatus.SUCCEEDED:
            context["ti"].xcom_push(key="failed_summary", value=summary)
            message = f"backfill of {request.stream} failed: {summary.get('error') or failure}"
            if not summary.get("retryable", True):
                raise AirflowFailException(message)
            raise AirflowException(message)
        return dict(summary)
