"""Sluice's operators: stream runs and backfills through spark-submit, checkpoint health checks and repairs."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from sluice.arguments import option_args
from sluice.catalog import DEFAULT_CATALOG
from sluice.connections.storage import DEFAULT_CONNECTION as STORAGE_CONNECTION
from sluice.constants import RunStatus
from sluice.paths import Roots
from sluice.warm import CONNECTION_ID as WARM_CONNECTION

if TYPE_CHECKING:
    from airflow.sdk import Context

    from sluice.catalog import Catalog
    from sluice.model.stream import StreamSpec
    from sluice.operations.backfill import BackfillRequest
    from sluice.operations.health import HealthReport
    from sluice.summary import RunSummary
    from sluice.warm import WarmAddress
    from sluice_airflow.hooks import SluiceSparkSubmitHook

DEFAULT_SPARK_CONN_ID = "sluice_spark"
#: How long a health gate waits for another run (a backfill, the maintenance) to release the stream's lock.
DEFAULT_LOCK_WAIT_SECONDS = 600
LOCK_POLL_SECONDS = 5.0


def gate_failure(message: str, *, retry: bool) -> AirflowException:
    """The error of a health gate that stops a run: retried when what stopped it may clear by itself (another run's
    lock, still held after the wait; a check that raised), final otherwise (a checkpoint that needs a repair)."""
    return AirflowException(message) if retry else AirflowFailException(message)


def resolve_roots(landing: str | None, lake: str | None, checkpoints: str | None) -> Roots:
    """Roots given to an operator, each falling back to the worker's ``SLUICE_*`` environment."""
    defaults = Roots.from_env()
    return Roots(landing=landing or defaults.landing, lake=lake or defaults.lake,
                 checkpoints=checkpoints or defaults.checkpoints)


def places(roots: Roots, catalog: str | None, streams: Sequence[str] | None = None) -> list[str]:
    """The roots, and every place the catalog's streams (or ``streams`` of them) read or write under them; the roots
    alone when the catalog does not load (the task's own check of it says why)."""
    from sluice.catalog import load_catalog
    from sluice.errors import SluiceError

    found = [roots.landing, roots.lake, roots.checkpoints]
    try:
        loaded = load_catalog(catalog)
        selected = loaded.select(list(streams)) if streams else list(loaded)
    except (SluiceError, OSError):
        return found
    return found + [place for stream in selected for place in stream.locations(roots)]


def storage_environment(where: Iterable[str], conn_id: str, log: Any) -> dict[str, str]:
    """The object store's credentials from the Airflow connection ``conn_id``, as the environment its readers take;
    empty when every place in ``where`` is local or the connection is not defined. Each secret is registered with
    Airflow's masker before anything is logged."""
    from airflow.sdk.log import mask_secret

    from sluice.connections.storage import connection_environment, described, secrets_of
    from sluice.errors import SluiceError
    from sluice.storage.store import is_local

    if all(is_local(place) for place in where):
        return {}
    try:
        env = connection_environment(conn_id)
    except SluiceError as exc:
        raise AirflowFailException(f"connection {conn_id!r}: {exc}") from None
    if env is None:
        log.info("No connection %r: the object store is reached with this machine's credentials", conn_id)
        return {}
    for secret in secrets_of(env):
        mask_secret(secret)
    log.info("Object storage through connection %r: %s", conn_id, described(env))
    return env


