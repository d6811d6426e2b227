"""Put the JVM jars Sluice's images need into pyspark's own jars folder, at image build time.

- delta-spark and delta-storage: the ``jvm`` Delta engine (``auto`` picks it once these classes load);
- spark-sql-kafka-0-10 with spark-token-provider-kafka, kafka-clients and commons-pool2: the Kafka source and sink;
- Hadoop's object-store connectors, for a landing zone or Spark's checkpoints on object storage: hadoop-aws with the
  AWS SDK v2 bundle (``s3a://``), hadoop-azure (``abfss://``) and Google's shaded GCS connector (``gs://``).
  hadoop-aws and hadoop-azure must be the Hadoop of pyspark's own hadoop-client jars, which is checked.

Every other dependency of these jars (zstd, lz4, snappy, slf4j) already ships with pyspark. Each jar is checked
against the SHA-1 that the repository publishes beside it, and the versions asked for must match the pyspark and
delta-spark packages installed from requirements.txt, so an image never mixes a jar and a Python package of two
versions. Both Dockerfiles under include/docker run it; it needs only the standard library.

    python fetch_spark_jars.py --spark 4.2.0 --delta 4.4.1 --kafka-clients 3.9.2 --commons-pool2 2.12.1 \
        --hadoop 3.5.0 --aws-sdk 2.29.52 --gcs-connector 3.1.3
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"

Fetch = Callable[[str], bytes]


@dataclass(frozen=True)
class Artifact:
    """A jar in a Maven repository."""

    group: str
    name: str
    version: str
    classifier: str = ""

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}{f'-{self.classifier}' if self.classifier else ''}.jar"

    def url(self, repository: str = MAVEN_CENTRAL) -> str:
        return f"{repository.rstrip('/')}/{self.group.replace('.', '/')}/{self.name}/{self.version}/{self.filename}"


def spark_jars(*, spark: str, delta: str, kafka_clients: str, commons_pool2: str, scala: str = "2.13",
               delta_artifact: str = "delta-spark") -> list[Artifact]:
    """The jars for Spark ``spark`` (Scala ``scala``) with Delta ``delta`` and the Kafka connector."""
    for field, value in (("spark", spark), ("delta", delta), ("kafka_clients", kafka_clients),
                         ("commons_pool2", commons_pool2), ("scala", scala)):
        if not value or not value[0].isdigit():
            raise ValueError(f"{field}: expected a version such as 4.2.0, got {value!r}")
    return [
        Artifact("io.delta", f"{delta_artifact}_{scala}", delta),
        Artifact("io.delta", "delta-storage", delta),
        Artifact("org.apache.spark", f"spark-sql-kafka-0-10_{scala}", spark),
        Artifact("org.apache.spark", f"spark-token-provider-kafka-0-10_{scala}", spark),
        Artifact("org.apache.kafka", "kafka-clients", kafka_clients),
        Artifact("org.apache.commons", "commons-pool2", commons_pool2),
    ]


def object_store_jars(*, hadoop: str, aws_sdk: str, gcs_connector: str) -> list[Artifact]:
    """Hadoop's connectors for s3a://, abfss:// and gs:// (the GCS connector shaded: it carries its own Guava and
    gRPC, which would clash with Spark's)."""
    for field, value in (("hadoop", hadoop), ("aws_sdk", aws_sdk), ("gcs_connector", gcs_connector)):
        if not value or not value[0].isdigit():
            raise ValueError(f"{field}: expected a version such as 3.5.0, got {value!r}")
    return [
        Artifact("org.apache.hadoop", "hadoop-aws", hadoop),
        Artifact("software.amazon.awssdk", "bundle", aws_sdk),
        Artifact("org.apache.hadoop", "hadoop-azure", hadoop),
        Artifact("com.google.cloud.bigdataoss", "gcs-connector", gcs_connector, "shaded"),
    ]


