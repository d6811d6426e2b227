"""A group of streams in one Spark application from one DAG: dag.test() with real spark-submit and real Delta tables.

The oracle is the landed files parsed with the json module (``expected_events``)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from sluice.cli.demo_producer import DemoProducer
from tests.airflow.test_dag_e2e import xcom_value
from tests.helpers import events_stream, expected_events, table_rows, write_catalog

pytestmark = [pytest.mark.airflow, pytest.mark.spark]
BRONZE = ["event_id", "event_type", "user_id", "amount", "event_date"]


@pytest.mark.parametrize("gate", ["task", "inline"])
def test_a_failed_health_gate_stops_only_its_stream(airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    gate: str) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState, TaskInstanceState

    catalog = write_catalog(tmp_path, events_stream("clicks", group="pair", health_gate=gate),
                            events_stream("views", group="pair", health_gate=gate))
    monkeypatch.setenv("SLUICE_CATALOG", str(catalog))
    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    DemoProducer(tmp_path / "landing", seed=41).produce(files=2, lines=40,
                                                        now=dt.datetime(2026, 11, 23, 9, tzinfo=dt.timezone.utc))
    views = tmp_path / "checkpoints" / "bronze" / "views"
    views.mkdir(parents=True)
    (views / "metadata").write_text("not json")  # METADATA_CORRUPT: a FAIL of the health gate

    dags = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags"))
    assert "ingest_clicks" not in dags.dag_ids and "ingest_views" not in dags.dag_ids
    dag = dags.get_dag("ingest_group_pair")
    gates = {"health_clicks": TaskInstanceState.SUCCESS, "health_views": TaskInstanceState.FAILED} \
        if gate == "task" else {}
    assert {task.task_id for task in dag.tasks} == {*gates, "run_streams"}
    run = dag.test()

    assert run.state == DagRunState.FAILED
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states == {**gates, "run_streams": TaskInstanceState.FAILED}
    if gate == "inline":
        [reports] = xcom_value(dag.dag_id, run.run_id, "run_streams", key="health_reports")
        assert {name: report["status"] for name, report in reports.items()} == {"clicks": "OK", "views": "FAIL"}
        assert "METADATA_CORRUPT" in [finding["code"] for finding in reports["views"]["findings"]]
    [summary] = xcom_value(dag.dag_id, run.run_id, "run_streams")
    assert [(stream["stream"], stream["status"]) for stream in summary["streams"]] == [("clicks", "succeeded")]
    good, _ = expected_events(tmp_path / "landing" / "events")
    assert [(*row[:4], row[4].isoformat()) for row in table_rows(str(tmp_path / "lake" / "bronze" / "clicks"),
                                                                BRONZE)] == good
    assert not (tmp_path / "lake" / "bronze" / "views").exists(), "the stream whose gate failed wrote nothing"
    assert (views / "metadata").read_text() == "not json"
