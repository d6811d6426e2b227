"""The JVM artifacts: one Maven project file whose versions are the Python pins, resolved into sets that leave out
what pyspark ships, and the settings every Spark application gets with them."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

from sluice.errors import SluiceError
from sluice.operations import jars
from tests.helpers import needs_jvm_jars

PROJECT = Path(__file__).resolve().parents[2]
NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def pom_properties() -> dict[str, str]:
    root = ET.parse(jars.POM).getroot()
    properties = root.find("m:properties", NS)
    assert properties is not None
    return {child.tag.split("}", 1)[1]: (child.text or "").strip() for child in properties}


def requirement_pins() -> dict[str, str]:
    pins = {}
    for line in (PROJECT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        name, _, version = line.partition("==")
        if version:
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def test_the_project_file_pins_the_python_packages_versions() -> None:
    properties, pins = pom_properties(), requirement_pins()
    assert properties["spark.version"] == pins["pyspark"] == pins["pyspark-client"]
    assert properties["delta.version"] == pins["delta-spark"]
    [hadoop] = [path.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
                for path in pyspark_jars().glob("hadoop-client-api-*.jar")]
    assert properties["hadoop.version"] == hadoop, "hadoop-aws must be the Hadoop of pyspark's own client jars"
    assert properties["kafka.broker.version"].startswith("4."), "a KRaft broker (Kafka 4)"


def test_artifact_ids_are_read_from_jar_names() -> None:
    assert jars.artifact_id("kafka-clients-3.9.2.jar") == "kafka-clients"
    assert jars.artifact_id("delta-spark_2.13-4.4.0.jar") == "delta-spark_2.13"
    assert jars.artifact_id("gcs-connector-3.1.3-shaded.jar") == "gcs-connector"
    assert jars.artifact_id("netty-transport-native-epoll-4.2.13.Final-linux-x86_64.jar") == \
        "netty-transport-native-epoll"
    assert jars.artifact_id("odd.jar") == "odd"


def test_spark_conf_adds_the_jars_and_delta_settings_under_the_callers_own() -> None:
    found = ["/j/delta-spark_2.13-4.4.0.jar", "/j/kafka-clients-3.9.2.jar"]
    conf = jars.spark_conf({"spark.jars": "/mine.jar,/j/kafka-clients-3.9.2.jar",
                            "spark.sql.extensions": "my.Extension"}, jars=found)
    assert conf["spark.jars"] == "/j/delta-spark_2.13-4.4.0.jar,/j/kafka-clients-3.9.2.jar,/mine.jar"
    assert conf["spark.sql.extensions"] == f"{jars.DELTA_EXTENSION},my.Extension"
    assert conf["spark.sql.catalog.spark_catalog"] == jars.DELTA_CATALOG
    assert jars.spark_conf({"spark.sql.catalog.spark_catalog": "mine"}, jars=found)[
        "spark.sql.catalog.spark_catalog"] == "mine"
    assert jars.spark_conf({}, jars=[]) == {}, "no jars: nothing to configure (the rs engine)"
    assert jars.spark_conf({}, jars=["/j/kafka-clients-3.9.2.jar"]) == {"spark.jars": "/j/kafka-clients-3.9.2.jar"}
    assert jars.submit_args({"spark.x": "1"})[:2] == ["--conf", "spark.x=1"]



def test_spark_conf_adds_sluices_extension_when_its_jar_is_there_beside_the_callers_own() -> None:
    ours = f"/j/sluice/{jars.SLUICE_JAR}"
    conf = jars.spark_conf({"spark.sql.extensions": "my.Extension"}, jars=["/j/delta-spark_2.13-4.4.0.jar", ours])
    assert conf["spark.sql.extensions"] == f"{jars.DELTA_EXTENSION},{jars.SLUICE_EXTENSION},my.Extension"
    alone = jars.spark_conf({}, jars=[ours])
    assert alone["spark.sql.extensions"] == jars.SLUICE_EXTENSION
    assert "spark.sql.catalog.spark_catalog" not in alone, "no delta-spark: no Delta catalog"
    assert "spark.sql.extensions" not in jars.spark_conf({}, jars=["/j/kafka-clients-3.9.2.jar"])
    assert jars.spark_conf({"spark.sql.extensions": jars.SLUICE_EXTENSION}, jars=[ours])[
        "spark.sql.extensions"] == jars.SLUICE_EXTENSION, "named once"

def test_the_jars_folder_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(jars.JARS_ENV, str(tmp_path))
    assert jars.jars_home() == tmp_path
    assert jars.spark_jars() == [] and not jars.installed()
    (tmp_path / "spark").mkdir()
    (tmp_path / "spark" / "b-1.jar").write_bytes(b"")
    (tmp_path / "spark" / "a-1.jar").write_bytes(b"")
    assert jars.spark_jars() == [str(tmp_path / "spark" / "a-1.jar"), str(tmp_path / "spark" / "b-1.jar")]


@needs_jvm_jars
def test_the_resolved_sets_leave_out_what_pyspark_ships_and_stay_small() -> None:
    """The spark set holds the connectors and their own dependencies only: no second Scala, Jackson, Netty or
    Hadoop client beside pyspark's (whatever versions the connectors' poms name)."""
    shipped = set(jars.shipped_artifacts(pyspark_jars()))
    spark_set = [Path(path) for path in jars.jar_paths(jars.SPARK_SET)]
    names = {jars.artifact_id(path.name) for path in spark_set}
    assert not names & shipped, f"already shipped by pyspark: {sorted(names & shipped)}"
    properties = pom_properties()
    expected = {f"delta-spark_2.13-{properties['delta.version']}.jar",
                f"spark-sql-kafka-0-10_2.13-{properties['spark.version']}.jar",
                f"hadoop-aws-{properties['hadoop.version']}.jar", f"s3-{properties['aws.sdk.version']}.jar"}
    assert expected <= {path.name for path in spark_set}
    assert "bundle" not in names, "the AWS SDK's bundle is hundreds of MB; s3a takes its modules"
    assert sum(path.stat().st_size for path in spark_set) < 80 << 20
    broker = {Path(path).name for path in jars.jar_paths(jars.BROKER_SET)}
    assert f"kafka_2.13-{properties['kafka.broker.version']}.jar" in broker
    rest = {Path(path).name for path in jars.jar_paths(jars.REST_SET)}
    assert {f"iceberg-core-{properties['iceberg.rest.version']}-tests.jar", "jetty-ee10-servlet-"
            f"{properties['jetty.version']}.jar", f"sqlite-jdbc-{properties['sqlite-jdbc.version']}.jar"} <= rest
    assert jars.installed(), "the stamp is this project file's"


def test_the_images_resolve_the_same_project_file() -> None:
    dockerfile = (PROJECT / "include" / "docker" / "airflow.Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^RUN python -m sluice jars --with object-stores", dockerfile, flags=re.MULTILINE)
    assert "SLUICE_JARS_DIR" in dockerfile
    makefile = (PROJECT / "Makefile").read_text(encoding="utf-8")
    assert "include/jvm/pom.xml" in makefile and "-m sluice jars" in makefile


def test_the_rest_catalog_server_without_its_jars_is_refused_in_one_line(tmp_path: Path) -> None:
    from sluice.cli.iceberg_rest import SERVER_SOURCE, LocalIcebergRestCatalog
    from sluice.errors import SluiceError

    assert SERVER_SOURCE.is_file()
    with pytest.raises(SluiceError, match="REST catalog server's jars are not installed"):
        LocalIcebergRestCatalog(tmp_path, classpath=[]).start()
    assert not (tmp_path / "server.log").exists()


@pytest.mark.kafka
def test_a_broker_starts_whatever_its_cluster_id_looks_like(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster id is base64: one in 64 starts with "-", which the storage tool once read as an option."""
    import uuid

    from sluice.cli import kafka_broker

    if not jars.jar_paths(jars.BROKER_SET):
        pytest.skip("needs the Kafka broker's jars: `make venv` with Maven")
    dash = next(value for value in (uuid.UUID(int=n << 120) for n in range(256))
                if kafka_broker.cluster_id(value).startswith("-"))
    monkeypatch.setattr(kafka_broker.uuid, "uuid4", lambda: dash)
    broker = kafka_broker.LocalKafkaBroker(tmp_path / "broker")
    with broker.running() as address:
        kafka_broker.create_topic(address, "t", 1)