def check_hadoop(hadoop: str, jars_dir: Path) -> None:
    """Refuse connectors of another Hadoop than the hadoop-client jars pyspark ships (a mismatch fails at the first
    s3a:// call with a NoSuchMethodError)."""
    shipped = sorted(path.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
                     for path in jars_dir.glob("hadoop-client-api-*.jar"))
    if shipped != [hadoop]:
        raise SystemExit(f"pyspark ships Hadoop {', '.join(shipped) or 'none'} (hadoop-client-api) but the "
                         f"connectors asked for are Hadoop {hadoop}: make the Dockerfile's HADOOP_VERSION match")


def check_installed(*, spark: str, delta: str, installed: Callable[[str], str] = version) -> None:
    """Refuse jars of other versions than the pyspark and delta-spark Python packages in the image."""
    for package, wanted in (("pyspark", spark), ("delta-spark", delta)):
        try:
            found = installed(package)
        except PackageNotFoundError:
            raise SystemExit(f"{package} is not installed; install requirements.txt before fetching jars") from None
        if found != wanted:
            raise SystemExit(f"{package} {found} is installed but the jars asked for are {wanted}: "
                             "make the Dockerfile's build ARG match requirements.txt")


def default_jars_dir() -> Path:
    """pyspark's jars folder: the classpath of spark-submit, spark-class and every executor."""
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _urlopen(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as response:
        return bytes(response.read())


def download(artifact: Artifact, target: Path, *, repository: str = MAVEN_CENTRAL, fetch: Fetch = _urlopen) -> Path:
    """Download ``artifact`` into ``target``, verified against its published SHA-1, written atomically."""
    url = artifact.url(repository)
    data = fetch(url)
    expected = fetch(url + ".sha1").decode("ascii").split()[0].strip().lower()
    actual = hashlib.sha1(data).hexdigest()  # the digest Maven repositories publish beside every artifact
    if actual != expected:
        raise SystemExit(f"{url}: SHA-1 {actual} does not match the published {expected}")
    target.mkdir(parents=True, exist_ok=True)
    path = target / artifact.filename
    # A name no one can predict, created with O_EXCL: never written through a link planted beside the jars.
    descriptor, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=target)
    try:
        os.fchmod(descriptor, 0o644)  # jars others read: Spark's user in the image
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spark", required=True, help="Spark version: the pinned pyspark")
    parser.add_argument("--delta", required=True, help="Delta version: the pinned delta-spark")
    parser.add_argument("--kafka-clients", required=True, help="kafka-clients version of Spark's build")
    parser.add_argument("--commons-pool2", required=True, help="commons-pool2 version of Spark's build")
    parser.add_argument("--hadoop", help="Hadoop version of pyspark's hadoop-client jars (object-store connectors)")
    parser.add_argument("--aws-sdk", help="AWS SDK v2 bundle version that hadoop-aws of --hadoop declares")
    parser.add_argument("--gcs-connector", help="Google Cloud Storage connector version (shaded jar)")
    parser.add_argument("--scala", default="2.13")
    parser.add_argument("--delta-artifact", default="delta-spark", help="delta-spark's artifact name before _<scala>")
    parser.add_argument("--repository", default=os.environ.get("MAVEN_REPOSITORY", MAVEN_CENTRAL),
                        help="Maven repository or mirror (default: MAVEN_REPOSITORY or Maven Central)")
    parser.add_argument("--jars-dir", type=Path, default=None, help="default: pyspark's jars folder")
    args = parser.parse_args(argv)
    check_installed(spark=args.spark, delta=args.delta)
    target = args.jars_dir or default_jars_dir()
    jars = spark_jars(spark=args.spark, delta=args.delta, kafka_clients=args.kafka_clients,
                      commons_pool2=args.commons_pool2, scala=args.scala, delta_artifact=args.delta_artifact)
    if args.hadoop or args.aws_sdk or args.gcs_connector:
        check_hadoop(args.hadoop or "", target)
        jars += object_store_jars(hadoop=args.hadoop or "", aws_sdk=args.aws_sdk or "",
                                  gcs_connector=args.gcs_connector or "")
    for artifact in jars:
        print(f"fetched {download(artifact, target, repository=args.repository)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