def warm_address(conn_id: str) -> WarmAddress | None:
    """The warm server of this deployment: the Airflow connection ``conn_id`` (host, port, and the token as its
    password), read in the worker at run time; None (a cold run through spark-submit) when it is not defined."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    from sluice.errors import SluiceError
    from sluice.warm import DEFAULT_PORT, WarmAddress, require_token

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:  # any other error (the API server, a secrets backend) fails the task
        return None
    try:
        return WarmAddress(host=str(conn.host or "127.0.0.1"), port=int(conn.port or DEFAULT_PORT),
                           token=require_token(conn.password, where=f"connection {conn_id!r}: password"))
    except SluiceError as exc:
        raise AirflowFailException(str(exc)) from None


class SluiceOperator(BaseOperator):
    """Base of every Sluice operator: the catalog and the three roots, templated, the same for all of them, so that a
    backfill's plan, its run, a health check and a repair of one DAG run all see the same deployment.

    :param catalog: path of the stream catalog; default ``SLUICE_CATALOG`` or the bundled catalog (templated)
    :param landing_root: root of relative source paths; default from the ``SLUICE_*`` environment (templated)
    :param lake_root: root of relative Delta table paths (templated)
    :param checkpoint_root: root of relative checkpoint paths (templated)
    :param storage_conn_id: Airflow connection (aws, wasb/adls or google_cloud_platform) with the credentials of
        roots on object storage; when it is not defined, the machine's own credentials are used
    """

    template_fields: Sequence[str] = ("catalog", "landing_root", "lake_root", "checkpoint_root")

    def __init__(self, *, catalog: str | None = None, landing_root: str | None = None, lake_root: str | None = None,
                 checkpoint_root: str | None = None, storage_conn_id: str = STORAGE_CONNECTION, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.catalog = catalog
        self.landing_root = landing_root
        self.lake_root = lake_root
        self.checkpoint_root = checkpoint_root
        self.storage_conn_id = storage_conn_id
        self._storage_env: dict[str, str] | None = None

    def storage_environment(self) -> dict[str, str]:
        """The object store's credentials from ``storage_conn_id``, as the environment its readers take; empty when
        every root is local or the connection is not defined. Read in the worker at run time; each secret is
        registered with Airflow's masker before anything is logged."""
        if self._storage_env is None:
            self._storage_env = storage_environment(
                places(self.resolved_roots(), self.catalog_path(), self.stream_names()), self.storage_conn_id, self.log)
        return self._storage_env

    def resolved_roots(self) -> Roots:
        return resolve_roots(self.landing_root, self.lake_root, self.checkpoint_root)

    def stream_names(self) -> list[str] | None:
        """The streams this task reads or writes; None for every stream of the catalog (a backfill's stream is a
        param of its run)."""
        streams = getattr(self, "streams", None)
        stream = getattr(self, "stream", None)
        return list(streams) if streams else [stream] if isinstance(stream, str) else None

    def catalog_path(self) -> str:
        return self.catalog or os.environ.get("SLUICE_CATALOG") or str(DEFAULT_CATALOG)

    def stream_catalog(self) -> Catalog:
        """The catalog, checked against this task's roots (:meth:`Catalog.check_roots`): a refusal fails the task
        without retries, before anything is read or written."""
        from sluice.catalog import load_catalog
        from sluice.errors import CatalogError

        try:
            catalog = load_catalog(self.catalog_path())
            catalog.check_roots(self.resolved_roots())
        except CatalogError as exc:
            raise AirflowFailException(f"catalog refused: {exc}") from None
        # The checks this task makes itself (health, lag, planning) read the store with these credentials too.
        os.environ.update(self.storage_environment())
        return catalog

    def checked_health(self, stream: StreamSpec, *, fail_on_warn: bool = False,
                       lock_deadline: float = 0.0) -> tuple[HealthReport, bool]:
        """Check a stream's checkpoint, logging every finding and the checkpoint's facts: the report, and whether it
        stops the stream's run (FAIL, or WARN with ``fail_on_warn``). Reads plain files and Delta metadata only.

        While the only FAIL is a live run's lock (a backfill, the nightly maintenance), the check is made again every
        few seconds until ``lock_deadline`` (``time.monotonic()``): the lock clears when that run ends."""
        from sluice.operations.health import Health, check_stream

        report = check_stream(stream, self.resolved_roots())
        if report.waits_for_a_run and time.monotonic() < lock_deadline:
            self.log.info("%s: another run holds the stream's lock; checking again until it ends, for up to %.0f s",
                          stream.name, lock_deadline - time.monotonic())
        while report.waits_for_a_run and time.monotonic() < lock_deadline:
            time.sleep(min(LOCK_POLL_SECONDS, max(lock_deadline - time.monotonic(), 0.0)))
            report = check_stream(stream, self.resolved_roots())
        for finding in report.findings:
            log = self.log.warning if finding.severity is not Health.OK else self.log.info
            log("%s: [%s] %s: %s %s", stream.name, finding.severity.value, finding.code.value, finding.message,
                finding.evidence or "")
        self.log.info("Checkpoint facts of %s: %s", stream.name, json.dumps(report.facts, default=str))
        return report, report.status is Health.FAIL or (fail_on_warn and report.status is Health.WARN)


