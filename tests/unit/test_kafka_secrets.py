"""Kafka credentials never leave the Airflow connection except for the driver's environment: not the spark-submit
command line, not the task log, not XCom, not the run summary. The connection is a real Airflow connection from
``AIRFLOW_CONN_SLUICE_KAFKA``; spark-submit itself is replaced by a fake process that records what it was given."""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import types
from pathlib import Path
from typing import Any

import pendulum
import pytest

from sluice.connections.kafka import env_name
from sluice.summary import RunSummary, StreamRunSummary
from tests.helpers import events_stream, write_catalog

PROJECT = Path(__file__).resolve().parents[2]
PASSWORD = "kafka-pa55word-do-not-leak"
KAFKA_ENV = env_name("sluice_kafka")


def kafka_catalog(folder: Path) -> Path:
    source = {"type": "kafka", "format": "json", "options": {"subscribe": "clicks"},
              "schema": {"event_id": "string not null", "event_time": "timestamp"}}
    return write_catalog(folder, {"name": "clicks", "source": source, "sink": {"path": "bronze/clicks"},
                                  "schedule": "*/5 * * * *"},
                         events_stream("events"))


@pytest.fixture
def kafka_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_KAFKA", json.dumps({
        "conn_type": "kafka", "extra": {"bootstrap.servers": "b1:9093", "security.protocol": "SASL_SSL",
                                        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "svc",
                                        "sasl.password": PASSWORD}}))


def make_operator(catalog: Path, streams: list[str], **kwargs: Any) -> Any:
    from airflow.sdk import DAG

    from sluice_airflow.operators import StreamRunOperator

    with DAG("kafka_secrets", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        return StreamRunOperator(task_id="run_stream", streams=streams, catalog=str(catalog), **kwargs)


class FakeSparkSubmit:
    """Stands in for the spark-submit process: records its command and environment, prints a run summary."""

    calls: list[tuple[list[str], dict[str, str]]] = []
    summary = RunSummary("local-1", [StreamRunSummary(stream="clicks", status="succeeded", batches=1, input_rows=3,
                                                      output_rows=3)])

    def __init__(self, command: list[str], **kwargs: Any) -> None:
        FakeSparkSubmit.calls.append((list(command), dict(kwargs.get("env") or {})))
        self.pid = 0
        self.stdout = iter(["INFO starting\n", self.summary.to_line() + "\n"])
        self.returncode = 0

    def wait(self) -> int:
        return 0

    def poll(self) -> int:
        return 0


class FakeTaskInstance:
    def __init__(self) -> None:
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


@pytest.mark.parametrize("master", [None, "yarn"])
def test_the_password_reaches_only_the_drivers_environment(
        tmp_path: Path, kafka_connection: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str], master: str | None) -> None:
    import airflow.providers.apache.spark.hooks.spark_submit as provider

    if master:  # the provider turns env_vars into --conf arguments on YARN: the secrets must not be among them
        monkeypatch.setenv("AIRFLOW_CONN_SLUICE_SPARK", json.dumps({"conn_type": "spark", "host": master}))
    fake_subprocess = types.SimpleNamespace(**{**vars(subprocess), "Popen": FakeSparkSubmit})
    monkeypatch.setattr(provider, "subprocess", fake_subprocess)
    FakeSparkSubmit.calls = []
    operator = make_operator(kafka_catalog(tmp_path), ["clicks"], env_vars={"SLUICE_NOTE": "visible"})
    ti = FakeTaskInstance()
    with caplog.at_level(logging.DEBUG):
        result = operator.execute({"run_id": "manual__1", "ti": ti})

    [(command, env)] = FakeSparkSubmit.calls
    options = json.loads(env[KAFKA_ENV])
    assert options["kafka.bootstrap.servers"] == "b1:9093"
    assert f'password="{PASSWORD}"' in options["kafka.sasl.jaas.config"], "the driver gets the credentials"
    assert env["SLUICE_NOTE"] == "visible"
    if master:
        assert "spark.yarn.appMasterEnv.SLUICE_NOTE=visible" in command, "the provider's env_vars path is exercised"
    assert PASSWORD not in " ".join(command)
    assert KAFKA_ENV not in " ".join(command)
    assert PASSWORD not in json.dumps(result) and PASSWORD not in json.dumps(ti.xcom)
    captured = capsys.readouterr()
    assert PASSWORD not in caplog.text + captured.out + captured.err
    assert "Connection sluice_kafka: Kafka, " in caplog.text + captured.out + captured.err, "the log was captured"
    assert PASSWORD not in repr(operator._hook)


