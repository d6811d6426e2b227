"""The JVM artifacts Sluice runs with, resolved by Maven from one project file (``include/jvm/pom.xml``).

Three sets, one Maven profile each:

- ``spark``: what every Spark application Sluice starts gets with ``spark.jars`` (``--jars``): delta-spark (the
  ``jvm`` Delta engine), Spark's Kafka connector, and hadoop-aws with the AWS SDK modules s3a uses. Artifacts that
  pyspark already ships (Scala, Jackson, Netty, Hadoop's client, Parquet, the compression codecs...) are left out,
  whatever version the connectors' poms name: Spark's own jars come first on the classpath anyway, and a second copy
  of another version only waits to shadow one of them.
- ``kafka-broker``: the Apache Kafka broker (KRaft) for the tests and ``make run KAFKA=1``; never on Spark's classpath.
- ``iceberg-rest``: Apache Iceberg's REST catalog server (:mod:`sluice.cli.iceberg_rest`) for the tests; never on
  Spark's classpath.

Beside them, Sluice's own JVM classes (``include/jvm/drift``: the JSON drift check and rescue of
:mod:`sluice_spark.drift.fields`, and the session extension :data:`SLUICE_EXTENSION`) are compiled by ``python -m
sluice jvm-classes`` against pyspark's jars into :data:`SLUICE_SET`, which every Spark application gets with the
``spark`` set; without it the drift check runs as column expressions and each micro-batch compiles its generated code
again, only slower.

``python -m sluice jars`` (run by ``make venv``) resolves both with ``mvn`` into :func:`jars_home`; the machine's Maven
settings (mirrors, proxies, the local repository) apply, and Maven checks every artifact's checksum. Nothing is
resolved when a Spark application starts (no Ivy). Without Maven the command says what needs the jars and leaves the
``rs`` Delta engine, which needs none, as the one that runs.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sluice.errors import SluiceError

JARS_ENV = "SLUICE_JARS_DIR"
SPARK_SET = "spark"
BROKER_SET = "kafka-broker"
REST_SET = "iceberg-rest"
SLUICE_SET = "sluice"
SLUICE_SOURCES = Path(__file__).resolve().parents[2] / "jvm" / "drift"
SLUICE_JAR = "sluice-drift.jar"
POM = Path(__file__).resolve().parents[2] / "jvm" / "pom.xml"
_STAMP = ".pom-sha256"
# A jar's file name is <artifactId>-<version>[-<classifier>].jar, and versions start with a digit.
_ARTIFACT = re.compile(r"^(?P<artifact>.+?)-\d[^/]*\.jar$")
NEEDS_JARS = ("the jvm Delta engine (sink.engine: jvm; auto falls back to rs), Kafka sources and sinks, "
              "s3a:// paths that Spark reads or writes, the Kafka broker of the tests and `make run KAFKA=1`, and the "
              "Iceberg REST catalog server of the tests")


def jars_home() -> Path:
    """Where the resolved jars live: ``SLUICE_JARS_DIR``, else ``share/sluice/jars`` under the interpreter's prefix
    (the project's venv), so that they survive ``make clean`` and go with the venv they were resolved for."""
    override = os.environ.get(JARS_ENV)
    return Path(override) if override else Path(sys.prefix) / "share" / "sluice" / "jars"


def jar_paths(artifact_set: str = SPARK_SET, home: Path | None = None) -> list[str]:
    """The jars of ``artifact_set`` (sorted absolute paths); empty when they were never resolved."""
    folder = (home or jars_home()) / artifact_set
    return sorted(str(path) for path in folder.glob("*.jar")) if folder.is_dir() else []


def spark_jars() -> list[str]:
    """The jars every Sluice Spark application gets (``spark.jars``) that Maven resolved: the ``spark`` set."""
    return jar_paths(SPARK_SET)


def compile_classes(home: Path, *, spark_jars_dir: Path, javac: str = "javac",
                    sources: Path = SLUICE_SOURCES) -> Path:
    """Compile Sluice's own JVM classes (``sources``) against pyspark's jars into one jar under ``home``'s
    :data:`SLUICE_SET` folder, replacing it whole; returns its path. Raises :class:`SluiceError` with javac's last
    lines when it fails."""
    files = sorted(str(path) for path in sources.rglob("*.java"))
    if not files:
        raise SluiceError(f"no Java sources under {sources}")
    folder = home / SLUICE_SET
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".compiling-", dir=folder) as staging:
        classes = Path(staging) / "classes"
        steps = [[javac, "--release", "17", "-nowarn", "-cp", str(spark_jars_dir / "*"), "-d", str(classes), *files],
                 [str(Path(javac).with_name("jar")) if os.sep in javac else "jar", "--create",
                  "--file", str(Path(staging) / SLUICE_JAR), "-C", str(classes), "."]]
        for command in steps:
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
                raise SluiceError(f"{command[0]} could not build {SLUICE_JAR} from {sources}:\n{tail}")
        os.replace(Path(staging) / SLUICE_JAR, folder / SLUICE_JAR)
    return folder / SLUICE_JAR


DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
# include/jvm/drift/sluice/plan/SluiceExtensions.java: a micro-batch's timestamp held out of its generated code.
SLUICE_EXTENSION = "sluice.plan.SluiceExtensions"


def spark_conf(conf: dict[str, str] | None = None, jars: list[str] | None = None) -> dict[str, str]:
    """``conf`` with the resolved jars and Sluice's own classes added to ``spark.jars``; when delta-spark is among
    them, the session extension and catalog delta-spark 4 asks for before any Delta operation, and when Sluice's jar
    is, Sluice's session extension. What ``conf`` sets already stays: an extension of its own is kept beside these,
    a catalog of its own wins."""
    conf = dict(conf or {})
    jars = [*spark_jars(), *jar_paths(SLUICE_SET)] if jars is None else jars
    merged = join_jars(jars, conf.get("spark.jars"))
    if merged:
        conf["spark.jars"] = merged
    ours = [DELTA_EXTENSION] if any(Path(jar).name.startswith("delta-spark") for jar in jars) else []
    if any(Path(jar).name == SLUICE_JAR for jar in jars):
        ours.append(SLUICE_EXTENSION)
    if ours:
        extensions = [item.strip() for item in conf.get("spark.sql.extensions", "").split(",") if item.strip()]
        conf["spark.sql.extensions"] = ",".join(dict.fromkeys([*ours, *extensions]))
    if DELTA_EXTENSION in ours:
        conf.setdefault("spark.sql.catalog.spark_catalog", DELTA_CATALOG)
    return conf


def submit_args(conf: dict[str, str] | None = None) -> list[str]:
    """:func:`spark_conf` as spark-submit arguments (``--conf key=value`` each), for the applications Sluice starts
    without Airflow's hook: the warm server, the tests' and the benchmarks' runs."""
    return [argument for key, value in spark_conf(conf).items() for argument in ("--conf", f"{key}={value}")]


def join_jars(*groups: str | list[str] | None) -> str | None:
    """One ``spark.jars`` value from comma-separated strings and lists, first occurrence kept; None when empty."""
    seen: dict[str, None] = {}
    for group in groups:
        items = group.split(",") if isinstance(group, str) else (group or [])
        for item in items:
            if item.strip():
                seen.setdefault(item.strip(), None)
    return ",".join(seen) or None


def artifact_id(jar_name: str) -> str:
    """The artifactId in a Maven jar's file name (``kafka-clients-3.9.2.jar`` -> ``kafka-clients``)."""
    match = _ARTIFACT.match(jar_name)
    return match.group("artifact") if match else jar_name.removesuffix(".jar")


def shipped_artifacts(spark_jars_dir: Path) -> list[str]:
    """The artifactIds of the jars pyspark ships, which the ``spark`` set leaves out."""
    return sorted({artifact_id(path.name) for path in spark_jars_dir.glob("*.jar")})


def stamp(pom: Path = POM, extra_profiles: tuple[str, ...] = ()) -> str:
    """What a resolution was made from: the project file's SHA-256 and the extra profiles."""
    return " ".join([hashlib.sha256(pom.read_bytes()).hexdigest(), *extra_profiles])


def installed(home: Path | None = None, pom: Path = POM, extra_profiles: tuple[str, ...] = ()) -> bool:
    """Whether ``home`` holds every set, resolved from this very project file with these profiles."""
    home = home or jars_home()
    try:
        return (home / _STAMP).read_text(encoding="ascii").strip() == stamp(pom, extra_profiles)
    except OSError:
        return False


def resolve(home: Path, *, spark_jars_dir: Path, pom: Path = POM, mvn: str = "mvn",
            extra_profiles: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Resolve every set with ``mvn`` into ``home``, replacing what was there only once all are complete; the
    ``extra_profiles`` of the project file (``object-stores``) go into the spark set. Returns the jar names of each
    set. Raises :class:`SluiceError` with Maven's last lines when Maven fails."""
    home.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".resolving-", dir=home))
    try:
        excluded = {SPARK_SET: shipped_artifacts(spark_jars_dir), BROKER_SET: [], REST_SET: []}
        profiles = {SPARK_SET: ",".join((SPARK_SET, *extra_profiles)), BROKER_SET: BROKER_SET, REST_SET: REST_SET}
        for artifact_set, exclude in excluded.items():
            command = [mvn, "-B", "-q", "-f", str(pom), "-P", profiles[artifact_set], "dependency:copy-dependencies",
                       f"-DoutputDirectory={staging / artifact_set}", "-DincludeScope=runtime",
                       "-Dmdep.useRepositoryLayout=false"]
            if exclude:
                command.append(f"-DexcludeArtifactIds={','.join(exclude)}")
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
                raise SluiceError(f"mvn could not resolve the {artifact_set} jars of {pom}:\n{tail}")
        for artifact_set in excluded:
            target = home / artifact_set
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging / artifact_set, target)
        (home / _STAMP).write_text(stamp(pom, extra_profiles) + "\n", encoding="ascii")
        return {artifact_set: sorted(path.name for path in (home / artifact_set).glob("*.jar"))
                for artifact_set in excluded}
    finally:
        shutil.rmtree(staging, ignore_errors=True)
