"""The redrive DAG with real Airflow: dag.test() over a real stream's dead letters (refused, dry run, then the real
redrive), and its trigger check through Airflow's own API server app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.airflow.test_backfill_trigger import client  # noqa: F401  (the API server fixture)
from tests.airflow.test_dag_e2e import xcom_value
from tests.airflow.test_streams_page import token
from tests.spark.test_redrive import FIXED_SCHEMA, FIXED_TRANSFORM, RELAXED, bronze, define, oracle, records

pytestmark = pytest.mark.airflow
TRIGGER = "/api/v2/dags/redrive/dagRuns"


@pytest.mark.spark
def test_redrive_dag_refuses_then_dry_runs_then_redrives(spark: Any, airflow_db: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState, TaskInstanceState

    from sluice.paths import Roots
    from sluice.storage.delta import table_version
    from sluice_spark.runner import run_streams

    lines = records()
    (tmp_path / "landing" / "events").mkdir(parents=True)
    (tmp_path / "landing" / "events" / "part-1.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    monkeypatch.setenv("SLUICE_CATALOG", str(tmp_path / "catalog.yaml"))
    roots = Roots.from_env()
    assert run_streams(spark, define(tmp_path), ["events"], roots).ok
    define(tmp_path, schema=FIXED_SCHEMA, rules=RELAXED, transform=FIXED_TRANSFORM)  # the fix, deployed
    sink = f"{roots.lake}/bronze/events"
    version = table_version(sink)
    dag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags")).get_dag("redrive")

    refused = dag.test(run_conf={"stream": "events", "since": "2026-11-22T10:00:00Z", "until": "2026-11-22T09:00Z"})
    assert refused.state == DagRunState.FAILED
    assert {ti.task_id: ti.state for ti in refused.get_task_instances()} == {
        "plan": TaskInstanceState.FAILED, "redrive": TaskInstanceState.UPSTREAM_FAILED}

    # dag.test() keeps a run's conf in the DAG's params for the next: every param is given again.
    unbounded = {"stream": "events", "since": None, "until": None}
    dry = dag.test(run_conf=unbounded)  # a dry run unless told otherwise
    assert dry.state == DagRunState.SUCCESS
    [plan] = xcom_value(dag.dag_id, dry.run_id, "plan")
    [summary] = xcom_value(dag.dag_id, dry.run_id, "redrive")
    assert (plan["rows"], summary["dry_run"], summary["landed"]) == (22, True, 15)
    assert table_version(sink) == version

    run = dag.test(run_conf={**unbounded, "dry_run": False})
    assert run.state == DagRunState.SUCCESS
    [summary] = xcom_value(dag.dag_id, run.run_id, "redrive")
    assert (summary["selected"], summary["landed"], summary["still_dead"]) == (22, 15, 7)
    assert bronze(roots) == oracle(lines, schema_fixed=True, rule_relaxed=True, transform_fixed=True)


def runs(client: Any, headers: dict[str, str]) -> int:  # noqa: F811
    response = client.get(f"{TRIGGER}?limit=100", headers=headers)
    assert response.status_code == 200, response.text
    return int(response.json()["total_entries"])


@pytest.mark.parametrize(("conf", "says"), [
    ({"stream": "clicks", "since": "2026-11-22T10:00:00+01:00", "until": "2026-11-22T09:00:00+01:00"},
     "until: 2026-11-22T08:00:00+00:00 is not after since"),
    ({"stream": "clicks", "since": "2026-11-22T10:00:00"}, "since: '2026-11-22T10:00:00' has no UTC offset"),
    ({"stream": "clicks", "dry_run": True, "paths": "/etc"}, "paths: unknown param(s) paths"),
])
def test_a_refused_redrive_trigger_is_one_line_and_no_run(client: Any, conf: dict[str, Any],  # noqa: F811
                                                          says: str) -> None:
    headers = token(client)
    before = runs(client, headers)
    response = client.post(TRIGGER, json={"logical_date": None, "conf": conf}, headers=headers)
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    assert detail.startswith("redrive refused, nothing was read or written: ") and says in detail, detail
    assert runs(client, headers) == before
