"""The one Spark session builder, shared by the runner, the tests and the benchmarks.

Like delta-spark's ``configure_spark_with_delta_pip``, it takes a builder and returns a builder, so callers keep
control of the master, the app name and anything else.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from py4j.java_gateway import JavaMember
from pyspark.sql import DataFrame, SparkSession

from sluice.constants import DeltaEngine
from sluice.errors import SluiceError

if TYPE_CHECKING:
    from sluice.model.stream import StreamSpec
    from sluice.paths import Roots

DELTA_DATA_SOURCE_CLASS = "org.apache.spark.sql.delta.sources.DeltaDataSource"
# Spark's ICU case mappings (``spark.sql.icu.caseMappings.enabled``, on by default) run through this class, and its
# static initialiser title-cases every Unicode code point: about 1.1 s of a cold driver on Spark 4.2, paid by the
# first task that lowers or uppers a string (or the planner, folding a constant) while the other tasks wait.
CASE_MAPPINGS_CLASS = "org.apache.spark.sql.catalyst.util.CollationAwareUTF8String"
# Every SparkSession loads mllib's session extension (through Java's ServiceLoader, SPARK-49086), which registers
# three ML functions; its static initialiser builds Scala reflection's universe for their UDFs: 0.9 to 1.0 s of the
# 1.4 s a session takes to start on a cold driver (Spark 4.2).
SESSION_EXTENSION_CLASS = "org.apache.spark.sql.ml.InternalFunctionRegistration$"
# PySpark's DataFrame debugging: the Python call site of each Column operation, for runtime errors to quote. PySpark
# reads it once per process, from the first active session.
DATAFRAME_DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"
# The logical operator of SELECT TRANSFORM(...) USING '<command>' (see refuse_script_transforms).
SCRIPT_TRANSFORMATION = "ScriptTransformation"
# Set by spark-submit for the Python application it starts: the port of the JVM's Py4J gateway.
GATEWAY_PORT_ENV = "PYSPARK_GATEWAY_PORT"
_CONNECT_ENV = ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")

log = logging.getLogger(__name__)
_PRELOAD_LOCK = threading.Lock()


def delta_maven_package() -> str:
    """The Maven coordinate of the delta-spark jar that matches the installed delta-spark Python package."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"io.delta:delta-spark_2.13:{version('delta-spark')}"
    except PackageNotFoundError:
        return "io.delta:delta-spark_2.13:<version>"


