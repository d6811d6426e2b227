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
  Kubernetes masters, visible in ``ps`` and the task log; secrets (Kafka credentials) go to the process environment
  only, which reaches the driver because Sluice runs it in client mode.
- Nothing a local driver opens listens beyond loopback, and no Spark UI can kill (:mod:`sluice.operations.loopback`):
  a cluster master keeps the addresses its executors connect back to.
- ``ship_project_code()``: on a cluster master, the project's packages go to the executors as a ``--py-files``
  zip that the hook builds in a private folder and checks before it is shipped (:func:`project_archive`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import signal
import stat
import subprocess
import time
import zipfile
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowNotFoundException

from sluice.constants import BACKFILL_MARKER, SUMMARY_MARKER
from sluice.errors import SluiceError
from sluice.operations.jars import join_jars, spark_conf
from sluice.operations.loopback import driver_conf, driver_env
from sluice.summary import RunSummary, find_marked_json, find_summary_line

DEFAULT_LOCAL_MASTER = "local[*]"
_KILL_GRACE_SECONDS = 10
# The packages executors import: the core and the Spark side (not the Airflow plugins).
SHIPPED_PACKAGES = ("sluice", "sluice_spark")
CODE_ARCHIVE_FOLDER = "sluice-code"
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)

log = logging.getLogger(__name__)


class CodeArchiveError(AirflowFailException):
    """The code archive, or its folder, is not what this user built: it is not shipped, and a retry would find
    the same."""


def project_archive(folder: str | os.PathLike[str] | None = None) -> str:
    """A zip of the packages executors import, for ``--py-files``: a cluster's executors run Sluice's Python code
    (the rs Delta sink and source, the transforms) and need not have the project installed.

    The zip is built the same way every time (sorted entries, fixed times and modes), so the same code gives the
    same bytes, and it is named by their SHA-256: built once per version of the code, and two tasks that build it
    at once write the same bytes. It lives in a private folder, ``$AIRFLOW_HOME/sluice-code`` unless ``folder`` is
    given: a directory owned by this user with mode 0700 (created so; anything else is refused, as another local
    user could plant or swap files in it). Before its path is returned the zip is checked: a regular file (not a
    link), owned by this user, writable by no one else, holding exactly the bytes just built. A file of this user
    with other content is rebuilt; anything else under its name raises :class:`CodeArchiveError`.
    """
    files = _shipped_files()
    content = _deterministic_zip(files)
    digest = hashlib.sha256(content).hexdigest()
    home = _private_folder(Path(folder) if folder is not None else _default_archive_folder())
    target = home / f"sluice-code-{digest}.zip"
    if _holds(target, digest):
        return str(target)
    from sluice.storage.store import write_atomically

    write_atomically(target, content, mode=0o600)
    if not _holds(target, digest):
        raise CodeArchiveError(f"the code archive {target} changed while it was written; it is not shipped")
    return str(target)


def _default_archive_folder() -> Path:
    # Airflow's own default home when AIRFLOW_HOME is not set.
    return Path(os.path.expanduser(os.environ.get("AIRFLOW_HOME") or "~/airflow")) / CODE_ARCHIVE_FOLDER


def _shipped_files() -> list[tuple[str, Path]]:
    files: list[tuple[str, Path]] = []
    for package in SHIPPED_PACKAGES:
        spec = find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise AirflowException(f"cannot locate the {package} package; install the project")
        root = Path(next(iter(spec.submodule_search_locations)))
        files += sorted((path.relative_to(root.parent).as_posix(), path) for path in root.rglob("*")
                        if path.is_file() and path.suffix in (".py", ".yaml") and "__pycache__" not in path.parts)
    return files


def _deterministic_zip(files: list[tuple[str, Path]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, path in files:
            entry = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, path.read_bytes(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=6)
    return buffer.getvalue()


def _private_folder(folder: Path) -> Path:
    """``folder``, created with mode 0700 if missing; refused unless it is a directory of this user that no one
    else can enter or write."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    status = os.lstat(folder)
    if not stat.S_ISDIR(status.st_mode):
        raise CodeArchiveError(f"the code archive folder {folder} is a {_kind(status.st_mode)}, not a directory; "
                               "remove it or give another folder")
    if status.st_uid != os.geteuid():
        raise CodeArchiveError(f"the code archive folder {folder} belongs to uid {status.st_uid}, not to this user "
                               f"(uid {os.geteuid()}); give a folder of this user")
    if stat.S_IMODE(status.st_mode) & 0o077:
        raise CodeArchiveError(f"the code archive folder {folder} has mode {stat.S_IMODE(status.st_mode):o}: other "
                               "users could plant or swap the code executors run. Make it 0700 (chmod 700) or "
                               "give another folder")
    return folder


def _holds(path: Path, digest: str) -> bool:
    """Whether ``path`` is this user's regular file, writable by no one else, whose SHA-256 is ``digest``;
    False when it is missing or its content differs. Anything else raises :class:`CodeArchiveError`."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as exc:
        try:
            kind = _kind(os.lstat(path).st_mode)
        except OSError:
            kind = "file"
        raise CodeArchiveError(f"the code archive {path} is a {kind} that cannot be opened safely ({exc}); it is "
                               "not shipped. Find out how it got there, then remove it") from exc
    with os.fdopen(descriptor, "rb") as archive:
        status = os.fstat(archive.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise CodeArchiveError(f"the code archive {path} is a {_kind(status.st_mode)}, not a regular file; it "
                                   "is not shipped. Find out how it got there, then remove it")
        if status.st_uid != os.geteuid() or stat.S_IMODE(status.st_mode) & 0o022:
            raise CodeArchiveError(f"the code archive {path} belongs to uid {status.st_uid} with mode "
                                   f"{stat.S_IMODE(status.st_mode):o}; only a file of this user (uid {os.geteuid()}) "
                                   "that no one else can write is shipped. Find out how it got there, then remove it")
        content = hashlib.sha256()
        for chunk in iter(lambda: archive.read(1 << 20), b""):
            content.update(chunk)
        found = content.hexdigest()
    if found != digest:
        log.warning("The code archive %s does not hold the code it is named after; rebuilding it", path)
    return found == digest


_FILE_KINDS = ((stat.S_ISLNK, "symbolic link"), (stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
               (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
               (stat.S_ISREG, "regular file"))


def _kind(mode: int) -> str:
    return next((name for test, name in _FILE_KINDS if test(mode)), "special file")


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


class KafkaConnectionHook:
    """Turns the Airflow connections of a run's Kafka sources and sinks into the driver's secret environment: one
    ``SLUICE_KAFKA_CONN_<ID>`` variable of Spark ``kafka.*`` options per connection. Call it in the worker at run
    time, never while a DAG file is parsed; every secret is registered with Airflow's masker before anything is
    logged."""

    def __init__(self, conn_ids: list[str]) -> None:
        self.conn_ids = sorted(set(conn_ids))

    def spark_environment(self) -> dict[str, str]:
        from airflow.sdk.log import mask_secret

        from sluice.connections.kafka import connection_fields, env_name, redact, secret_values, spark_options
        from sluice.errors import SluiceError

        env: dict[str, str] = {}
        for conn_id in self.conn_ids:
            try:
                options = spark_options(connection_fields(conn_id))
            except SluiceError as exc:
                raise AirflowException(str(exc)) from None
            env[env_name(conn_id)] = json.dumps(options)
            for secret in [env[env_name(conn_id)], *secret_values(options)]:
                mask_secret(secret)
            log.info("Kafka connection %s: %s", conn_id, redact(options))
        return env
