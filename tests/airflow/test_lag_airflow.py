"""The lag trigger, the deferrable sensor and the lag monitor DAG, in real Airflow against real landing zones.

Backlogs are real files; "back to OK" is a real Spark run. The webhook is a local HTTP server that records what it
receives. There is no SMTP server here, so email is covered by building the provider's notifier, not by sending.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import email
import json
import socketserver
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice_airflow.sensors import StreamLagSensor
from sluice_airflow.triggers import StreamLagTrigger
from tests.airflow.test_dag_e2e import xcom_value
from tests.helpers import events_stream, roots_in, write_catalog

pytestmark = pytest.mark.airflow
DAGS = Path(__file__).resolve().parents[2] / "dags"
NOW = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A catalog with one stream (WARN at 2 unread files, CRITICAL at 4), its roots in the environment."""
    catalog = write_catalog(tmp_path, events_stream(alerts={"warn_files": 2, "critical_files": 4}))
    monkeypatch.setenv("SLUICE_CATALOG", str(catalog))
    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    return tmp_path


def land(folder: Path, count: int, *, minute: int) -> None:
    producer = DemoProducer(folder / "landing", seed=minute, malformed_rate=0.0)
    for index in range(count):
        producer.events_file(lines=10, now=NOW + dt.timedelta(minutes=minute + index))


def roots_dict(folder: Path) -> dict[str, str]:
    roots = roots_in(folder)
    return {"landing": roots.landing, "lake": roots.lake, "checkpoints": roots.checkpoints}


def test_trigger_serialize_round_trips() -> None:
    from airflow.sdk._shared.module_loading import import_string

    trigger = StreamLagTrigger(stream="events", catalog="/srv/catalog.yaml", roots={"landing": "/l", "lake": "/k",
                                                                                    "checkpoints": "/c"},
                               max_status="WARN", poke_interval=5.0, deadline=1_795_000_000.0)
    classpath, kwargs = trigger.serialize()
    assert classpath == "sluice_airflow.triggers.StreamLagTrigger"
    assert json.loads(json.dumps(kwargs)) == kwargs
    assert import_string(classpath)(**kwargs).serialize() == (classpath, kwargs)


def test_trigger_run_fires_when_caught_up_and_times_out_otherwise(world: Path) -> None:
    land(world, 3, minute=0)

    async def first_event(trigger: StreamLagTrigger) -> Any:
        return await anext(trigger.run())

    def trigger(**kwargs: Any) -> StreamLagTrigger:
        return StreamLagTrigger(stream="events", catalog=str(world / "catalog.yaml"), roots=roots_dict(world),
                                **kwargs)

    event = asyncio.run(first_event(trigger(max_status="WARN")))
    assert event.payload["status"] == "success" and event.payload["checks"] == 1
    assert event.payload["report"]["backlog"]["files"] == 3

    started = time.time()
    # The deadline leaves room for a second check on a loaded machine, where one check can take most of a second.
    event = asyncio.run(first_event(trigger(max_status="OK", poke_interval=0.1, deadline=started + 3)))
    assert event.payload["status"] == "timeout"
    assert event.payload["checks"] >= 2, "it polls until the deadline"
    assert event.payload["report"]["status"] == "WARN"