def s3a_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Hadoop's s3a settings for the deployment's S3 environment (the one delta-rs and Sluice's own reads take): an
    ``AWS_ENDPOINT_URL`` of an S3-compatible server with path-style addresses, and ``AWS_REGION``. The credentials
    stay in the environment, where s3a's default providers read them: never in Spark's configuration, which the
    UI and the event log show."""
    environ = os.environ if environ is None else environ
    settings: dict[str, str] = {}
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        settings["spark.hadoop.fs.s3a.endpoint"] = endpoint
        settings["spark.hadoop.fs.s3a.path.style.access"] = "true"
        if endpoint.lower().startswith("http://"):
            settings["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "false"
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if region:
        settings["spark.hadoop.fs.s3a.endpoint.region"] = region
    return settings


def configure_sluice(builder: SparkSession.Builder) -> SparkSession.Builder:
    """Settings every Sluice application runs with."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    remember_jvm_functions()
    partitions = os.environ.get("SLUICE_SHUFFLE_PARTITIONS", "4")
    for key, value in s3a_settings().items():
        builder = builder.config(key, value)
    return (
        builder.config("spark.sql.session.timeZone", "UTC")
        # Parquet that Spark stages for delta-rs (backfills) carries UTC microsecond timestamps, as Delta does.
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.shuffle.partitions", partitions)
        # delta-spark rebuilds a table's state (its log replayed) in 50 tasks unless told otherwise: sized for logs of
        # millions of files, on a few cores it is most of a small commit's time (a jvm merge chain's test: 312 s ->
        # 70 s). A stream's tables take the shuffle's parallelism; SLUICE_SHUFFLE_PARTITIONS sets both.
        .config("spark.databricks.delta.snapshotPartitions", partitions)
        # Keep every progress report of a run: the run summary and the row reconciliation are built from them.
        .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        # No ${...} substitution in SQL: a catalog's SQL cannot read Spark settings or the environment (the catalog
        # refuses ${ already; this holds for any SQL the session runs).
        .config("spark.sql.variable.substitute", "false")
        # PySpark's DataFrame debugging sends the Python call site of every Column operation to the JVM, for runtime
        # errors to quote: about eleven Py4J round trips per operation instead of one (README, "Cost"). SQL rules
        # and transforms quote their SQL all the same; SLUICE_DATAFRAME_DEBUGGING=true turns it back on.
        .config(DATAFRAME_DEBUGGING, os.environ.get("SLUICE_DATAFRAME_DEBUGGING", "false"))
    )


def remember_jvm_functions() -> None:
    """Look each of Spark's SQL functions up in the JVM once per process, not at every call.

    PySpark's classic functions (``F.col``, ``F.when``, ``F.lit``...) find the JVM's ``functions.<name>`` through
    two reflection round trips to the JVM before the call itself (``_get_jvm_function``): three round trips where one
    does. Building a stream's quality split, drift walk and rules calls them about 400 times. The static method a
    name finds never changes while the JVM runs, so the lookup is kept, per JVM gateway: a SparkContext on another
    gateway looks its functions up again. A PySpark without that function (another version) is left as it is."""
    from pyspark.sql.functions import builtin

    lookup = getattr(builtin, "_get_jvm_function", None)
    if lookup is None or getattr(lookup, "_sluice_remembers", False):
        return
    found: dict[tuple[int, str], tuple[Any, Any]] = {}

    def remembered(name: str, sc: Any) -> Any:
        jvm = sc._jvm
        key = (id(jvm), name)
        hit = found.get(key)
        if hit is not None and hit[0] is jvm:  # the same gateway's view (an id may be reused once it is gone)
            return hit[1]
        function = lookup(name, sc)
        if isinstance(function, JavaMember):  # a static method; anything else is looked up every time
            found[key] = (jvm, function)
        return function

    remembered._sluice_remembers = True  # type: ignore[attr-defined]
    builtin._get_jvm_function = remembered


def refuse_script_transforms(frame: DataFrame, *, stream: str) -> None:
    """Refuse a frame whose plan runs a program on the executors (``SELECT TRANSFORM(...) USING '<command>'``, also
    inside a subquery of an expression): the second lock behind the catalog's SQL allowlist.

    Spark 4.2 has no setting that turns script transformation off: its only one is
    ``spark.sql.scriptTransformation.exitTimeoutInSeconds``, the parser builds a ``ScriptTransformation`` without
    consulting any, and the planner's ``SparkScripts`` strategy plans every one (a session extension could remove
    it, but that is JVM code Sluice would have to ship). So the analyzed plan is searched before anything runs: its
    operators and the plans of its subqueries, a few Py4J calls per operator.
    """
    pending = [frame._jdf.queryExecution().analyzed()]
    while pending:
        plan = pending.pop()
        if plan.getClass().getSimpleName() == SCRIPT_TRANSFORMATION:
            raise SluiceError(f"stream {stream!r}: its SQL runs a script transform (TRANSFORM ... USING "
                              f"{plan.script()!r}), a program on the executors, which Sluice never runs")
        for plans in (plan.children(), plan.subqueries()):
            pending += [plans.apply(index) for index in range(plans.size())]


def register_data_sources(spark: SparkSession) -> None:
    """Register Sluice's Python data sources on a session, once. Called where a query uses them (the rs engine's
    Delta source and its sink for large runs), not at start: on a cold JVM the registration costs over a second
    that a small run collected on the driver does not need."""
    from sluice_spark.rs.datasource import DeltaRsDataSource
    from sluice_spark.rs.iceberg import IcebergDataSource

    if getattr(spark, "_sluice_data_sources", False):
        return
    spark.dataSource.register(DeltaRsDataSource)
    spark.dataSource.register(IcebergDataSource)
    spark._sluice_data_sources = True  # type: ignore[attr-defined]


def activate(spark: SparkSession) -> None:
    """Make ``spark`` the JVM's active session in the calling thread. Spark finds Python data sources through the
    active session of the JVM thread that PySpark pins to the Python thread; in a thread other than the one that
    built the session there is none, and ``format("sluice_delta")`` fails with DATA_SOURCE_NOT_FOUND (measured on
    Spark 4.2)."""
    jvm = spark.sparkContext._jvm
    if jvm is not None:
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def preload_case_mappings(spark: SparkSession) -> threading.Thread | None:
    """Initialise Spark's case mappings (:data:`CASE_MAPPINGS_CLASS`) in a thread of their own, once per JVM, so that
    a run which lowers or uppers strings finds them ready instead of paying for them in its first batch. The caller
    goes on preparing its run on the other core meanwhile; a task that needs the class before it is ready waits for
    the one initialisation, as it would have without this. Nothing is loaded when the session turned the ICU case
    mappings off (``str_to_map`` and the collations still use the class then, and load it as they always did).
    Returns the thread it started, if any."""
    context = spark.sparkContext
    if str(spark.conf.get("spark.sql.icu.caseMappings.enabled", "true")).lower() != "true":
        return None
    with _PRELOAD_LOCK:  # two warm runs may start together
        if getattr(context, "_sluice_case_mappings", False):
            return None
        context._sluice_case_mappings = True  # type: ignore[attr-defined]
    jvm = context._jvm
    return None if jvm is None else _initialise_in_thread(jvm, CASE_MAPPINGS_CLASS, "Spark's case mappings")


def preload_session_classes() -> threading.Thread | None:
    """Start initialising :data:`SESSION_EXTENSION_CLASS` on the other core as soon as the driver's JVM answers, so that
    the SparkSession the caller builds next waits only for what is left of it. For a Python application that
    spark-submit started (its JVM is up already, :data:`GATEWAY_PORT_ENV` set); elsewhere the JVM would start here
    without the session's settings, so nothing happens; nor for a Spark Connect client, which builds no session in
    this JVM. A gateway that does not answer is left for the session to report. Returns the thread it started, if
    any."""
    if GATEWAY_PORT_ENV not in os.environ or any(os.environ.get(name) for name in _CONNECT_ENV):
        return None
    from pyspark import SparkContext

    try:
        SparkContext._ensure_initialized()
    except Exception as exc:
        log.debug("could not reach the driver's JVM ahead of the session: %s", exc)
        return None
    jvm = SparkContext._jvm
    return None if jvm is None else _initialise_in_thread(jvm, SESSION_EXTENSION_CLASS, "mllib's SQL functions")


def _initialise_in_thread(jvm: Any, class_name: str, what: str) -> threading.Thread:
    """``Class.forName(class_name, initialize=True)`` in a daemon thread of its own: the JVM runs the class's static
    initialiser once, and any thread that needs the class meanwhile waits for it, as it would have without this."""
    def initialise() -> None:
        started = time.monotonic()
        try:
            jvm.java.lang.Class.forName(class_name, True, jvm.java.lang.Thread.currentThread().getContextClassLoader())
        except Exception as exc:  # another Spark, without the class: nothing to get ready
            log.debug("could not preload %s (%s): %s", what, class_name, exc)
            return
        log.debug("%s ready in %.2f s", what, time.monotonic() - started)

    thread = threading.Thread(target=initialise, name=f"sluice-preload-{class_name.rsplit('.', 1)[-1]}", daemon=True)
    thread.start()
    return thread


def missing_classes(spark: SparkSession, names: list[str]) -> list[str]:
    """The classes of ``names`` that the driver cannot load (from the calling thread's class loader, which holds the
    task's ``--jars``); a class that is there but cannot link (a jar built for another Scala) counts as missing."""
    jvm = spark.sparkContext._jvm
    if jvm is None:
        return list(names)
    return [name for name in names if not _loadable(jvm, name)]


def _loadable(jvm: Any, name: str) -> bool:
    # Spark's own test answers in one call, where a Class.forName that fails costs dozens to carry the Java exception
    # across. It lets a LinkageError through, and it is Spark's internal API: either way, ask the JVM directly.
    try:
        return bool(jvm.org.apache.spark.util.Utils.classIsLoadable(name))
    except Exception:
        pass
    try:
        jvm.java.lang.Class.forName(name, False, jvm.java.lang.Thread.currentThread().getContextClassLoader())
    except Exception:  # py4j raises its own error type for ClassNotFoundException and LinkageError alike
        return False
    return True


def delta_jvm_available(spark: SparkSession) -> bool:
    """True when delta-spark's JVM classes are on the session's classpath."""
    return not missing_classes(spark, [DELTA_DATA_SOURCE_CLASS])


# Hadoop's file system for each object-store scheme Spark reads files or keeps checkpoints on, and the jars that
# provide it (pinned in include/jvm/pom.xml, which `make venv` and the images resolve with Maven).
HADOOP_CONNECTORS = {
    "s3a": ("org.apache.hadoop.fs.s3a.S3AFileSystem", "hadoop-aws and the AWS SDK bundle (software.amazon.awssdk)"),
    "abfss": ("org.apache.hadoop.fs.azurebfs.SecureAzureBlobFileSystem", "hadoop-azure"),
    "gs": ("com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem", "the GCS connector (gcs-connector, shaded)"),
}


def require_hadoop_connector(spark: SparkSession, uri: str, what: str) -> None:
    """Before Spark touches ``uri`` (a landing folder, a checkpoint, a table on the jvm engine): its scheme's Hadoop
    connector must load."""
    problem = hadoop_problem(spark, uri)
    if problem is not None:
        raise SluiceError(f"{what} {uri!r}{problem}")


def hadoop_problem(spark: SparkSession, uri: str) -> str | None:
    """Why Spark cannot reach ``uri`` through Hadoop's file systems (the end of a sentence that names it), or None."""
    if "://" not in uri or uri.startswith("file:"):
        return None
    scheme = uri.split("://", 1)[0].lower()
    if scheme == "s3":
        return ": Spark reaches S3 through Hadoop's s3a connector; write s3a:// (Sluice's own reads take either)"
    if scheme not in HADOOP_CONNECTORS:
        return (f": Spark has no connector for {scheme}://; use one of "
                f"{', '.join(f'{name}://' for name in HADOOP_CONNECTORS)} or a local or mounted path")
    class_name, jars = HADOOP_CONNECTORS[scheme]
    if missing_classes(spark, [class_name]):
        return (f" is on {scheme}://, but Hadoop's connector for it is not on Spark's classpath (missing "
                f"{class_name}). `make venv` resolves {jars} with Maven (python -m sluice jars, include/jvm/pom.xml) "
                "and Sluice's operators pass them to every run; an application started by hand needs them in "
                "spark.jars (--jars)")
    return None


def resolve_engine(spark: SparkSession, requested: DeltaEngine, places: Sequence[str] = ()) -> DeltaEngine:
    """The Delta engine a stream runs with, given every place it reads or writes: ``auto`` is ``jvm`` when
    delta-spark's classes load and Hadoop reaches each of the places on a store (no ``s3://``, the connector
    there), else ``rs``, which reaches them through delta-rs. ``jvm`` asked for by name needs both."""
    if requested is DeltaEngine.RS:
        return DeltaEngine.RS
    available = delta_jvm_available(spark)
    if requested is DeltaEngine.JVM and not available:
        raise SluiceError(
            "sink.engine is 'jvm' but delta-spark's classes are not on the classpath. `make venv` resolves them "
            "with Maven (python -m sluice jars, include/jvm/pom.xml) and Sluice's operators pass them to every run; "
            f"an application started by hand needs --jars <delta-spark and delta-storage jars> or --packages "
            f"{delta_maven_package()}; or set sink.engine to 'rs' or 'auto'"
        )
    if requested is DeltaEngine.JVM:
        for place in places:
            problem = hadoop_problem(spark, place)
            if problem is not None:
                raise SluiceError(f"sink.engine is 'jvm', which writes through Hadoop, and {place!r}{problem}; or set "
                                  "sink.engine to 'rs' or 'auto'")
        return DeltaEngine.JVM
    if not available or any(hadoop_problem(spark, place) is not None for place in places):
        return DeltaEngine.RS
    return DeltaEngine.JVM


def stream_engine(spark: SparkSession, stream: StreamSpec, roots: Roots, engine: DeltaEngine | None = None
                  ) -> DeltaEngine:
    """The Delta engine of a stream's run (``engine``: the run's override of ``sink.engine``): as
    :func:`resolve_engine` says, except that ``auto`` is rs for a stream on arrival that appends text files
    (:func:`sluice.lag.observe.auto_takes_rs`: its small runs' latency is the point, and only rs has the small-run
    paths)."""
    from sluice.lag.observe import auto_takes_rs

    requested = engine or stream.sink.engine
    if requested is DeltaEngine.AUTO and auto_takes_rs(stream):
        requested = DeltaEngine.RS
    return resolve_engine(spark, requested, stream.locations(roots))