class SparkAppOperator(SluiceOperator):
    """Base of the operators that spark-submit a Sluice application through :class:`SluiceSparkSubmitHook`: the
    connection (``local[*]`` when it is not defined), the project's interpreter for the driver and the workers, and
    killing the whole process tree on kill. Takes the :class:`SluiceOperator` arguments.

    :param conn_id: Airflow Spark connection; when it is not defined the run uses ``local[*]``
    :param engine: override every stream's Delta engine: ``auto``, ``jvm`` or ``rs``
    :param conf: extra Spark configuration (templated)
    :param env_vars: extra environment for spark-submit (templated)
    :param spark_submit_kwargs: further ``SparkSubmitHook`` arguments (jars, packages, executor sizes, ...)
    """

    template_fields: Sequence[str] = (*SluiceOperator.template_fields, "conf", "env_vars")
    template_fields_renderers = {"conf": "json", "env_vars": "json"}

    def __init__(
        self,
        *,
        conn_id: str = DEFAULT_SPARK_CONN_ID,
        engine: str | None = None,
        conf: dict[str, Any] | None = None,
        env_vars: dict[str, str] | None = None,
        application: str | None = None,
        spark_submit_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.engine = engine
        self.conf = conf
        self.env_vars = env_vars
        self.application = application
        self.spark_submit_kwargs = spark_submit_kwargs
        self._hook: SluiceSparkSubmitHook | None = None

    def engine_args(self) -> list[str]:
        return option_args({"engine": self.engine or None})

    def spark_env(self) -> dict[str, str]:
        """The project's interpreter for the driver and the Python workers, and its bin folder for spark-submit."""
        interpreter_bin = str(Path(sys.executable).parent)
        env = {
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable),
            "PATH": os.pathsep.join([interpreter_bin, os.environ.get("PATH", "")]),
        }
        env.update(self.env_vars or {})
        return env

    def secret_env(self) -> dict[str, str]:
        """Environment for spark-submit that holds secrets: it never reaches the command line, a log or XCom. The
        object store's credentials, for the driver and (through its environment) the executors."""
        return dict(self.storage_environment())

    def small_run(self) -> bool:
        """Whether the driver's JVM may take the light JIT (:func:`sluice.operations.jvm.small_run`); a backfill's
        run is not small."""
        return False

    def submit(self, script: str, args: list[str], *, name: str) -> AirflowException | None:
        """spark-submit a Sluice runner, its driver's JVM started for a short run (:mod:`sluice.operations.jvm`);
        the provider's failure, if any, is returned for the caller to weigh against the summary."""
        from sluice.operations.jvm import driver_java_options, submit_env
        from sluice_airflow.hooks import SluiceSparkSubmitHook

        options = driver_java_options(small=self.small_run())
        self.log.info("Driver JVM options of this run: %s", " ".join(options) or "none")
        # The process's environment only (as secrets are): env_vars would become --conf arguments on YARN and
        # Kubernetes masters, and the driver runs here in client mode.
        self._hook = SluiceSparkSubmitHook(conn_id=self.conn_id, application_args=args, env_vars=self.spark_env(),
                                           secret_env={**self.secret_env(),
                                                       **submit_env(options, {**os.environ, **self.spark_env()})},
                                           conf=self.conf,
                                           name=name, **dict(self.spark_submit_kwargs or {}))
        return self._hook.run_app(script, application=self.application)

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.on_kill()


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
        self._warm_connection: socket.socket | None = None
        self._killed = False

    def run_warm(self, address: WarmAddress, run_id: str) -> RunSummary:
        """The run on the warm server: its log lines into the task log; killing the task closes the connection,
        and the server stops the run. The server holds its own credentials: this task sends none."""
        from sluice.warm import WarmRefused, WarmServerGone, run

        catalog = self.stream_catalog()
        if any(stream.connections for stream in catalog.select(list(self.streams))) or self.storage_environment():
            self.log.info("Warm mode: the warm server reads Kafka and object storage with the credentials it was "
                          "started with, not this task's connections")
        self.log.info("Running %s on the warm server at %s", ", ".join(self.streams), address)
        try:
            return run(address, list(self.streams), catalog=self.catalog_path(), roots=self.resolved_roots(),
                       run_id=run_id, engine=self.engine or None, on_log=self.log.info,
                       on_connected=self._keep_connection)
        except WarmRefused as exc:
            raise AirflowFailException(str(exc)) from None
        except WarmServerGone as exc:
            raise AirflowException(str(exc)) from None

    def warm_target(self) -> WarmAddress | None:
        """The warm server this run goes to: None (a cold run) without the ``warm_conn_id`` connection, or when the
        task sets what only a Spark application of its own can take (its Spark settings, another Spark or storage
        connection)."""
        warm = warm_address(self.warm_conn_id)
        own = [name for name in ("conf", "env_vars", "spark_submit_kwargs", "application") if getattr(self, name)]
        own += [name for name, default in (("conn_id", DEFAULT_SPARK_CONN_ID), ("storage_conn_id", STORAGE_CONNECTION))
                if getattr(self, name) != default]
        if warm is not None and own:
            self.log.info("This task sets %s, which only a Spark application of its own can take: it runs cold, "
                          "not on the warm server at %s", ", ".join(own), warm)
            return None
        return warm

    def _keep_connection(self, connection: socket.socket) -> None:
        self._warm_connection = connection
        if self._killed:  # killed while connecting: the server must not start the run
            self._close_warm_connection()

    def _close_warm_connection(self) -> None:
        connection = self._warm_connection
        if connection is not None:  # the server sees its client go, and stops the run's queries
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
            connection.close()

    def on_kill(self) -> None:
        self._killed = True
        self._close_warm_connection()
        super().on_kill()

    def secret_env(self) -> dict[str, str]:
        """The Spark options of every Kafka connection the streams use, one ``SLUICE_KAFKA_CONN_<ID>`` JSON variable
        each. Read here, in the worker at run time (never while the DAG file is parsed), and masked in the task log.
        """
        from sluice_airflow.hooks import KafkaConnectionHook

        streams = self.stream_catalog().select(list(self.streams))
        kafka = KafkaConnectionHook([conn for stream in streams for conn in stream.connections]).spark_environment()
        return {**super().secret_env(), **kafka}

    def small_run(self) -> bool:
        from sluice.constants import DeltaEngine
        from sluice.operations.jvm import small_run

        try:
            streams = self.stream_catalog().select(list(self.streams))
            engine = DeltaEngine(self.engine) if self.engine else None
        except Exception:  # refused with its reason by what reads them next (secret_env, the runner)
            return False
        extra, conf = self.spark_submit_kwargs or {}, self.conf or {}
        own_jars = (any(extra.get(key) for key in ("jars", "packages", "driver_class_path"))
                    or any(conf.get(key) for key in ("spark.jars", "spark.jars.packages",
                                                     "spark.driver.extraClassPath")))
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
        check with ``check_health``), and log them; the streams left out."""
        if self.check_health:
            stopped, refusals = self._check_here(context)
            if len(stopped) == len(self.streams):
                raise gate_failure("\n".join(refusals), retry=self._retry_left_out)
        elif self.health_gates:
            stopped = [name for name in self.streams
                       if name in self.health_gates
                       and context["ti"].xcom_pull(task_ids=self.health_gates[name]) is None]
            for name in stopped:
                self.log.warning("Stream %s is left out of this run: its health gate %s did not pass", name,
                                 self.health_gates[name])
            if len(stopped) == len(self.streams):
                raise AirflowFailException(f"no stream ran: every health gate failed ({', '.join(stopped)})")
        else:
            return []
        self.streams = [name for name in self.streams if name not in stopped]
        return stopped

    def _check_here(self, context: Context) -> tuple[list[str], list[str]]:
        """Each stream's checkpoint health, checked in this task (``check_health``); the reports go to the XCom
        ``health_reports``. The streams left out, and why. A stream whose check raised is left out alone (a group's
        other streams run), as is one whose only FAIL is another run's lock, still held after the wait: both make
        the task retry."""
        catalog = self.stream_catalog()
        lock_deadline = time.monotonic() + self.lock_wait_seconds  # one wait for the task, not one per stream
        reports: dict[str, dict[str, Any]] = {}
        stopped: list[str] = []
        refusals: list[str] = []
        for name in self.streams:
            stream = catalog.get(name)
            try:
                report, stops = self.checked_health(stream, fail_on_warn=self.health_fail_on_warn,
                                                    lock_deadline=lock_deadline)
            except Exception as exc:  # a store that cannot be read now; the next try reads it again
                self.log.exception("The checkpoint health check of stream %s raised", name)
                reports[name] = {"stream": name, "status": "ERROR", "error": f"{type(exc).__name__}: {exc}"}
                stopped.append(name)
                refusals.append(f"checkpoint health of stream '{name}': the check raised {type(exc).__name__}: {exc}")
                self._retry_left_out = True
                continue
            reports[name] = report.to_dict()
            if stops:
                self.log.warning("Stream %s is left out of this run: its checkpoint health check failed", name)
                stopped.append(name)
                refusals.append(report.describe())
                self._retry_left_out = self._retry_left_out or report.waits_for_a_run
        context["ti"].xcom_push(key="health_reports", value=reports)
        return stopped, refusals

    def execute(self, context: Context) -> dict[str, Any]:
        self._require_streams()
        stopped = self._gated(context)
        run_id = f"{self.dag_id}/{context['run_id']}/{self.task_id}"
        warm = self.warm_target()
        summary: RunSummary | None
        failure: AirflowException | None = None
        if warm is not None:
            summary = self.run_warm(warm, run_id)
        else:
            with tempfile.TemporaryDirectory(prefix="sluice-run-") as folder:
                summary_file = str(Path(folder) / "summary.json")
                failure = self.submit("stream_runner.py",
                                      self.application_args(run_id=run_id, summary_file=summary_file),
                                      name=f"sluice-{'-'.join(self.streams)}")
                summary = self._hook.stream_summary(summary_file) if self._hook is not None else None
        if summary is None:
            raise AirflowException(f"Spark run of {self.streams} produced no run summary: {failure}")
        for stream in summary.streams:
            self.log.info(
                "Stream %s %s: %d batches, %d rows in, %d rows out, %d dead-letter rows, Delta v%s -> v%s, %.1fs",
                stream.stream, stream.status, stream.batches, stream.input_rows, stream.output_rows,
                stream.dead_letter_rows, stream.delta_version_before, stream.delta_version_after,
                stream.duration_seconds,
            )
        result = json.loads(summary.to_json())
        if failure is not None or not summary.ok:
            context["ti"].xcom_push(key="failed_summary", value=result)
            failed = [s for s in summary.streams if s.status != RunStatus.SUCCEEDED]
            errors = "; ".join(f"{s.stream}: {s.error}" for s in failed)
            if failed and not any(s.retryable for s in failed):
                raise AirflowFailException(f"Stream run failed, and a retry cannot fix it: {errors}")
            raise AirflowException(f"Stream run failed: {errors or failure}")
        if stopped:
            context["ti"].xcom_push(key="return_value", value=result)
            where = "this task's health_reports" if self.check_health else "its task's report"
            raise gate_failure(f"ran {', '.join(self.streams)}; left out {', '.join(stopped)}, whose checkpoint health "
                               f"gate failed (see {where})", retry=self._retry_left_out)
        return result


class CheckpointHealthCheckOperator(SluiceOperator):
    """Check a stream's checkpoint before its run: FAIL stops the DAG run before Spark starts, WARN logs.

    The checks read plain files and Delta metadata; no JVM starts. The report is the task's XCom return value. A FAIL
    fails the task without retries, unless its only cause is another run holding the stream's lock (a backfill, the
    nightly maintenance): the task waits for that run to end, up to ``lock_wait_seconds``, and then retries. Takes
    the :class:`SluiceOperator` arguments.

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
        report, stops = self.checked_health(self.stream_catalog().get(self.stream), fail_on_warn=self.fail_on_warn,
                                            lock_deadline=time.monotonic() + self.lock_wait_seconds)
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
                                 run_id=f"{self.dag_id}/{context['run_id']}/{self.task_id}", version=self._version())
        except SluiceError as exc:
            raise AirflowFailException(f"repair refused, nothing was changed: {exc}") from exc
        self.log.info("Repair %s of stream %s: %s", self.action, self.stream, json.dumps(result, default=str))
        return result


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
        for note in plan.notes:
            self.log.info("%s", note)
        return result


