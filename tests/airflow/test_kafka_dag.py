"""A Kafka stream's DAG against the session's real broker (SASL/PLAIN): the run through Airflow, its lag without a
JVM, and the broker's password kept out of every command line, the task log, XCom and the run log."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.airflow.test_dag_e2e import xcom_value
from tests.kafka_data import clicks, expected, kafka_stream, new_topic, produce

pytestmark = [pytest.mark.airflow, pytest.mark.kafka]
DAGS = Path(__file__).resolve().parents[2] / "dags"


class CommandLineWatch:
    """Reads every process's command line on this machine until stopped, and keeps those that hold ``secret``."""

    def __init__(self, secret: str) -> None:
        self.secret = secret.encode()
        self.leaks: list[str] = []
        self.processes_seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> CommandLineWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.is_set():
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    command = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"spark" in command:
                    self.processes_seen.add(int(entry.name))
                if self.secret in command:
                    self.leaks.append(command.replace(b"\0", b" ").decode(errors="replace")[:300])
            self._stop.wait(0.05)


def test_a_kafka_stream_runs_through_its_dag_and_its_password_stays_secret(
        airflow_db: Path, tmp_path: Path, kafka: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    from sluice.catalog import load_catalog
    from sluice.cli.status import main as status_main
    from sluice.lag.observe import observe
    from sluice.paths import Roots
    from sluice.storage import runlog

    topic = new_topic(kafka, partitions=2)
    records = [*clicks(0, 30), b"{broken"]
    produce(kafka, topic, records, partitions=2)
    stream = kafka_stream(engine="auto", options={"subscribe": topic, "startingOffsets": "earliest"})
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"version": 1, "streams": [{**stream, "schedule": "@hourly"}]}),
                       encoding="utf-8")
    monkeypatch.setenv("SLUICE_CATALOG", str(catalog))
    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_KAFKA", kafka.airflow_connection())
    dag = DagBag(dag_folder=str(DAGS)).get_dag("ingest_clicks")

    caplog.set_level(logging.INFO)
    with CommandLineWatch(kafka.password) as watch:
        run = dag.test()

    assert run.state == DagRunState.SUCCESS
    [summary] = xcom_value(dag.dag_id, run.run_id, "run_stream")
    [result] = summary["streams"]
    good, bad = expected(records, rescue=True)
    assert (result["status"], result["input_rows"], result["output_rows"], result["dead_letter_rows"]) == \
        ("succeeded", len(records), len(good), bad)
    assert watch.processes_seen, "the watch saw the run's Spark processes"
    assert watch.leaks == [], "the password reached a command line"
    assert kafka.password not in caplog.text, "the password reached the task log"
    assert kafka.password not in json.dumps(summary)
    roots = Roots.from_env()
    rows = runlog.runs(roots.lake, "clicks")
    assert rows and kafka.password not in json.dumps(rows, default=str)

    spec = load_catalog(catalog).get("clicks")
    assert observe(spec, roots).backlog.records == 0, "lag from the broker, without a JVM"
    produce(kafka, topic, clicks(100, 5), partitions=2)
    assert observe(spec, roots).backlog.records == 5
    capsys.readouterr()
    assert status_main(["--json"]) == 0
    [line] = [json.loads(text) for text in capsys.readouterr().out.splitlines() if text.startswith("{")]
    assert (line["stream"], line["backlog"]["records"], line["health"]) == ("clicks", 5, "OK"), line
    assert line["status"] in ("OK", "WARN", "CRITICAL", "STALLED"), line
