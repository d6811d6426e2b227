"""Shared fixtures: one local SparkSession per test session, an isolated Airflow home, and test catalogs.

Airflow reads its configuration when it is first imported, so the isolated home is set here, at import time,
before any test module imports Airflow. Its metadata database is a SQLite file in that home, or the database that
``SLUICE_TEST_AIRFLOW_DB`` names (an SQLAlchemy URL; ``tests/postgres.sh`` sets it to a throwaway PostgreSQL).
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PROJECT = Path(__file__).resolve().parent.parent
_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="sluice-test-airflow-"))
AIRFLOW_DB = os.environ.get("SLUICE_TEST_AIRFLOW_DB") or f"sqlite:///{_AIRFLOW_HOME / 'airflow.db'}"
os.environ.update(
    {
        "AIRFLOW_HOME": str(_AIRFLOW_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": AIRFLOW_DB,
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        # The key the API server signs its tokens with: one per test run, shared by every process it starts.
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(48),
        "SLUICE_DATA_ROOT": str(_AIRFLOW_HOME / "data"),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
)
os.environ.pop("SLUICE_CATALOG", None)
# py4j logs from __del__ at interpreter exit, after pytest has closed the streams it captured.
logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local SparkSession for the whole run: local[2], UI off, few shuffle and Delta state partitions."""
    from pyspark.sql import SparkSession

    from sluice.operations.jars import spark_conf
    from sluice.operations.jvm import driver_java_options, submit_env
    from sluice.operations.loopback import driver_conf, driver_env
    from sluice_spark.session import configure_sluice, register_data_sources

    # The class archive for the session's driver and its addresses (loopback only), as the operators give them: in
    # the environment of the spark-submit that pyspark starts, so that the machine's own extraJavaOptions stay.
    master = "local[2]"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {**submit_env(driver_java_options(small=False)), **driver_env(master)}.items():
            patch.setenv(name, value)
        builder = configure_sluice(SparkSession.builder)
        # The jars `make venv` resolved and their Delta settings, as every Sluice application gets them: delta-spark,
        # the Kafka connector and s3a. Tests of the rs engine name it; `auto` is the JVM's writer here.
        for key, value in {**spark_conf(), **driver_conf(master)}.items():
            builder = builder.config(key, value)
        session = (
            builder
            .master(master)
            .appName("sluice-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.databricks.delta.snapshotPartitions", "2")
            .config("spark.driver.memory", "1g")
            .getOrCreate()
        )
    session.sparkContext.setLogLevel("ERROR")
    register_data_sources(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """The migrated metadata database (SQLite in the isolated Airflow home, or ``SLUICE_TEST_AIRFLOW_DB``)."""
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True,
                   env=os.environ.copy())
    return _AIRFLOW_HOME


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real S3-compatible server (moto's server mode) on 127.0.0.1 for the whole run."""
    from tests.object_store import start_s3_server

    yield from start_s3_server(tmp_path_factory.mktemp("moto") / "server.log")


@pytest.fixture
def s3(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket, and the deployment's environment to reach it; the bucket's name."""
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    return str(s3_server.create_bucket())


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real Kafka broker (KRaft, SASL/PLAIN on 127.0.0.1) for the whole run, from the jars `make venv` resolved;
    its :class:`~sluice.cli.kafka_broker.BrokerAddress`."""
    from sluice.cli.kafka_broker import LocalKafkaBroker
    from sluice.operations.jars import BROKER_SET, jar_paths

    if not jar_paths(BROKER_SET):
        pytest.skip("needs the Kafka broker's jars: `make venv` with Maven installed (python -m sluice jars)")
    broker = LocalKafkaBroker(tmp_path_factory.mktemp("kafka"))
    with broker.running() as address:
        yield address


@pytest.fixture(scope="session")
def iceberg_rest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Iceberg REST catalog (Apache Iceberg's server classes on 127.0.0.1, a SQLite catalog behind) for the
    whole run, from the jars `make venv` resolved; its URL."""
    from sluice.cli.iceberg_rest import LocalIcebergRestCatalog
    from sluice.operations.jars import REST_SET, jar_paths

    if not jar_paths(REST_SET):
        pytest.skip("needs the Iceberg REST catalog's jars: `make venv` with Maven installed (python -m sluice jars)")
    with LocalIcebergRestCatalog(tmp_path_factory.mktemp("iceberg-rest")).running() as url:
        yield url


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With SLUICE_NO_SKIPS set (CI sets it), a skipped test fails: on this project's machines every test has what
    it needs (Maven's jars, a broker, Chromium), so a skip hides a broken set-up. On a user's machine it still skips
    and says why."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("SLUICE_NO_SKIPS") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, which SLUICE_NO_SKIPS forbids: {reason}"


# The fixtures that start something, and the marker a test that uses one (directly or through another fixture) gets,
# so that a tier's marker says what it starts: `make test-unit` deselects them all and starts nothing.
STARTS = {"s3_server": "s3", "kafka": "kafka", "spark": "spark", "airflow_db": "airflow", "iceberg_rest": "spark"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in STARTS.items():
            if fixture in getattr(item, "fixturenames", ()) and item.get_closest_marker(marker) is None:
                item.add_marker(getattr(pytest.mark, marker))