class BackfillOperator(SparkAppOperator):
    """Run the DAG run's backfill (its params, validated again) as a bounded availableNow Spark job with its own
    checkpoint, under the live stream's lock. The summary (rows read, written, replaced and dead-lettered, Delta
    versions, duration) is the XCom return value. Takes the :class:`SparkAppOperator` arguments.
    """

    ui_color = "#d9c8f0"

    def execute(self, context: Context) -> dict[str, Any]:
        request = _backfill_request(context, self.stream_catalog())
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


class DeltaMaintenanceOperator(SluiceOperator):
    """Compact, vacuum, checkpoint and clean the Delta tables of one stream while holding its lock, or the run log's
    tables when ``stream`` is None (see ``sluice.operations.maintenance``). The DAG run's params choose the streams
    (``streams``: empty for all), the vacuum retention (``vacuum_retention_hours``: at least each table's own) and
    ``dry_run``. A stream the params leave out is skipped. The report of each table is the XCom return value. Takes
    the :class:`SluiceOperator` arguments.

    :param stream: catalog stream name, or None for the run log
    :param lock_wait_seconds: how long to wait for a running stream to release its lock
    """

    ui_color = "#dff0d8"

    def __init__(self, *, stream: str | None, lock_wait_seconds: float = 600, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.lock_wait_seconds = lock_wait_seconds

    def execute(self, context: Context) -> list[dict[str, Any]]:
        from airflow.sdk.exceptions import AirflowSkipException

        from sluice.errors import SluiceError
        from sluice.operations.maintenance import maintain_run_log, maintain_stream

        params = context["params"]
        chosen = list(params.get("streams") or [])
        retention = params.get("vacuum_retention_hours")
        dry_run = bool(params.get("dry_run", False))
        catalog = self.stream_catalog()
        unknown = [name for name in chosen if name not in catalog.streams]
        if unknown:
            raise AirflowFailException(f"streams: {', '.join(map(repr, unknown))} not in the catalog")
        if self.stream is not None and chosen and self.stream not in chosen:
            raise AirflowSkipException(f"stream {self.stream} is not among the params' streams")
        if self.stream is None and chosen:
            raise AirflowSkipException("the run log is maintained when every stream is")
        roots, run_id = self.resolved_roots(), f"{self.dag_id}/{context['run_id']}/{self.task_id}"
        try:
            if self.stream is None:
                reports = maintain_run_log(roots, run_id=run_id, vacuum_retention_hours=retention, dry_run=dry_run)
            else:
                reports = maintain_stream(catalog.get(self.stream), catalog, roots, run_id=run_id, dry_run=dry_run,
                                          vacuum_retention_hours=retention, lock_wait_seconds=self.lock_wait_seconds)
        except SluiceError as exc:
            raise AirflowFailException(f"maintenance refused: {exc}") from exc
        for report in reports:
            self.log.info("%s (%s): version %s -> %s, files %d -> %d (compacted %d into %d), vacuumed %d, "
                          "checkpoint at %s%s", report.table, report.role, report.version_before,
                          report.version_after, report.files_before, report.files_after,
                          report.compacted_files_removed, report.compacted_files_added, report.vacuumed_files,
                          report.checkpoint_version, "".join(f"; {note}" for note in report.skipped))
        return [report.to_dict() for report in reports]
