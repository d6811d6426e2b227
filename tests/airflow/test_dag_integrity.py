"""Every DAG file parses cleanly and follows the house rules (tags, retries, one run at a time, docs)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.airflow

DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def dagbag():  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_no_import_errors(dagbag) -> None:  # type: ignore[no-untyped-def]
    assert dagbag.import_errors == {}


def test_one_ingest_dag_per_catalog_stream(dagbag) -> None:  # type: ignore[no-untyped-def]
    from sluice.catalog import load_catalog

    ingest = {dag_id for dag_id in dagbag.dag_ids if dag_id.startswith("ingest_")}
    assert ingest == {f"ingest_{stream.name}" for stream in load_catalog()}


def test_house_rules(dagbag) -> None:  # type: ignore[no-untyped-def]
    assert dagbag.dags
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        assert dag.doc_md, f"{dag_id} has no doc_md"
        assert dag.max_active_runs == 1, f"{dag_id} owns a checkpoint and must run one at a time"
        assert dag.catchup is False, f"{dag_id}: availableNow runs catch up by themselves"
        for task in dag.tasks:
            assert task.retries >= 1, f"{dag_id}.{task.task_id} has no retries"


def test_schedules_and_assets_come_from_the_catalog(dagbag) -> None:  # type: ignore[no-untyped-def]
    from sluice.catalog import load_catalog

    catalog = load_catalog()
    for stream in catalog:
        dag = dagbag.dags[f"ingest_{stream.name}"]
        upstreams = catalog.upstreams_of(stream)
        if upstreams:  # the bundled silver and gold streams run on the table they read
            assert [asset.name for asset in dag.schedule] == [f"sluice.{u.name}" for u in upstreams]
        else:
            assert dag.schedule == stream.schedule
        outlets = dag.get_task("run_stream").outlets
        assert [asset.name for asset in outlets] == [f"sluice.{stream.name}"]
        assert outlets[0].uri == f"sluice://lake/{stream.sink.path}", "asset identity must not depend on roots"


def test_dag_files_parse_fast_and_import_no_spark() -> None:
    import subprocess
    import sys

    files = sorted(str(path) for path in DAGS.glob("*.py"))
    probe = (
        "import sys, time, runpy; start = time.monotonic(); "
        f"[runpy.run_path(path) for path in {files!r}]; "
        "print(time.monotonic() - start); "
        "print(any(m == 'pyspark' or m.startswith('pyspark.') for m in sys.modules)); "
        "print('deltalake' in sys.modules)"
    )
    started = time.monotonic()
    output = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    assert time.monotonic() - started < 120
    _, imports_pyspark, imports_delta = output.strip().splitlines()[-3:]
    assert imports_pyspark == "False", "DAG files must not import pyspark at parse time"
    assert imports_delta == "False", "DAG files must not import deltalake at parse time"


def test_a_stream_reading_another_streams_table_is_scheduled_on_its_asset() -> None:
    from airflow.sdk import AssetOrTimeSchedule

    from sluice.catalog import parse_catalog
    from sluice_airflow.dag_factory import ingest_dags
    from tests.helpers import events_stream

    silver = {"name": "events_silver", "source": {"type": "delta", "path": "bronze/events",
                                                  "schema": {"event_id": "string not null"}},
              "sink": {"path": "silver/events"}, "checkpoint": "silver/events"}
    dags = ingest_dags(parse_catalog({"version": 1, "streams": [events_stream(), silver]}))
    [asset] = dags["ingest_events_silver"].schedule
    assert asset == dags["ingest_events"].get_task("run_stream").outlets[0]
    assert dags["ingest_events"].schedule == "*/5 * * * *"

    with_cron = ingest_dags(parse_catalog({"version": 1, "streams": [events_stream(), {**silver,
                                                                                      "schedule": "0 * * * *"}]}))
    schedule = with_cron["ingest_events_silver"].schedule
    assert isinstance(schedule, AssetOrTimeSchedule)
    assert schedule.asset_condition.objects == (asset,)


def test_an_iceberg_source_runs_on_its_upstream_iceberg_stream_s_commits() -> None:
    """A silver stream reading the Iceberg table a bronze stream writes is scheduled on bronze's Asset (the table, by
    catalog and identifier), as a Delta source is on its upstream's; a table of another catalog is no upstream."""
    from sluice.catalog import parse_catalog
    from sluice_airflow.dag_factory import ingest_dags
    from tests.helpers import events_stream

    bronze = events_stream(sink={"format": "iceberg", "table": "bronze.events"})
    silver = {"name": "events_silver", "source": {"type": "iceberg", "table": "bronze.events",
                                                  "schema": {"event_id": "string not null"}},
              "sink": {"path": "silver/events"}, "checkpoint": "silver/events"}
    dags = ingest_dags(parse_catalog({"version": 1, "streams": [bronze, silver]}))
    [asset] = dags["ingest_events_silver"].schedule
    assert asset == dags["ingest_events"].get_task("run_stream").outlets[0]
    assert asset.uri == "sluice://iceberg/default/bronze.events"


