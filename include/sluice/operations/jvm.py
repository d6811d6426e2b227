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

``SLUICE_JVM_ARCHIVE=off`` turns the archive off; ``SLUICE_CACHE_DIR`` moves it (default ``~/.cache/sluice``);
``SLUICE_JIT_SMALL_RUN_MAX_BYTES`` sets the small-run limit (0 turns the light JIT off). Nothing here fails a run:
an option that cannot be worked out is left out, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from importlib.util import find_spec
from pathlib import Path

from sluice.lag.observe import text_append_backlog
from sluice.limits import JIT_SMALL_RUN_MAX_BYTES
from sluice.model.stream import StreamSpec
from sluice.paths import Roots

log = logging.getLogger(__name__)

SUBMIT_OPTS = "SPARK_SUBMIT_OPTS"
ARCHIVE_SWITCH = "SLUICE_JVM_ARCHIVE"
LIGHT_JIT = "-XX:TieredStopAtLevel=1"
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
    stat = java.stat()
    digest.update(f"{java}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    for jar in sorted(jars.glob("*.jar")):
        stat = jar.stat()
        digest.update(f"{jar}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
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


def usable_archive() -> Path | None:
    """The archive, when it was installed whole by :func:`build_archive` and is still the size it recorded."""
    archive = archive_path()
    if archive is None or any(char.isspace() or char in "'\"\\" for char in str(archive)):
        return None  # kept simple: such a path would need quoting in SPARK_SUBMIT_OPTS
    try:
        recorded = json.loads(_record(archive).read_text(encoding="utf-8"))
        return archive if archive.stat().st_size == recorded["size"] and sharing_refusal() is None else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def driver_java_options(*, small: bool) -> list[str]:
    """The driver JVM's options for a run: the archive when there is a usable one, and the light JIT for a small
    run. An archive that cannot be looked up (no pyspark to find Spark's jars, no home folder) is left out."""
    try:
        archive = usable_archive()
    except Exception as exc:  # a speed-up never fails a run
        log.warning("the Spark driver's class archive cannot be looked up (%s); the run starts without it", exc)
        archive = None
    return [*([f"-XX:SharedArchiveFile={archive}"] if archive else []), *([LIGHT_JIT] if small else [])]


def submit_env(options: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that gives spark-submit's driver ``options``: ``SPARK_SUBMIT_OPTS``, with what the
    environment (``environ``, default this process's) has in it already kept after them. Empty without options."""
    given = (os.environ if environ is None else environ).get(SUBMIT_OPTS, "").strip()
    options = list(options)
    return {SUBMIT_OPTS: " ".join([*options, *([given] if given else [])])} if options else {}


def small_run(streams: Iterable[StreamSpec], roots: Roots) -> bool:
    """True when every stream reads text files it appends without a join, and all of them hold at most
    ``SLUICE_JIT_SMALL_RUN_MAX_BYTES`` unread, as their lag probes measure it. False when any cannot tell: a large
    run on the light JIT is slow, a small one on the full JIT only less quick."""
    try:
        limit = int(os.environ.get("SLUICE_JIT_SMALL_RUN_MAX_BYTES", JIT_SMALL_RUN_MAX_BYTES))
    except ValueError:
        log.warning("SLUICE_JIT_SMALL_RUN_MAX_BYTES must be a number of bytes; the driver keeps the full JIT")
        return False
    total = 0
    for stream in streams:
        unread = text_append_backlog(stream, roots) if limit > 0 else None
        if unread is None:
            return False
        total += unread
        if total > limit:
            return False
    return True


def spark_submit() -> str:
    """The spark-submit beside this interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "spark-submit"
    return str(beside) if beside.exists() else "spark-submit"


def build_archive(train: Callable[[list[str], float], None], *, force: bool = False) -> Path:
    """Record this machine's driver archive: ``train(options, timeout)`` must run a Sluice application through
    spark-submit with ``options`` given to its driver's JVM, within ``timeout`` seconds; that JVM writes the classes
    it loaded at exit. The archive is checked by a JVM that must map it, then renamed into place. Returns its path;
    raises RuntimeError when it cannot be built (turned off, no java, a classpath the JVM refuses, a failed training
    run or check)."""
    archive = archive_path()
    if archive is None:
        raise RuntimeError(f"the driver archive is turned off ({ARCHIVE_SWITCH}) or there is no java on PATH")
    refusal = sharing_refusal()
    if refusal:
        raise RuntimeError(refusal)
    if not force and usable_archive() == archive:
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    for left in archive.parent.glob(".spark-driver-*.partial"):  # a killed build's
        if time.time() - left.stat().st_mtime > _TRAINING_TIMEOUT_SECONDS:
            left.unlink(missing_ok=True)
    staged = archive.with_name(f".{archive.name}.{os.getpid()}.partial")
    staged.unlink(missing_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-jvm-") as scratch:
            crash_log = f"-XX:ErrorFile={scratch}/hs_err_%p.log"  # a JVM that crashes on a bad archive writes here
            train([f"-XX:ArchiveClassesAtExit={staged}", crash_log], _TRAINING_TIMEOUT_SECONDS)
            if not staged.exists():
                raise RuntimeError("the training run wrote no archive")
            check = subprocess.run([spark_submit(), "--version"], capture_output=True, text=True,
                                   timeout=_CHECK_TIMEOUT_SECONDS, cwd=scratch,
                                   env={**os.environ, **submit_env(["-Xshare:on", f"-XX:SharedArchiveFile={staged}",
                                                                    crash_log])})
        if check.returncode != 0:
            raise RuntimeError(f"a JVM cannot map the new archive: {(check.stdout + check.stderr).strip()[-2000:]}")
        size = staged.stat().st_size
        _record(archive).unlink(missing_ok=True)  # never a record beside another file's bytes
        os.replace(staged, archive)
        _record(archive).write_text(json.dumps({"size": size, "spark_home": str(spark_home())}) + "\n",
                                    encoding="utf-8")
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{exc.cmd[0]} did not finish within {exc.timeout:.0f} s") from None
    finally:
        staged.unlink(missing_ok=True)
    _remove_replaced(archive)
    return archive


def _remove_replaced(archive: Path) -> None:
    """Delete the archives this one replaces: those recorded for the same Spark install (older jars or JDK)."""
    for record in archive.parent.glob("spark-driver-*.json"):
        if record == _record(archive):
            continue
        try:
            if json.loads(record.read_text(encoding="utf-8")).get("spark_home") == str(spark_home()):
                record.with_suffix(".jsa").unlink(missing_ok=True)
                record.unlink(missing_ok=True)
        except (OSError, ValueError, AttributeError):
            continue
