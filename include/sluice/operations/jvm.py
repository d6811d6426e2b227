"""The Spark driver's JVM for short runs: a class-data-sharing archive of Spark's classes, and a light JIT for small
runs.

A scheduled run is short, and a cold JVM spends most of it loading, verifying and compiling Spark's classes. Two
options of the driver's JVM cut that cost. The launchers (the operators, the warm server, the benches) put them in
``SPARK_SUBMIT_OPTS``, which Spark's launcher gives the driver's JVM before ``spark.driver.extraJavaOptions``: a
deployment's own options (``spark-defaults.conf``, a task's ``conf``) are kept, and win where they set the same flag.

- ``-XX:SharedArchiveFile``: a dynamic AppCDS archive (JDK 13+) of the classes a Sluice run loads, mapped into
  memory instead of read from Spark's jars and verified again. :func:`build_archive` records it from a training run
  (``python -m sluice jvm-archive``, done by ``make venv``). It holds the absolute classpath and the jars' times and
  sizes: it is named by their fingerprint (:func:`fingerprint`), so another Spark, another JDK or a reinstalled venv
  looks for another file, and the JVM checks it too and runs without it, with a warning, when it does not match.
  JDK 17 refuses a non-empty folder on the classpath (Spark's conf folder, when it holds files): there is no archive
  then. A truncated archive crashes the JVM that maps it, so one is written beside its place, checked by a JVM that
  must map it (``-Xshare:on``), and renamed into place with its size recorded beside it; a file whose size is not
  the recorded one is never passed.
- ``-XX:TieredStopAtLevel=1`` for a small run only: the C1 compiler alone, which compiles quickly and leaves both
  cores to the run. Small means text files appended without a join, at most :data:`JIT_SMALL_RUN_MAX_BYTES` unread
  in all (:func:`sluice.lag.observe.text_append_backlog`). Measured on 2 cores with the archive: 3 files (1.8 MiB)
  in 9.3 s instead of 12.0 s, and 27 files (16 MiB, 90,000 rows) in 10.4 to 12.0 s instead of 13.3 to 14.0 s; but
  a 1,000,000-row ingest takes three times as long, so a large run keeps C2.

Spark's own log (log4j) goes to the console and the task log at WARN: :func:`log_options` points the driver's JVM
at the properties file shipped beside this package (``sluice/spark-log4j2.properties``), which also silences the
"trivially true equals predicate" warning Spark's ``Column`` logs for every batch of a stream with expectations.
``SLUICE_SPARK_LOG_LEVEL=INFO`` (or any log4j level) brings Spark's INFO lines back; Sluice's own lines (Python
logging) are not affected. A deployment's own log4j configuration (``spark.driver.extraJavaOptions``) still wins.

``SLUICE_JVM_ARCHIVE=off`` turns the archive off; ``SLUICE_CACHE_DIR`` moves it (default ``~/.cache/sluice``);
``SLUICE_JIT_SMALL_RUN_MAX_BYTES`` sets the small-run limit (0 turns the light JIT off). Nothing here fails a run:
an option that cannot be worked out is left out, with a warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from importlib.util import find_spec
from pathlib import Path

from sluice.constants import DeltaEngine
from sluice.lag.observe import auto_takes_rs, text_append_backlog
from sluice.limits import JIT_SMALL_RUN_MAX_BYTES
from sluice.model.stream import StreamSpec
from sluice.operations.jars import spark_jars
from sluice.paths import Roots

log = logging.getLogger(__name__)

SUBMIT_OPTS = "SPARK_SUBMIT_OPTS"
ARCHIVE_SWITCH = "SLUICE_JVM_ARCHIVE"
LIGHT_JIT = "-XX:TieredStopAtLevel=1"
#: HotSpot compiles no method of over 8,000 bytes of bytecode unless told to: Spark's generated function for a stage
#: that checks a wide record's drift passes that (the CSV rescue of bench_csv_drift's six columns: 9,103 bytes), and
#: then every row runs in the bytecode interpreter (rescue 1.56x none; 1.03x with this option, the same rows).
#: Spark's own remedy (``spark.sql.codegen.hugeMethodLimit``) gives up on generated code for such a stage instead.
COMPILE_HUGE_METHODS = "-XX:-DontCompileHugeMethods"
LOG_LEVEL_ENV = "SLUICE_SPARK_LOG_LEVEL"
LOG_CONFIG = Path(__file__).resolve().parents[1] / "spark-log4j2.properties"
_LOG_LEVELS = ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL")
# The training run and the JVM that checks its archive: minutes at most, even on a slow machine.
_TRAINING_TIMEOUT_SECONDS = 900
_CHECK_TIMEOUT_SECONDS = 120
# What Spark's launcher puts on the driver's classpath besides its jars (AbstractCommandBuilder.buildClassPath).
_CLASSPATH_ENV = ("SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH", "SPARK_CLASSPATH",
                  "SPARK_PREPEND_CLASSES")


def spark_home() -> Path:
    """Where spark-submit takes its jars from: ``SPARK_HOME``, else the pyspark package (as pyspark's own
    ``find_spark_home`` does for a pip install)."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    spec = find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed")
    return Path(spec.origin).parent


