"""The Streams page's JSON routes, served by Airflow's own API server app with Sluice's plugin loaded, over lag
histories and run logs written by real runs: the numbers equal ``make status``'s and the run summaries'."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.cli import status
from sluice.cli.demo_producer import DemoProducer
from sluice.lag.observe import check
from sluice.lag.store import LagStore
from sluice_spark.runner import run_streams
from tests.helpers import events_stream, roots_in, write_catalog

pytestmark = pytest.mark.airflow
NOW = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)


def build_world(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Two streams: ``clicks`` ran twice (a file behind since), ``orders`` never ran; the lag history holds what the
    lag monitor records, the run log what the runs wrote. The catalog and the roots are in the environment."""
    catalog_path = write_catalog(tmp_path, events_stream("clicks", alerts={"warn_files": 1}),
                                 events_stream("orders", source={**events_stream()["source"], "path": "orders"}))
    monkeypatch.setenv("SLUICE_CATALOG", str(catalog_path))
    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    catalog, roots = load_catalog(catalog_path), roots_in(tmp_path)
    Path(roots.landing, "orders").mkdir(parents=True)
    clicks = DemoProducer(Path(roots.landing), seed=7, malformed_rate=0.1)
    store = LagStore.for_roots(roots)
    summaries = []
    for run in range(2):
        clicks.events_file(lines=25, now=NOW + dt.timedelta(minutes=run))
        store.record(check(catalog.get("clicks"), roots))
        summaries += run_streams(spark, catalog, ["clicks"], roots, run_id=f"ingest_clicks/manual__{run}/run_stream"
                                 ).streams
        store.record(check(catalog.get("clicks"), roots))
    clicks.events_file(lines=5, now=NOW + dt.timedelta(minutes=9))
    for stream in catalog:
        store.record(check(stream, roots, history=store.observations(stream.name)))
    return {"catalog": catalog, "roots": roots, "summaries": summaries}