def test_the_trigger_reads_a_store_with_its_connection_and_keeps_it_to_itself(
        world: Path, s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A landing zone and checkpoints on a real S3-compatible server, the credentials only in the Airflow connection:
    the trigger reads the connection on the triggerer and scopes it to its own checks. The triggerer's environment,
    which other triggers share, never holds the secret."""
    import os

    from sluice.storage import store
    from tests.object_store import upload, uri

    land(world, 3, minute=0)
    upload(world / "landing", uri(s3, "landing"))
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP"):
        monkeypatch.delenv(name)
    store._store.cache_clear()  # the upload's client read the environment's credentials
    secret = "sluice-test-secret"  # moto takes any; the point is where it goes
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_STORAGE", json.dumps({
        "conn_type": "aws", "login": "sluice-test", "password": secret,
        "extra": {"region_name": "us-east-1", "endpoint_url": endpoint}}))
    roots = {"landing": uri(s3, "landing"), "lake": uri(s3, "lake"), "checkpoints": uri(s3, "checkpoints")}
    trigger = StreamLagTrigger(stream="events", catalog=str(world / "catalog.yaml"), roots=roots,
                               max_status="WARN", storage_conn_id="sluice_storage")
    assert "sluice_storage" in json.dumps(trigger.serialize()) and secret not in json.dumps(trigger.serialize())

    async def first_event() -> Any:
        return await anext(trigger.run())

    event = asyncio.run(first_event())

    assert event.payload["status"] == "success" and event.payload["report"]["backlog"]["files"] == 3
    assert secret not in os.environ.values(), "the triggerer's environment never holds the connection"
    assert secret not in json.dumps(event.payload)


class RecordingLagSensor(StreamLagSensor):
    """The real sensor; the test learns when its check in the worker has run."""

    checked = threading.Event()

    def _report(self):  # type: ignore[no-untyped-def]
        report = super()._report()
        type(self).checked.set()
        return report


def sensor_dag(dag_id: str, **sensor_kwargs: Any):  # type: ignore[no-untyped-def]
    """A DAG with the sensor, written to the metadata database as the DAG processor would (dag.test needs it)."""
    import os

    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.sdk import DAG

    with DAG(dag_id, schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), catchup=False,
             tags=["test"]) as dag:
        RecordingLagSensor(task_id="wait_for_events", stream="events", deferrable=True, **sensor_kwargs)
    bag = DagBag(dag_folder=os.devnull)
    bag.bag_dag(dag)
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(bag, "dags-folder", None)
    return dag


@pytest.mark.spark
def test_deferred_sensor_succeeds_on_the_triggerer_once_a_run_catches_up(airflow_db: Path, spark: Any,
                                                                           world: Path) -> None:
    from airflow.utils.state import TaskInstanceState

    from sluice_spark.runner import run_streams

    land(world, 3, minute=0)
    RecordingLagSensor.checked.clear()

    def catch_up() -> None:
        RecordingLagSensor.checked.wait(120)
        run_streams(spark, load_catalog(world / "catalog.yaml"), ["events"], roots_in(world))

    runner = threading.Thread(target=catch_up)
    runner.start()
    dag = sensor_dag("lag_sensor_catches_up", poke_interval=0.5, timeout=300)
    run = dag.test()
    runner.join()

    assert run.get_task_instance("wait_for_events").state == TaskInstanceState.SUCCESS
    [report] = xcom_value(dag.dag_id, run.run_id, "wait_for_events")
    assert report["status"] == "OK" and report["backlog"]["files"] == 0
    assert report["checks_on_triggerer"] >= 1, "the sensor deferred: the triggerer saw it catch up"


def test_deferred_sensor_times_out_and_soft_fails(airflow_db: Path, world: Path) -> None:
    from airflow.utils.state import TaskInstanceState

    land(world, 3, minute=0)
    skipped = sensor_dag("lag_sensor_soft_fails", poke_interval=0.2, timeout=1, soft_fail=True).test()
    assert skipped.get_task_instance("wait_for_events").state == TaskInstanceState.SKIPPED
    failed = sensor_dag("lag_sensor_fails", poke_interval=0.2, timeout=1, retries=0).test()
    assert failed.get_task_instance("wait_for_events").state == TaskInstanceState.FAILED


class _Recorder(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.calls.append((self.path, json.loads(body)))  # type: ignore[attr-defined]
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """A local webhook endpoint behind the ``sluice_alert_webhook`` connection; the secret path is its password."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.calls = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_ALERT_WEBHOOK", json.dumps({
        "conn_type": "http", "host": f"http://127.0.0.1:{server.server_address[1]}/services",
        "password": "T000/B000/secret"}))
    yield server.calls  # type: ignore[attr-defined]
    server.shutdown()


class _SmtpSession(socketserver.StreamRequestHandler):
    """Just enough of SMTP (RFC 5321) for smtplib without TLS or auth: it keeps each message it is sent."""

    def reply(self, line: str) -> None:
        self.wfile.write(f"{line}\r\n".encode())

    def handle(self) -> None:
        self.reply("220 localhost ESMTP test")
        while line := self.rfile.readline().decode().strip():
            verb = line.split(" ", 1)[0].upper()
            if verb == "EHLO":
                self.reply("250-localhost")
                self.reply("250 8BITMIME")
            elif verb == "DATA":
                self.reply("354 end with <CRLF>.<CRLF>")
                lines = []
                while (data := self.rfile.readline().decode()) not in (".\r\n", ""):
                    lines.append(data)
                self.server.messages.append(email.message_from_string("".join(lines)))  # type: ignore[attr-defined]
                self.reply("250 OK")
            elif verb == "QUIT":
                self.reply("221 bye")
                return
            else:
                self.reply("250 OK")