def java_binary() -> Path | None:
    """The java that spark-submit starts: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def classpath_folders() -> list[Path]:
    """The folders Spark's launcher puts on the driver's classpath besides its jars (its conf folder, and Hadoop's
    and YARN's when set)."""
    conf = os.environ.get("SPARK_CONF_DIR") or str(spark_home() / "conf")
    return [Path(folder) for folder in (conf, os.environ.get("HADOOP_CONF_DIR"), os.environ.get("YARN_CONF_DIR"))
            if folder]


def sharing_refusal() -> str | None:
    """Why no JVM could use an archive here, or None: JDK 17 refuses class sharing with a non-empty folder on the
    classpath."""
    for folder in classpath_folders():
        if folder.is_dir() and any(folder.iterdir()):
            return (f"{folder} is a folder on the Spark driver's classpath and holds files, which the JVM's class "
                    "sharing refuses (JDK 17)")
    return None


def fingerprint() -> str | None:
    """What a driver's archive depends on: the JVM binary, Spark's jars (paths, sizes, times) and the environment
    that adds to the driver's classpath. None when there is no java."""
    java = java_binary()
    if java is None:
        return None
    jars = (spark_home() / "jars").resolve()
    digest = hashlib.sha256()
    for path in (java, *sorted(jars.glob("*.jar"))):
        status = path.stat()
        digest.update(f"{path}|{status.st_size}|{status.st_mtime_ns}\n".encode())
    for name in _CLASSPATH_ENV:
        digest.update(f"{name}={os.environ.get(name, '')}\n".encode())
    return digest.hexdigest()[:20]


def cache_folder() -> Path:
    if os.environ.get("SLUICE_CACHE_DIR"):
        return Path(os.environ["SLUICE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sluice"


def archive_path() -> Path | None:
    """Where this machine's driver archive is (or would be); None when it is turned off or there is no java."""
    if os.environ.get(ARCHIVE_SWITCH, "").lower() in ("off", "0", "false", "no"):
        return None
    key = fingerprint()
    return None if key is None else cache_folder() / f"spark-driver-{key}.jsa"


def _record(archive: Path) -> Path:
    return archive.with_suffix(".json")


def _untrusted(path: Path) -> str | None:
    """Why ``path`` cannot be trusted with a class archive, or None: it must be this user's, writable by no one
    else, and no link. A class archive is mapped without verifying its classes again, so one that another user could
    plant or swap would run their code in the driver."""
    status = os.lstat(path)
    if stat.S_ISLNK(status.st_mode):
        return f"{path} is a link"
    if status.st_uid != os.geteuid():
        return f"{path} belongs to uid {status.st_uid}, not to this user (uid {os.geteuid()})"
    if stat.S_IMODE(status.st_mode) & 0o022:
        return f"{path} has mode {stat.S_IMODE(status.st_mode):o}: others can write to it"
    return None


def archive_refusal() -> str | None:
    """Why the archive is not used, or None when it is: turned off, not recorded whole by :func:`build_archive`
    (missing, or not the size it recorded), not this user's alone (the file, its record or its folder), or a folder
    on the classpath that makes the JVM refuse it."""
    archive = archive_path()
    if archive is None:
        return f"it is turned off ({ARCHIVE_SWITCH}), or there is no java"
    if _unquotable(archive):
        return f"its path {archive} has a space or a quote; set SLUICE_CACHE_DIR to another folder"
    try:
        recorded = json.loads(_record(archive).read_text(encoding="utf-8"))
        if archive.stat().st_size != recorded["size"]:
            return f"{archive} is not the size its record says: run `python -m sluice jvm-archive --force`"
        for path in (archive.parent, archive, _record(archive)):
            problem = _untrusted(path)
            if problem:
                return problem
    except FileNotFoundError:
        return f"there is none at {archive}: run `python -m sluice jvm-archive`"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its record cannot be read ({exc}): run `python -m sluice jvm-archive --force`"
    return sharing_refusal()


def usable_archive() -> Path | None:
    """The archive when :func:`archive_refusal` finds nothing against it."""
    return archive_path() if archive_refusal() is None else None


def _unquotable(archive: Path) -> bool:
    """Kept simple: a path that would need quoting in ``SPARK_SUBMIT_OPTS`` is not used."""
    return any(char.isspace() or char in "'\"\\" for char in str(archive))


def driver_java_options(*, small: bool) -> list[str]:
    """The driver JVM's options for a run: the archive when there is a usable one, Spark's large generated functions
    compiled (:data:`COMPILE_HUGE_METHODS`; on a local master the executors are the driver's threads), and the light
    JIT for a small run. An archive that cannot be looked up (no pyspark to find Spark's jars, no home folder) is
    left out."""
    archive: Path | None = None
    try:
        refusal = archive_refusal()
        if refusal is None:
            archive = archive_path()
        else:  # a warning when there is one it will not use; a note when none was recorded or it is turned off
            found = archive_path()
            (log.warning if found is not None and found.exists() else log.info)(
                "the Spark driver's class archive is not used: %s", refusal)
    except Exception as exc:  # a speed-up never fails a run
        log.warning("the Spark driver's class archive cannot be looked up (%s); the run starts without it", exc)
    return [*([f"-XX:SharedArchiveFile={archive}"] if archive else []), COMPILE_HUGE_METHODS,
            *([LIGHT_JIT] if small else [])]


def submit_env(options: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that gives spark-submit's driver ``options``: ``SPARK_SUBMIT_OPTS``, with what the
    environment (``environ``, default this process's) has in it already kept after them. Empty without options."""
    given = (os.environ if environ is None else environ).get(SUBMIT_OPTS, "").strip()
    options = list(options)
    return {SUBMIT_OPTS: " ".join([*options, *([given] if given else [])])} if options else {}


def log_options(environ: Mapping[str, str] | None = None) -> list[str]:
    """The driver JVM's options for Spark's own log: Sluice's log4j2 file, at ``SLUICE_SPARK_LOG_LEVEL`` (WARN
    unless set; the file reads the variable itself, so it must reach the driver's environment). A level log4j does
    not know is refused with a warning, and WARN is used."""
    level = (os.environ if environ is None else environ).get(LOG_LEVEL_ENV, "").strip().upper()
    if level and level not in _LOG_LEVELS:
        log.warning("%s must be one of %s, not %r; Spark logs at WARN", LOG_LEVEL_ENV, ", ".join(_LOG_LEVELS), level)
    if _unquotable(LOG_CONFIG) or not LOG_CONFIG.is_file():
        return []
    return [f"-Dlog4j2.configurationFile=file:{LOG_CONFIG}"]


def interpreter_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The project's interpreter for the driver and the Python workers, and its bin folder for spark-submit; then
    ``extra`` (a task's own ``env_vars``)."""
    interpreter_bin = str(Path(sys.executable).parent)
    env = {
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable),
        "PATH": os.pathsep.join([interpreter_bin, os.environ.get("PATH", "")]),
    }
    env.update(extra or {})
    return env


def brings_jars(conf: Mapping[str, object] | None, submit_kwargs: Mapping[str, object] | None) -> bool:
    """Whether a task's Spark settings add jars or packages (which may bring delta-spark): ``own_jars`` of
    :func:`small_run`."""
    extra, settings = submit_kwargs or {}, conf or {}
    return (any(extra.get(key) for key in ("jars", "packages", "driver_class_path"))
            or any(settings.get(key) for key in ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath")))


def small_run(streams: Iterable[StreamSpec], roots: Roots, *, engine: DeltaEngine | None = None,
              own_jars: bool = False) -> bool:
    """True when every stream reads text files it appends without a join on the rs engine, and all of them hold at
    most ``SLUICE_JIT_SMALL_RUN_MAX_BYTES`` unread, as their lag probes measure it (the driver measures it again).
    ``engine`` is the run's override of the streams' engines; ``own_jars`` says the run adds jars or packages, which
    may bring delta-spark, so that ``auto`` may mean the JVM's Delta writer, which was never measured on the light
    JIT. False when any stream cannot tell: a large run on the light JIT is slow, a small one on the full JIT only
    less quick."""
    try:
        limit = int(os.environ.get("SLUICE_JIT_SMALL_RUN_MAX_BYTES", JIT_SMALL_RUN_MAX_BYTES))
    except ValueError:
        log.warning("SLUICE_JIT_SMALL_RUN_MAX_BYTES must be a number of bytes; the driver keeps the full JIT")
        return False
    if limit <= 0:
        return False
    total = 0
    for stream in streams:
        requested = engine or getattr(stream.sink, "engine", DeltaEngine.JVM)
        if requested is DeltaEngine.AUTO and auto_takes_rs(stream):
            requested = DeltaEngine.RS
        if requested is DeltaEngine.JVM or (requested is DeltaEngine.AUTO and (own_jars or _delta_spark_jars())):
            return False
        unread = text_append_backlog(stream, roots)
        if unread is None:
            return False
        total += unread
        if total > limit:
            return False
    return True


def _delta_spark_jars() -> bool:
    """Whether delta-spark's jars reach the run: the ones `make venv` resolved (every run gets them), or Spark's own
    jars folder."""
    if any(Path(jar).name.startswith("delta-spark") for jar in spark_jars()):
        return True
    try:
        return any((spark_home() / "jars").glob("delta-spark*.jar"))
    except RuntimeError:
        return True  # cannot tell


def run_group(command: list[str], *, env: Mapping[str, str], timeout: float,
              cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in a process group of its own, its output captured; on timeout the whole group is killed
    (spark-submit's JVM and its Python driver) and RuntimeError says so."""
    process = subprocess.Popen(command, env=dict(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except BaseException as exc:  # a timeout, or the user's Ctrl-C (the group does not get the terminal's)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise RuntimeError(f"{command[0]} did not finish within {timeout:.0f} s") from None
        raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def spark_submit() -> str:
    """The spark-submit beside this interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "spark-submit"
    return str(beside) if beside.exists() else "spark-submit"


def build_archive(train: Callable[[list[str], float], str], *, force: bool = False) -> Path:
    """Record this machine's driver archive: ``train(options, timeout)`` must run a Sluice application through
    spark-submit with ``options`` given to its driver's JVM, within ``timeout`` seconds, and return its output; that
    JVM writes the classes it loaded at exit. The archive is checked by a JVM that must map it, then renamed into
    place. Returns its path; raises RuntimeError when it cannot be built (turned off, no java, a path or a classpath
    the JVM refuses, a failed training run or check)."""
    archive = archive_path()
    if archive is None:
        raise RuntimeError(f"the driver archive is turned off ({ARCHIVE_SWITCH}) or there is no java on PATH")
    refusal = sharing_refusal()
    if refusal:
        raise RuntimeError(refusal)
    if _unquotable(archive):
        raise RuntimeError(f"the cache folder {archive.parent} has a space or a quote in its path; set "
                           "SLUICE_CACHE_DIR to another")
    if not force and usable_archive() == archive:
        return archive
    archive.parent.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(archive.parent, 0o700)
    status = os.lstat(archive.parent)
    if stat.S_ISDIR(status.st_mode) and status.st_uid == os.geteuid() and stat.S_IMODE(status.st_mode) & 0o022:
        os.chmod(archive.parent, 0o700)  # this user's own cache folder, made under a loose umask: made private
    problem = _untrusted(archive.parent)
    if problem:
        raise RuntimeError(f"the cache folder {problem}; set SLUICE_CACHE_DIR to a folder of this user only")
    for left in archive.parent.glob(".spark-driver-*.partial"):  # a killed build's
        with contextlib.suppress(FileNotFoundError):
            if time.time() - left.stat().st_mtime > _TRAINING_TIMEOUT_SECONDS:
                left.unlink(missing_ok=True)
    staged = archive.with_name(f".{archive.name}.{os.getpid()}.partial")
    staged.unlink(missing_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-jvm-") as scratch:
            crash_log = f"-XX:ErrorFile={scratch}/hs_err_%p.log"  # a JVM that crashes on a bad archive writes here
            output = train([f"-XX:ArchiveClassesAtExit={staged}", crash_log], _TRAINING_TIMEOUT_SECONDS)
            if not staged.exists():
                raise RuntimeError(f"the training run wrote no archive; its JVM said:\n{_tail(output)}")
            check = run_group([spark_submit(), "--version"], timeout=_CHECK_TIMEOUT_SECONDS, cwd=scratch,
                              env={**os.environ, **submit_env(["-Xshare:on", f"-XX:SharedArchiveFile={staged}",
                                                               crash_log])})
            if check.returncode != 0:
                crashes = "".join(path.read_text(errors="replace")[:1000] for path in Path(scratch).glob("hs_err_*"))
                raise RuntimeError("a JVM cannot map the new archive: "  # the JVM's own words last: on stdout
                                   f"{_tail(check.stderr + check.stdout + crashes)}")
        size = staged.stat().st_size
        _record(archive).unlink(missing_ok=True)  # never a record beside another file's bytes
        os.chmod(staged, 0o444)
        os.replace(staged, archive)
        record = json.dumps({"size": size, "spark_home": str(spark_home())}) + "\n"
        descriptor = os.open(_record(archive), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        os.fchmod(descriptor, 0o644)  # whatever the umask: a record others can write is not trusted
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(record)
    finally:
        staged.unlink(missing_ok=True)
    _remove_replaced(archive)
    refusal = archive_refusal()
    if refusal:
        raise RuntimeError(f"the archive was recorded, but runs cannot use it: {refusal}")
    return archive


def _tail(text: str) -> str:
    return text.strip()[-2000:]


def _remove_replaced(archive: Path) -> None:
    """Delete the archives this one replaces: the others recorded for the same Spark install (its jars or its JDK
    changed since; with two JDKs in turn, the last one recorded stays), and those of Spark installs that are gone."""
    for record in archive.parent.glob("spark-driver-*.json"):
        if record == _record(archive):
            continue
        try:
            home = json.loads(record.read_text(encoding="utf-8")).get("spark_home")
            if home == str(spark_home()) or not Path(str(home)).is_dir():
                record.with_suffix(".jsa").unlink(missing_ok=True)
                record.unlink(missing_ok=True)
        except (OSError, ValueError, AttributeError):
            continue
