"""Sluice's spark-submit hook: the Spark provider's ``SparkSubmitHook`` with four additions.

- A local default: when the Airflow connection is not defined, Sluice runs on ``local[*]`` instead of the
  provider's fallback to YARN, which would fail on a laptop with an unrelated error.
- The summary line the runner (or the backfill runner) prints is captured from the driver log as it streams by.
- spark-submit runs in its own process group, so killing the task kills the driver, its Python process and its
  Python workers, not just the launcher.
- ``secret_env``: environment for spark-submit that never reaches its command line. The provider turns
  ``env_vars`` into ``--conf spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*`` arguments on YARN and
  Kubernetes masters, visible in ``ps`` and the task log; secrets (Kafka credentials) go to the process environment
  only, which reaches the driver because Sluice runs it in client mode.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk.exceptions import AirflowNotFoundException

from sluice.constants import BACKFILL_MARKER, SUMMARY_MARKER
from sluice.summary import RunSummary, find_marked_json, find_summary_line

DEFAULT_LOCAL_MASTER = "local[*]"
_KILL_GRACE_SECONDS = 10


class SluiceSparkSubmitHook(SparkSubmitHook):
    """Submits the Sluice runner and keeps what it reports."""

    def __init__(self, *args: Any, secret_env: dict[str, str] | None = None, **kwargs: Any) -> None:
        self.summary_lines: list[str] = []
        self._secret_env = dict(secret_env or {})
        super().__init__(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} conn_id={self._conn_id!r} secret_env={sorted(self._secret_env)}>"

    def _build_spark_submit_command(self, application: str) -> list[str]:
        command = super()._build_spark_submit_command(application)
        if self._secret_env:
            # Read by the provider's submit() after the command is built, for the Popen environment only.
            self._env = {**(self._env or {}), **self._secret_env}
        return command

    def _resolve_connection(self) -> dict[str, Any]:
        data = super()._resolve_connection()
        try:
            self.get_connection(self._conn_id)
        except AirflowNotFoundException:
            self.log.info("Spark connection %r is not defined; running on %s", self._conn_id, DEFAULT_LOCAL_MASTER)
            data["master"] = DEFAULT_LOCAL_MASTER
            data["deploy_mode"] = None
        return data

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