@pytest.fixture
def smtp(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """A local SMTP server behind Airflow's ``smtp_default`` connection (no TLS, no auth)."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _SmtpSession)
    server.daemon_threads = True
    server.messages = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": server.server_address[1],
        "extra": {"disable_ssl": True, "disable_tls": True, "from_email": "sluice@example.com", "retry_limit": 0}}))
    yield server.messages  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


@pytest.mark.spark
def test_monitor_alerts_once_escalates_and_resolves(airflow_db: Path, spark: Any, world: Path,
                                                    webhook: list[tuple[str, dict[str, Any]]],
                                                    smtp: list[Any]) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    from sluice.lag.store import LagStore
    from sluice_spark.runner import run_streams

    write_catalog(world, events_stream(alerts={"warn_files": 2, "critical_files": 4,
                                               "email_to": ["oncall@example.com"]}))
    dag = DagBag(dag_folder=str(DAGS / "lag_monitor.py")).get_dag("lag_monitor")
    sent: list[list[str]] = []

    def tick() -> None:
        before = len(webhook)
        assert dag.test().state == DagRunState.SUCCESS
        sent.append([f"{body['sluice']['kind']} {body['sluice']['status']}" for _, body in webhook[before:]])

    tick()                      # nothing unread: OK
    land(world, 2, minute=0)
    tick()                      # WARN: fires
    tick()                      # still WARN: no repeat
    land(world, 2, minute=10)
    tick()                      # CRITICAL: escalates
    tick()                      # no repeat
    run_streams(spark, load_catalog(world / "catalog.yaml"), ["events"], roots_in(world))
    tick()                      # back to OK: resolves
    assert sent == [[], ["FIRING WARN"], [], ["ESCALATED CRITICAL"], [], ["RESOLVED OK"]]
    assert {path for path, _ in webhook} == {"/services/T000/B000/secret"}
    assert webhook[1][1]["text"].startswith("[Sluice] CRITICAL: stream events (was WARN)")
    assert webhook[1][1]["sluice"]["report"]["backlog"]["files"] == 4
    assert LagStore(world / "checkpoints" / "_sluice" / "lag.sqlite").count("events") == 6
    assert [message["Subject"] for message in smtp] == [
        "[Sluice] WARN: stream events", "[Sluice] CRITICAL: stream events (was WARN)",
        "[Sluice] RESOLVED: stream events is back to OK (was CRITICAL)"]
    assert {message["To"] for message in smtp} == {"oncall@example.com"}


def test_a_failed_channel_fails_the_run_and_sends_on_the_next_run_without_repeats_elsewhere(
        airflow_db: Path, world: Path, webhook: list[tuple[str, dict[str, Any]]], smtp: list[Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState, TaskInstanceState

    write_catalog(world, events_stream(alerts={"warn_files": 2, "email_to": ["oncall@example.com"]}))
    dag = DagBag(dag_folder=str(DAGS / "lag_monitor.py")).get_dag("lag_monitor")
    dag.get_task("alert").retries = 0  # the retry is the next scheduled run; do not wait for it
    land(world, 2, minute=0)
    working = os.environ["AIRFLOW_CONN_SMTP_DEFAULT"]
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", json.dumps({**json.loads(working), "port": 9}))
    failed = dag.test()
    assert failed.state == DagRunState.FAILED
    assert failed.get_task_instance("observe").state == TaskInstanceState.SUCCESS
    assert [body["sluice"]["kind"] for _, body in webhook] == ["FIRING"]
    assert smtp == []

    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", working)
    assert dag.test().state == DagRunState.SUCCESS
    assert [message["Subject"] for message in smtp] == ["[Sluice] WARN: stream events"]
    assert len(webhook) == 1, "the webhook already sent it"


def test_webhook_errors_never_carry_the_secret_path(airflow_db: Path, world: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    from airflow.dag_processing.dagbag import DagBag

    from sluice.lag.store import LagStore

    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_ALERT_WEBHOOK", json.dumps({
        "conn_type": "http", "host": "http://127.0.0.1:9/services", "password": "T000/B000/secret"}))
    dag = DagBag(dag_folder=str(DAGS / "lag_monitor.py")).get_dag("lag_monitor")
    dag.get_task("alert").retries = 0
    land(world, 2, minute=0)
    run = dag.test()
    [failed] = [ti for ti in run.get_task_instances() if ti.task_id == "alert"]
    assert failed.state == "failed"
    out, err = capfd.readouterr()
    log = out + err
    assert "webhook 'sluice_alert_webhook' is unreachable" in log
    assert "secret" not in log
    store = LagStore(world / "checkpoints" / "_sluice" / "lag.sqlite")
    assert store.alert_state("events", "webhook") is None and store.alert_state("events", "log") is not None


def test_monitor_triggers_a_catch_up_run_only_when_none_is_active(airflow_db: Path, world: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState

    write_catalog(world, events_stream(alerts={"warn_files": 2, "critical_files": 4, "catch_up": True}))
    land(world, 4, minute=0)
    dag = DagBag(dag_folder=str(DAGS / "lag_monitor.py")).get_dag("lag_monitor")

    def catch_up_runs() -> list[Any]:
        with create_session() as session:
            return list(session.query(DagRun).filter(DagRun.dag_id == "ingest_events"))

    first = dag.test()
    assert first.state == DagRunState.SUCCESS
    assert xcom_value("lag_monitor", first.run_id, "observe") == [["ingest_events"]]
    [triggered] = catch_up_runs()
    assert triggered.conf == {"reason": "lag_monitor catch-up"}
    assert triggered.state in (DagRunState.QUEUED, DagRunState.RUNNING)

    second = dag.test()
    assert xcom_value("lag_monitor", second.run_id, "observe") == [[]]
    assert len(catch_up_runs()) == 1, "a run is already queued: no second catch-up"