@pytest.fixture
def world(spark: Any, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    return build_world(spark, tmp_path, monkeypatch)


@pytest.fixture
def client(world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    # Airflow's simple auth manager with a password, as `make run` serves off the loopback address.
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    with TestClient(create_app()) as test_client:
        yield test_client


def token(client: Any) -> dict[str, str]:
    """Log in as the simple auth manager's admin with the password it generated."""
    from airflow.configuration import AIRFLOW_HOME, conf

    passwords = Path(conf.get("core", "simple_auth_manager_passwords_file", fallback="") or
                     Path(AIRFLOW_HOME) / "simple_auth_manager_passwords.json.generated")
    password = json.loads(passwords.read_text())["admin"]
    response = client.post("/auth/token", json={"username": "admin", "password": password})
    assert response.status_code in (200, 201), response.text
    return {"Authorization": f"Bearer {response.json()['access_token']}"}


def make_status() -> dict[str, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert status.main(["--json"]) == 0
    return {report["stream"]: report for report in map(json.loads, out.getvalue().splitlines())}


def test_no_token_no_data(client: Any) -> None:
    assert client.get("/sluice/api/streams").status_code == 401
    assert client.get("/sluice/api/streams/clicks").status_code == 401
    assert client.get("/sluice/api/streams", headers={"Authorization": "Bearer not-a-token"}).status_code in (401, 403)


def test_the_streams_list_equals_make_status_and_the_run_summaries(client: Any, world: dict[str, Any]) -> None:
    response = client.get("/sluice/api/streams", headers=token(client))
    assert response.status_code == 200, response.text
    listed = {entry["stream"]: entry for entry in response.json()["streams"]}
    assert list(listed) == ["clicks", "orders"]
    reported = make_status()
    for name, entry in listed.items():
        for key in ("status", "last_batch_id", "health"):
            assert entry[key] == reported[name][key], (name, key)
        for key in ("files", "bytes", "records"):
            assert entry[key] == reported[name]["backlog"][key], (name, key)
    assert listed["clicks"]["status"] == "WARN" and listed["clicks"]["files"] == 1
    last = world["summaries"][-1]
    assert listed["clicks"]["last_run"]["run_id"] == last.run_id
    assert (listed["clicks"]["last_run"]["input_rows"], listed["clicks"]["last_run"]["output_rows"],
            listed["clicks"]["last_run"]["dead_letter_rows"]) == (last.input_rows, last.output_rows,
                                                                  last.dead_letter_rows)
    assert listed["clicks"]["trend"][-3:] == [1, 0, 1]  # a file before the second run, none after, one since
    assert listed["orders"]["last_run"] is None
    assert listed["clicks"]["links"] == {"dag": "/dags/ingest_clicks", "trigger": "/dags/ingest_clicks",
                                         "backfill": "/dags/backfill", "redrive": "/dags/redrive"}


def test_a_run_that_ended_after_the_latest_observation_is_not_hidden_by_it(spark: Any, tmp_path: Path) -> None:
    """The monitor saw a file behind and no commit; a run then committed it. The page must not show the observation
    that the run made stale (a commit "never" beside the run's rows) until the monitor looks again."""
    from sluice.operations import streams_view

    catalog = load_catalog(write_catalog(tmp_path, events_stream("clicks")))
    roots = roots_in(tmp_path)
    DemoProducer(Path(roots.landing), seed=3).events_file(lines=10, now=NOW)
    LagStore.for_roots(roots).record(check(catalog.get("clicks"), roots))
    (seen,) = streams_view.overview(catalog, roots)
    assert (seen["files"], seen["last_batch_id"]) == (1, None)

    run_streams(spark, catalog, ["clicks"], roots, run_id="ingest_clicks/manual__0/run_stream")
    (listed,) = streams_view.overview(catalog, roots)
    detail = streams_view.detail(catalog.get("clicks"), roots)

    assert (listed["files"], listed["last_batch_id"]) == (0, 0)
    assert (detail["status"]["backlog"]["files"], detail["status"]["last_batch_id"]) == (0, 0)


def test_a_streams_history(client: Any, world: dict[str, Any]) -> None:
    response = client.get("/sluice/api/streams/clicks?days=30", headers=token(client))
    assert response.status_code == 200, response.text
    detail = response.json()
    summaries = world["summaries"]
    assert [run["run_id"] for run in detail["runs"]] == [summary.run_id for summary in summaries]
    assert [(run["input_rows"], run["output_rows"], run["dead_letter_rows"]) for run in detail["runs"]] == [
        (summary.input_rows, summary.output_rows, summary.dead_letter_rows) for summary in summaries]
    assert [point["units"] for point in detail["backlog"]] == [1, 0, 1, 0, 1]
    rejected = sum(reason["rows"] for reason in detail["dead_letters"]["reasons"])
    assert rejected == sum(summary.dead_letter_rows for summary in summaries) > 0
    assert detail["dead_letters"]["samples"] and detail["health"]["status"] == "OK"
    assert [version["version"] for version in detail["versions"]][:1] == [summaries[-1].delta_version_after]
    assert client.get("/sluice/api/streams/nope", headers=token(client)).status_code == 404


def test_a_stream_whose_dag_the_user_cannot_read_is_not_shown(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy is the auth manager's; here one that denies the orders DAG stands in for a real role setup."""
    from airflow.api_fastapi.app import get_auth_manager

    manager = get_auth_manager()
    allowed = manager.is_authorized_dag
    monkeypatch.setattr(manager, "is_authorized_dag", lambda **kwargs: kwargs["details"].id != "ingest_orders"
                        and allowed(**kwargs))
    headers = token(client)
    assert [entry["stream"] for entry in client.get("/sluice/api/streams", headers=headers).json()["streams"]] == [
        "clicks"]
    assert client.get("/sluice/api/streams/orders", headers=headers).status_code == 404


def test_the_page_is_served_and_in_the_navigation(client: Any) -> None:
    page = client.get("/sluice/streams")
    assert page.status_code == 200 and "fetch(`/sluice/api/${path}`" in page.text
    plugins = client.get("/api/v2/plugins", headers=token(client)).json()["plugins"]
    [sluice] = [plugin for plugin in plugins if plugin["name"] == "sluice"]
    assert sluice["external_views"][0]["href"] == "/sluice/streams"