def test_sluices_own_classes_compile_into_the_jar_every_application_gets(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    monkeypatch.setenv(jars.JARS_ENV, str(tmp_path))
    jar = jars.compile_classes(tmp_path, spark_jars_dir=pyspark_jars())
    with zipfile.ZipFile(jar) as archive:
        assert "sluice/drift/MayDrift.class" in archive.namelist()
    assert jars.spark_conf()["spark.jars"] == str(jar), "the applications get Sluice's classes"
    assert jars.spark_jars() == [], "Sluice's classes are not Maven's jars: the connectors' checks skip without them"
    assert sorted(path.name for path in (tmp_path / jars.SLUICE_SET).iterdir()) == [jars.SLUICE_JAR], "nothing left"


def test_a_java_source_that_does_not_compile_is_refused_with_javacs_lines(tmp_path: Path) -> None:
    sources = tmp_path / "src"
    sources.mkdir()
    (sources / "Broken.java").write_text("class Broken { int x = ; }\n", encoding="utf-8")
    with pytest.raises(SluiceError, match=r"javac could not build sluice-drift.jar(.|\n)*Broken.java"):
        jars.compile_classes(tmp_path / "home", spark_jars_dir=pyspark_jars(), sources=sources)
    assert not (tmp_path / "home" / jars.SLUICE_SET / jars.SLUICE_JAR).exists()
