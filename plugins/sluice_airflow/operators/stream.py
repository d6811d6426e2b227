"""The stream run: one or more catalog streams to the end of their available input, in one Spark application."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from sluice.arguments import option_args
from sluice.connections.storage import DEFAULT_CONNECTION as STORAGE_CONNECTION
from sluice.constants import RunStatus
from sluice.operations.gate import DEFAULT_LOCK_WAIT_SECONDS
from sluice.warm import CONNECTION_ID as WARM_CONNECTION
from sluice_airflow.operators.base import DEFAULT_SPARK_CONN_ID, SparkAppOperator, gate_failure

if TYPE_CHECKING:
    from airflow.sdk import Context

    from sluice.summary import RunSummary
    from sluice.warm import WarmAddress
    from sluice_airflow.hooks import WarmServerHook


class StreamRunOperator(SparkAppOperator):
    """Run one or more catalog streams to the end of their available input in one Spark application.

    The task log holds the driver log; the run summary (batches, rows in, rows out, dead-letter rows, Delta
    versions, query ids) is the task's XCom return value. The task fails when Spark fails or any stream fails,
    and killing the task stops the Spark application. Takes the :class:`SparkAppOperator` arguments.

    In warm mode (the connection ``warm_conn_id`` is defined) the run goes to the deployment's warm server instead
    (:mod:`sluice.warm`): the task log holds the runner's log lines (Spark's own log stays in the server's), the
    summary is the same, and killing the task closes the connection, which stops the run. A task that sets
    ``conf``, ``env_vars``, ``spark_submit_kwargs`` or ``application`` runs cold: only an application of its own
    can take them.

    :param streams: catalog stream names (templated)
    :param health_gates: stream name -> the task id of its health check in this DAG. A stream whose check did not
        succeed (no report in XCom) is left out of the run, and the task fails after the others ran, naming it.
    :param check_health: check each stream's checkpoint in this task, before Spark starts, instead of in a task of
        its own (the catalog's ``health_gate: inline``): a stream whose check FAILs is left out the same way, and
        the reports are the XCom ``health_reports`` (stream name -> report). Every try checks again; a stream left
        out only because another run still holds its lock after the wait, or because its check raised, fails the
        task with a retry.
    :param health_fail_on_warn: with ``check_health``, a WARN leaves the stream out too
    :param lock_wait_seconds: with ``check_health``, how long the check waits for another run to release a stream's
        lock
    :param warm_conn_id: Airflow connection of the deployment's warm server (warm mode: host, port, the token as
        password). When it is defined the run goes to that server instead of spark-submit; see :mod:`sluice.warm`.
    """

    template_fields: Sequence[str] = ("streams", *SparkAppOperator.template_fields)
    ui_color = "#d7ecfb"

    def __init__(self, *, streams: list[str], health_gates: dict[str, str] | None = None, check_health: bool = False,
                 health_fail_on_warn: bool = False, lock_wait_seconds: float = DEFAULT_LOCK_WAIT_SECONDS,
                 warm_conn_id: str = WARM_CONNECTION, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if check_health and health_gates:
            raise ValueError("a run checks its streams' health itself (check_health) or after their gates "
                             "(health_gates), not both")
        self.streams = streams
        self.health_gates = health_gates
        self.check_health = check_health
        self.health_fail_on_warn = health_fail_on_warn
        self.lock_wait_seconds = lock_wait_seconds
        self._retry_left_out = False  # a stream left out by this try's own check may run at the next try
        self.warm_conn_id = warm_conn_id
        self._warm: WarmServerHook | None = None

    @property
    def warm_hook(self) -> WarmServerHook:
        from sluice_airflow.hooks import WarmServerHook

        if self._warm is None:
            self._warm = WarmServerHook(self.warm_conn_id)
        return self._warm

    def execute(self, context: Context) -> dict[str, Any]:
        self._require_streams()
        stopped = self._gated(context)
        run_id = self.task_run_id(context)
        warm = self.warm_target()
        summary: RunSummary | None
        failure: AirflowException | None = None
        if warm is not None:
            summary = self.run_warm(warm, run_id)
        else:
            summary, failure = self.run_cold(run_id)
        if summary is None:
            raise AirflowException(f"Spark run of {self.streams} produced no run summary: {failure}")
        result = self._reported(context, summary, failure)
        if stopped:
            context["ti"].xcom_push(key="return_value", value=result)
            where = "this task's health_reports" if self.check_health else "its task's report"
            raise gate_failure(f"ran {', '.join(self.streams)}; left out {', '.join(stopped)}, whose checkpoint health "
                               f"gate failed (see {where})", retry=self._retry_left_out)
        return result

    def run_cold(self, run_id: str) -> tuple[RunSummary | None, AirflowException | None]:
        """The run through spark-submit: its summary (None when it left none) and the provider's failure."""
        with tempfile.TemporaryDirectory(prefix="sluice-run-") as folder:
            summary_file = str(Path(folder) / "summary.json")
            failure = self.submit("stream_runner.py", self.application_args(run_id=run_id, summary_file=summary_file),
                                  name=f"sluice-{'-'.join(self.streams)}")
            return (self._hook.stream_summary(summary_file) if self._hook is not None else None), failure

    def run_warm(self, address: WarmAddress, run_id: str) -> RunSummary:
        """The run on the warm server: its log lines into the task log; killing the task closes the connection,
        and the server stops the run. The server holds its own credentials: this task sends none."""
        catalog = self.stream_catalog()
        if any(stream.connections for stream in catalog.select(list(self.streams))) or self.storage_environment():
            self.log.info("Warm mode: the warm server reaches the streams' connections and object storage with the "
                          "credentials it was started with, not this task's connections")
        self.log.info("Running %s on the warm server at %s", ", ".join(self.streams), address)
        return self.warm_hook.run(address, list(self.streams), catalog=self.catalog_path(),
                                  roots=self.resolved_roots(), run_id=run_id, engine=self.engine or None,
                                  on_log=self.log.info)

    def warm_target(self) -> WarmAddress | None:
        """The warm server this run goes to: None (a cold run) without the ``warm_conn_id`` connection, or when the
        task sets what only a Spark application of its own can take (its Spark settings, another Spark or storage
        connection)."""
        warm = self.warm_hook.address()
        own = [name for name in ("conf", "env_vars", "spark_submit_kwargs", "application") if getattr(self, name)]
        own += [name for name, default in (("conn_id", DEFAULT_SPARK_CONN_ID), ("storage_conn_id", STORAGE_CONNECTION))
                if getattr(self, name) != default]
        if warm is not None and own:
            self.log.info("This task sets %s, which only a Spark application of its own can take: it runs cold, "
                          "not on the warm server at %s", ", ".join(own), warm)
            return None
        return warm

    def on_kill(self) -> None:
        self.warm_hook.close()
        super().on_kill()

    def _reported(self, context: Context, summary: RunSummary, failure: AirflowException | None) -> dict[str, Any]:
        """The summary logged stream by stream, as the XCom value; a failed run fails the task, without retries
        when no failed stream can be fixed by one."""
        for stream in summary.streams:
            versions = (f"Iceberg snapshot {stream.snapshot_id_before} -> {stream.snapshot_id_after}"
                        if stream.snapshot_id_after is not None
                        else f"Delta v{stream.delta_version_before} -> v{stream.delta_version_after}")
            self.log.info(
                "Stream %s %s: %d batches, %d rows in, %d rows out, %d dead-letter rows, %s, %.1fs",
                stream.stream, stream.status, stream.batches, stream.input_rows, stream.output_rows,
                stream.dead_letter_rows, versions, stream.duration_seconds,
            )
        result: dict[str, Any] = json.loads(summary.to_json())
        if failure is None and summary.ok:
            return result
        context["ti"].xcom_push(key="failed_summary", value=result)
        failed = [s for s in summary.streams if s.status != RunStatus.SUCCEEDED]
        errors = "; ".join(f"{s.stream}: {s.error}" for s in failed)
        if failed and not any(s.retryable for s in failed):
            raise AirflowFailException(f"Stream run failed, and a retry cannot fix it: {errors}")
        raise AirflowException(f"Stream run failed: {errors or failure}")

    def secret_env(self) -> dict[str, str]:
        """The object store's credentials and those of every connection the streams' kinds need
        (:class:`StreamConnectionsHook`). Read here, in the worker at run time (never while the DAG file is parsed),
        and masked in the task log."""
        from sluice_airflow.hooks import StreamConnectionsHook

        streams = self.stream_catalog().select(list(self.streams))
        return {**super().secret_env(), **StreamConnectionsHook(streams).environment()}

    def small_run(self) -> bool:
        from sluice.constants import DeltaEngine
        from sluice.operations.jvm import brings_jars, small_run

        try:
            streams = self.stream_catalog().select(list(self.streams))
            engine = DeltaEngine(self.engine) if self.engine else None
        except Exception:  # refused with its reason by what reads them next (secret_env, the runner)
            return False
        own_jars = brings_jars(self.conf, self.spark_submit_kwargs)
        return small_run(streams, self.resolved_roots(), engine=engine, own_jars=own_jars)

    def _require_streams(self) -> None:
        if not isinstance(self.streams, list) or not self.streams \
                or not all(isinstance(name, str) and name for name in self.streams):
            raise AirflowException(f"streams must be a non-empty list of stream names, got {self.streams!r}")

    def application_args(self, *, run_id: str, summary_file: str) -> list[str]:
        self._require_streams()
        return [*option_args({"catalog": self.catalog_path()}), *(f"--stream={name}" for name in self.streams),
                *self.resolved_roots().as_args(), *option_args({"run-id": run_id, "summary-file": summary_file}),
                *self.engine_args()]

    def _gated(self, context: Context) -> list[str]:
        """Leave out of this run the streams whose health gate did not pass (their gate tasks', or this task's own
        check with ``check_health``, :func:`sluice.operations.gate.check_streams`), and log them; the streams left
        out. Every stream's report of this task's own check is the XCom ``health_reports``."""
        from sluice.operations.gate import check_streams

        if self.check_health:
            gate = check_streams(self.stream_catalog().select(list(self.streams)), self.resolved_roots(),
                                 fail_on_warn=self.health_fail_on_warn, lock_wait_seconds=self.lock_wait_seconds,
                                 log=self.log)
            context["ti"].xcom_push(key="health_reports", value=gate.reports)
            stopped, self._retry_left_out = gate.stopped, gate.retry
            if len(stopped) == len(self.streams):
                raise gate_failure("\n".join(gate.refusals), retry=self._retry_left_out)
        elif self.health_gates:
            stopped = self._failed_gates(context)
        else:
            return []
        self.streams = [name for name in self.streams if name not in stopped]
        return stopped

    def _failed_gates(self, context: Context) -> list[str]:
        """The streams whose gate task in this DAG did not succeed (no report in XCom)."""
        assert self.health_gates is not None
        stopped = [name for name in self.streams
                   if name in self.health_gates and context["ti"].xcom_pull(task_ids=self.health_gates[name]) is None]
        for name in stopped:
            self.log.warning("Stream %s is left out of this run: its health gate %s did not pass", name,
                             self.health_gates[name])
        if len(stopped) == len(self.streams):
            raise AirflowFailException(f"no stream ran: every health gate failed ({', '.join(stopped)})")
        return stopped
