"""Error text that leaves a run is scrubbed of every secret the run was given (issue 40), not only Kafka's: object
storage's, a service account's key line by line, a deployment's passwords and tokens. What the apps print is what
reaches XCom and the task log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.kinds.credentials import REDACTED, run_secrets, scrub_secrets
from sluice.summary import RunSummary, StreamRunSummary
from tests.helpers import load_spark_app

AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
PEM_LINE = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7"
SERVICE_ACCOUNT = json.dumps({"type": "service_account", "client_email": "svc@project.iam.gserviceaccount.com",
                              "private_key": f"-----BEGIN PRIVATE KEY-----\n{PEM_LINE}\n-----END PRIVATE KEY-----\n"})
KAFKA_PASSWORD = "kafka-pass-8812"
GIVEN = {
    "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
    "AZURE_CLIENT_SECRET": "azure~client~secret~value",
    "GOOGLE_SERVICE_ACCOUNT_KEY": SERVICE_ACCOUNT,
    "SLUICE_KAFKA_CONN_SLUICE_KAFKA": json.dumps({"kafka.bootstrap.servers": "b:9092",
                                                  "kafka.sasl.jaas.config": f'... password="{KAFKA_PASSWORD}";'}),
    "PGPASSWORD": "postgres-password-1",
    "AIRFLOW_CONN_WAREHOUSE": "postgres://user:conn-password-77@db:5432/w",
    "SLUICE_WARM_TOKEN": "warm-token-abcdef",
    "SLUICE_SHUFFLE_PARTITIONS": "4",
    "MY_TOKEN_COUNT": "1",
}
LEAKED = [AWS_SECRET, "azure~client~secret~value", PEM_LINE, KAFKA_PASSWORD, "postgres-password-1",
          "postgres://user:conn-password-77@db:5432/w", "warm-token-abcdef"]


def error_quoting_everything() -> str:
    return (f"Py4JJavaError: s3a://lake/events: 403 for key {AWS_SECRET}; account key {json.dumps(SERVICE_ACCOUNT)}"
            f"; {PEM_LINE}; azure~client~secret~value; SASL password {KAFKA_PASSWORD}; postgres-password-1; "
            "postgres://user:conn-password-77@db:5432/w; warm-token-abcdef; shuffle partitions 4")


@pytest.fixture
def given(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in GIVEN.items():
        monkeypatch.setenv(name, value)


def test_every_secret_the_run_was_given_is_scrubbed(given: None) -> None:
    scrubbed = scrub_secrets(error_quoting_everything())
    for secret in LEAKED:
        assert secret not in scrubbed
    assert REDACTED in scrubbed
    assert "AKIAIOSFODNN7EXAMPLE" not in run_secrets(), "an access key id is no secret"
    assert scrubbed.endswith("shuffle partitions 4"), "a short value of a variable Sluice does not know stays"


def test_the_stream_runner_prints_and_writes_no_secret(given: None, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    emit = load_spark_app("stream_runner.py").emit

    failed = StreamRunSummary(stream="events", status="failed", error=error_quoting_everything())
    summary = RunSummary("app-1", [failed])
    emit(summary, str(tmp_path / "summary.json"))
    printed, written = capsys.readouterr().out, (tmp_path / "summary.json").read_text()
    assert "events" in printed and "failed" in written
    for secret in LEAKED:
        assert secret not in printed and secret not in written


def test_the_backfill_runner_prints_and_writes_no_secret(given: None, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    emit = load_spark_app("backfill_runner.py").emit

    emit(json.dumps({"stream": "events", "status": "failed", "error": error_quoting_everything()}),
         str(tmp_path / "summary.json"))
    printed, written = capsys.readouterr().out, (tmp_path / "summary.json").read_text()
    assert json.loads(written)["status"] == "failed"
    for secret in LEAKED:
        assert secret not in printed and secret not in written
