"""Sluice's spark-submit hook: the Spark provider's ``SparkSubmitHook`` with six additions.

- The JVM jars ``make venv`` resolved with Maven (:mod:`sluice.operations.jars`) go to every application as
  ``--jars``, before any the task names.
- A local default: when the Airflow connection is not defined, Sluice runs on ``local[*]`` instead of the
  provider's fallback to YARN, which would fail on a laptop with an unrelated error.
- The summary line the runner (or the backfill runner) prints is captured from the driver log as it streams by.
- spark-submit runs in its own process group, so killing the task kills the driver, its Python process and its
  Python workers, not just the launcher.
- ``secret_env``: environment for spark-submit that never reaches its command line. The provider turns
  ``env_vars`` into ``--conf spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*`` arguments on YARN and
  Kubernetes masters, visible in ``ps`` and the task log; secrets (the connections the streams' kinds need, object
  storage's) go to the process environment only, which reaches the driver because Sluice runs it in client mode.
- Nothing a local driver opens listens beyond loopback, and no Spark UI can kill (:mod:`sluice.operations.loopback`):
  a cluster master keeps the addresses its executors connect back to.
- ``ship_project_code()``: on a cluster master, the project's packages go to the executors as a ``--py-files``
  zip that the hook builds in a private folder and checks before it is shipped
  (:func:`~sluice_airflow.hooks.code_archive.project_archive`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import Connection
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowNotFoundException

from sluice.constants import BACKFILL_MARKER, SUMMARY_MARKER
from sluice.errors import SluiceError
from sluice.operations.jars import join_jars, spark_conf
from sluice.operations.loopback import driver_conf, driver_env
from sluice.summary import RunSummary, find_marked_json, find_summary_line
from sluice_airflow.hooks.code_archive import project_archive

DEFAULT_LOCAL_MASTER = "local[*]"
_KILL_GRACE_SECONDS = 10

log = logging.getLogger(__name__)


def default_application(script: str = "stream_runner.py") -> str:
    """A Spark entry point beside the ``sluice_spark`` package; ``SLUICE_SPARK_APP`` overrides the stream runner."""
    override = os.environ.get("SLUICE_SPARK_APP")
    if override and script == "stream_runner.py":
        return override
    spec = find_spec("sluice_spark")
    if spec is None or spec.origin is None:
        raise AirflowException("cannot locate the sluice_spark package; install the project or set SLUICE_SPARK_APP")
    return str(Path(spec.origin).parent.parent / script)


class SluiceSparkSubmitHook(SparkSubmitHook):
    """Submits a Sluice runner and keeps what it reports."""

    def __init__(self, *args: Any, secret_env: dict[str, str] | None = None, **kwargs: Any) -> None:
        self.summary_lines: list[str] = []
        self._secret_env = dict(secret_env or {})
        # The jars `make venv` resolved (delta-spark, the Kafka connector, s3a) and the Delta session settings they
        # need, under the task's own: no Ivy at run time, and a task's own jars and settings still come on top.
        conf = spark_conf(kwargs.get("conf"))
        kwargs["jars"] = join_jars(conf.pop("spark.jars", None), kwargs.get("jars"))
        kwargs["conf"] = conf
        super().__init__(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} conn_id={self._conn_id!r} secret_env={sorted(self._secret_env)}>"

    def ship_project_code(self) -> str | None:
        """On a cluster master, when no ``py_files`` were given, send the project's packages to the executors with
        the application: the checked :func:`project_archive` becomes ``--py-files``. Call it just before
        :meth:`submit`. Returns the archive, or None when nothing is shipped; raises :class:`CodeArchiveError`."""
        if self._py_files or self.master.startswith("local"):
            return None
        self._py_files = project_archive()
        self.log.info("Shipping the project's code to the executors: %s", self._py_files)
        return self._py_files

    def run_app(self, script: str, *, application: str | None = None) -> AirflowException | None:
        """spark-submit a Sluice runner (``script`` beside the ``sluice_spark`` package, unless ``application`` is
        given) in client mode, with the project's code shipped to a cluster's executors. The provider's failure, if
        any, is returned for the caller to weigh against the run's summary."""
        if self._connection.get("deploy_mode") == "cluster":
            raise AirflowFailException(
                f"connection {self._conn_id!r} asks for deploy-mode cluster, which Sluice does not support yet: the "
                "run summary is read from the driver's output, which a cluster-mode driver does not send back. "
                "Use client mode (the default)"
            )
        self.ship_project_code()
        try:
            self.submit(application or default_application(script))
        except AirflowException as exc:
            return exc
        return None

    def stream_summary(self, summary_file: str | os.PathLike[str]) -> RunSummary | None:
        """The stream runner's summary: from the file the driver wrote beside this task (client mode), else from
        its marked line in the driver's output, which Spark's own log output on the same pipe can tear."""
        path = Path(summary_file)
        if path.exists():
            return RunSummary.from_json(path.read_text(encoding="utf-8"))
        return self.run_summary

    def backfill_result(self, summary_file: str | os.PathLike[str]) -> dict[str, Any] | None:
        """The backfill runner's summary, from its file first and its marked line second."""
        path = Path(summary_file)
        if path.exists():
            found = json.loads(path.read_text(encoding="utf-8"))
            return found if isinstance(found, dict) else None
        return self.backfill_summary

    def _build_spark_submit_command(self, application: str) -> list[str]:
        # A local driver listens on loopback only and no UI kills (sluice.operations.loopback); the task's own
        # settings win.
        try:
            local_env = driver_env(self.master)
        except SluiceError as exc:
            raise AirflowFailException(str(exc)) from None
        self._conf = {**driver_conf(self.master), **self._conf}
        command = super()._build_spark_submit_command(application)
        # Read by the provider's submit() after the command is built, for the Popen environment only.
        self._env = {**local_env, **(self._env or {}), **self._secret_env}
        return command

    @classmethod
    def get_connection(cls, conn_id: str) -> Connection:
        """The Spark connection ``conn_id``; when it is not defined, a local one (``local[*]``) in its place, so that
        the provider's fallback (yarn, and a log line that says so) never applies."""
        try:
            return super().get_connection(conn_id)
        except AirflowNotFoundException:
            log.info("Spark connection %r is not defined; running on %s", conn_id, DEFAULT_LOCAL_MASTER)
            return Connection(conn_id=conn_id, conn_type="spark", host=DEFAULT_LOCAL_MASTER)

    @property
    def master(self) -> str:
        return str(self._connection["master"])

    def submit(self, application: str = "", **kwargs: Any) -> str | None:
        kwargs.setdefault("start_new_session", True)
        return super().submit(application, **kwargs)

    def _process_spark_submit_log(self, itr: Any) -> None:
        def watch(lines: Any) -> Any:
            for line in lines:
                if line.startswith((SUMMARY_MARKER, BACKFILL_MARKER)):
                    self.summary_lines.append(line)
                yield line

        super()._process_spark_submit_log(watch(itr))

    @property
    def run_summary(self) -> RunSummary | None:
        return find_summary_line(self.summary_lines)

    @property
    def backfill_summary(self) -> dict[str, Any] | None:
        found = find_marked_json(self.summary_lines, BACKFILL_MARKER)
        return found if isinstance(found, dict) else None

    def on_kill(self) -> None:
        # The provider first: it kills YARN applications and Kubernetes drivers only while spark-submit lives.
        super().on_kill()
        process: subprocess.Popen[str] | None = self._submit_sp
        if process is None:
            return
        # Then the whole local process group: the launcher's JVM, the Python driver and its Python workers.
        self.log.info("Stopping spark-submit process group %s", process.pid)
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + _KILL_GRACE_SECONDS
        while time.monotonic() < deadline:
            process.poll()  # reap the launcher, so that only live members keep the group alive
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
