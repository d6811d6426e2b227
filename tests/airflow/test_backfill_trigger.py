"""Bad backfill params are refused when the run is triggered: through Airflow's own API server app (Sluice's plugin
loaded, the backfill DAG in the metadata database as the DAG processor writes it), a trigger whose end is before its
start, or that lacks one, answers HTTP 400 with one line, and no run is created; good params are Airflow's to take."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.test_streams_page import token
from tests.helpers import events_stream, write_catalog

pytestmark = pytest.mark.airflow
GOOD = {"stream": "clicks", "start": "2026-11-22T10:00:00+01:00", "end": "2026-11-22T12:00:00+01:00",
        "select_by": "file_time", "mode": "append", "dry_run": True}
TRIGGER = "/api/v2/dags/backfill/dagRuns"


def serialize_dags() -> None:
    """Write the project's DAGs to the metadata database, as the DAG processor would."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    bag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags"))
    assert not bag.import_errors, bag.import_errors
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(bag, "dags-folder", None)


@pytest.fixture
def client(airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    monkeypatch.setenv("SLUICE_CATALOG", str(write_catalog(tmp_path, events_stream("clicks"))))
    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    serialize_dags()
    with TestClient(create_app()) as test_client:
        yield test_client


def runs(client: Any, headers: dict[str, str]) -> int:
    response = client.get(f"{TRIGGER}?limit=100", headers=headers)
    assert response.status_code == 200, response.text
    return int(response.json()["total_entries"])


@pytest.mark.parametrize(("conf", "says"), [
    ({**GOOD, "end": "2026-11-22T09:00:00+01:00"}, "end: 2026-11-22T08:00:00+00:00 is not after start"),
    ({**GOOD, "start": "2026-11-22T10:00:00"}, "start: '2026-11-22T10:00:00' has no UTC offset"),
    ({**GOOD, "select_by": "event_time"}, "select_by: stream 'clicks' declares no backfill.event_time_column"),
    ({key: value for key, value in GOOD.items() if key != "start"}, "start: expected an ISO 8601 date-time"),
    ({**GOOD, "paths": "/etc"}, "paths: unknown param(s) paths"),
])
def test_a_refused_trigger_is_one_line_at_once_and_no_run(client: Any, conf: dict[str, Any], says: str) -> None:
    headers = token(client)
    before = runs(client, headers)
    started = time.monotonic()
    response = client.post(TRIGGER, json={"logical_date": None, "conf": conf}, headers=headers)
    assert time.monotonic() - started < 20  # at once: no run waited for (a loaded machine's first request is slow)
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    assert detail.startswith("backfill refused, nothing was read or written: ") and says in detail, detail
    assert "\n" not in detail and "Traceback" not in detail
    assert runs(client, headers) == before


def test_what_a_schema_says_airflow_refuses_and_the_form_marks_required(client: Any) -> None:
    headers = token(client)
    details = client.get("/api/v2/dags/backfill/details", headers=headers).json()
    params = details["params"]
    # The form marks a param required when its type does not admit null (the UI's own rule).
    required = {name for name, param in params.items() if "null" not in param["schema"].get("type", [])}
    assert "stream" in required and not {"start", "end", "start_version", "reason"} & required
    from sluice.operations.backfill import DATE_TIME_PATTERN
    assert params["start"]["schema"]["pattern"] == DATE_TIME_PATTERN


def test_good_params_and_other_callers_are_airflows(client: Any) -> None:
    headers = token(client)
    assert client.post(TRIGGER, json={"logical_date": None, "conf": {**GOOD, "end": "x"}}).status_code == 401
    accepted = client.post(TRIGGER, json={"logical_date": None, "conf": GOOD}, headers=headers)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["conf"] == GOOD
    # Another DAG's trigger is not looked at: Airflow answers it (here: no such DAG).
    assert client.post("/api/v2/dags/nope/dagRuns", json={"logical_date": None, "conf": {"end": "x"}},
                       headers=headers).status_code == 404