def test_a_join_runs_when_either_side_has_news() -> None:
    from airflow.sdk import AssetAny

    from sluice.catalog import parse_catalog
    from sluice_airflow.dag_factory import ingest_dags

    def bronze(name: str, time_column: str) -> dict[str, object]:
        return {"name": name, "source": {"type": "files", "format": "json", "path": name,
                                         "schema": {"ad_id": "string not null", time_column: "timestamp not null"}},
                "sink": {"path": f"bronze/{name}"}, "schedule": "*/5 * * * *"}

    joined = {"name": "attributed", "sink": {"path": "gold/attributed"},
              "source": {"type": "delta", "path": "bronze/impressions",
                         "schema": {"ad_id": "string not null", "shown_at": "timestamp not null"}},
              "watermark": {"column": "shown_at", "delay": "10 minutes"},
              "join": {"source": {"type": "delta", "path": "bronze/clicks",
                                  "schema": {"ad_id": "string not null", "clicked_at": "timestamp not null"}},
                       "watermark": {"column": "clicked_at", "delay": "10 minutes"}, "on": ["ad_id"],
                       "within": {"left": "shown_at", "right": "clicked_at", "max_delay": "1 hour"}}}
    dags = ingest_dags(parse_catalog({"version": 1, "streams": [
        bronze("impressions", "shown_at"), bronze("clicks", "clicked_at"), joined]}))
    schedule = dags["ingest_attributed"].schedule
    assert isinstance(schedule, AssetAny)
    assert set(schedule.objects) == {dags[f"ingest_{side}"].get_task("run_stream").outlets[0]
                                     for side in ("impressions", "clicks")}


def test_a_stream_with_arrival_runs_on_its_watched_asset_and_its_cron() -> None:
    from airflow.sdk import AssetOrTimeSchedule
    from airflow.serialization.serialized_objects import DagSerialization

    from sluice.catalog import parse_catalog
    from sluice_airflow.dag_factory import ingest_dags
    from sluice_airflow.triggers import StreamArrivalTrigger
    from tests.helpers import events_stream

    only = ingest_dags(parse_catalog({"version": 1, "streams": [events_stream(schedule=None, arrival={})]}))
    [asset] = only["ingest_events"].schedule
    [watcher] = asset.watchers
    assert isinstance(watcher.trigger, StreamArrivalTrigger) and watcher.trigger.stream == "events"
    assert only["ingest_events"].max_active_runs == 1, "never two runs of a stream at once"
    serialized = DagSerialization.to_dict(only["ingest_events"])
    assert "sluice_airflow.triggers.StreamArrivalTrigger" in str(serialized), "the watcher reaches the triggerer"

    both = ingest_dags(parse_catalog({"version": 1, "streams": [events_stream(arrival={})]}))["ingest_events"]
    assert isinstance(both.schedule, AssetOrTimeSchedule)
    assert both.schedule.asset_condition.objects == (asset,)
