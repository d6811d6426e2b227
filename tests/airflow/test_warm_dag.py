"""Warm mode through Airflow: dag.test() of the bundled ingest DAG with the ``sluice_warm`` connection defined runs
its stream on a real warm server (no spark-submit), behind the same health gate, with the same summary in XCom."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from sluice.catalog import DEFAULT_CATALOG
from sluice.cli.demo_producer import DemoProducer
from tests.airflow.test_dag_e2e import xcom_value
from tests.helpers import expected_events, roots_in
from tests.warm_server import Server

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


def test_the_ingest_dag_runs_on_the_warm_server(airflow_db: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    roots = roots_in(tmp_path)
    for variable, root in (("SLUICE_LANDING_ROOT", roots.landing), ("SLUICE_LAKE_ROOT", roots.lake),
                           ("SLUICE_CHECKPOINT_ROOT", roots.checkpoints)):
        monkeypatch.setenv(variable, root)
    produced = DemoProducer(roots.landing, seed=33).produce(
        files=2, lines=60, now=dt.datetime(2026, 11, 23, 9, tzinfo=dt.timezone.utc))
    server = Server(tmp_path, DEFAULT_CATALOG, roots)
    try:
        connection = {"conn_type": "generic", "host": server.address.host, "port": server.address.port,
                      "password": server.token}
        monkeypatch.setenv("AIRFLOW_CONN_SLUICE_WARM", json.dumps(connection))
        dag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags")).get_dag("ingest_events_bronze")

        run = dag.test()

        assert run.state == DagRunState.SUCCESS
        [summary] = xcom_value(dag.dag_id, run.run_id, "run_stream")
        assert summary["app_id"] == server.ping()["app_id"]  # the server's application, not a new one
        [stream] = summary["streams"]
        assert stream["status"] == "succeeded" and stream["input_rows"] == produced.event_lines
        assert stream["run_id"].startswith(f"{dag.dag_id}/{run.run_id}/")
        good, bad = expected_events(Path(roots.landing) / "events", rescue=False)
        assert (stream["output_rows"], stream["dead_letter_rows"]) == (len(good), bad)
        [health] = xcom_value(dag.dag_id, run.run_id, "checkpoint_health")
        assert health["status"] == "OK"
    finally:
        server.stop()