def test_the_built_command_never_holds_the_secret(tmp_path: Path, kafka_connection: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_airflow.hooks import SluiceSparkSubmitHook

    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_SPARK", json.dumps({"conn_type": "spark", "host": "yarn"}))
    operator = make_operator(kafka_catalog(tmp_path), ["clicks"])
    secret_env = operator.secret_env()
    assert PASSWORD in secret_env[KAFKA_ENV]
    hook = SluiceSparkSubmitHook(conn_id="sluice_spark", application_args=operator.application_args(
        run_id="r", summary_file="/tmp/s.json"), env_vars=operator.spark_env(), secret_env=secret_env)
    command = hook._build_spark_submit_command("stream_runner.py")
    assert any(arg.startswith("spark.yarn.appMasterEnv.PYSPARK_PYTHON=") for arg in command)
    assert PASSWORD not in " ".join(command)
    assert hook._env is not None and PASSWORD in hook._env[KAFKA_ENV]


def test_streams_without_kafka_resolve_no_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_SLUICE_KAFKA", raising=False)
    assert make_operator(kafka_catalog(tmp_path), ["events"]).secret_env() == {}


def test_a_missing_connection_fails_the_task_at_run_time_not_at_parse_time(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowException

    monkeypatch.delenv("AIRFLOW_CONN_SLUICE_KAFKA", raising=False)
    operator = make_operator(kafka_catalog(tmp_path), ["clicks"])  # building the DAG reads no connection
    with pytest.raises(AirflowException, match="Kafka connection 'sluice_kafka' is not defined"):
        operator.secret_env()


def test_the_run_summary_scrubs_credentials_from_spark_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("stream_runner", PROJECT / "spark_apps" / "stream_runner.py")
    assert spec is not None and spec.loader is not None
    stream_runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stream_runner)
    emit = stream_runner.emit

    jaas = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="svc" password="{PASSWORD}";'
    monkeypatch.setenv(KAFKA_ENV, json.dumps({"kafka.bootstrap.servers": "b:1", "kafka.sasl.jaas.config": jaas}))
    summary = RunSummary("app", [StreamRunSummary(stream="clicks", status="failed",
                                                  error=f"Invalid value {jaas} for sasl.jaas.config ({PASSWORD})")])
    emit(summary, str(tmp_path / "summary.json"))
    printed = capsys.readouterr().out
    assert PASSWORD not in printed and PASSWORD not in (tmp_path / "summary.json").read_text()
    assert "Invalid value *** for sasl.jaas.config (***)" in printed


PEM_KEY = ("-----BEGIN PRIVATE KEY-----\n"
           "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n"
           "MzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu\n"
           "-----END PRIVATE KEY-----\n")


def test_an_inline_pem_key_never_reaches_the_task_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Kafka's Java client takes a PEM key inline as ``ssl.keystore.key``: no secret-name rule knew that name."""
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_KAFKA", json.dumps({
        "conn_type": "kafka", "extra": {"bootstrap.servers": "b1:9093", "security.protocol": "SSL",
                                        "ssl.keystore.type": "PEM", "ssl.keystore.key": PEM_KEY,
                                        "ssl.keystore.certificate.chain": "-----BEGIN CERTIFICATE-----\nx\n"}}))
    import airflow.sdk.log

    masked: list[str] = []
    monkeypatch.setattr(airflow.sdk.log, "mask_secret", masked.append)
    operator = make_operator(kafka_catalog(tmp_path), ["clicks"])
    with caplog.at_level(logging.DEBUG):
        secret_env = operator.secret_env()
    assert json.loads(secret_env[KAFKA_ENV])["kafka.ssl.keystore.key"] == PEM_KEY, "the driver gets the key"
    logged = caplog.text + "".join(capsys.readouterr())
    assert "Connection sluice_kafka: Kafka, " in logged, "the log was captured"
    for line in PEM_KEY.splitlines()[1:-1]:
        assert line not in logged
        assert line in masked, "Airflow's masker hides the key in whatever prints it, line by line"
    assert json.dumps(PEM_KEY)[1:-1] in masked, "and JSON-escaped"
    assert "'kafka.ssl.keystore.type': 'PEM'" in logged, "public settings stay readable"


def test_the_driver_scrubs_the_plain_password_as_well_as_its_jaas_escaped_form(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.connections.kafka import ConnectionFields, env_secrets, scrub, spark_options

    password = 'pa"ss\\word-1234'
    options = spark_options(ConnectionFields("k", extra={"bootstrap.servers": "b:1", "security.protocol": "SASL_SSL",
                                                         "sasl.username": "svc", "sasl.password": password}))
    assert password not in options["kafka.sasl.jaas.config"], "the JAAS config escapes the password"
    monkeypatch.setenv(KAFKA_ENV, json.dumps(options))
    message = f"Authentication failed for svc with password {password}"
    assert scrub(message, env_secrets()) == "Authentication failed for svc with password ***"


def test_a_kafka_backfill_hands_the_connection_to_its_driver_only(tmp_path: Path, kafka_connection: None) -> None:
    """The backfill's driver plans and reads the topic: it gets the connection of the stream it backfills (and the
    stream of a files source none)."""
    from airflow.sdk import DAG

    from sluice_airflow.operators import BackfillOperator

    with DAG("kafka_backfill_secrets", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        operator = BackfillOperator(task_id="backfill", catalog=str(kafka_catalog(tmp_path)))
    assert operator.secret_env() == {}, "no stream yet: nothing resolved"
    operator._stream = "clicks"  # what execute() sets from the run's params, before it submits
    assert PASSWORD in operator.secret_env()[KAFKA_ENV]
    operator._stream = "events"
    assert operator.secret_env() == {}
