"""dag.test() of a real ingest DAG: real Airflow, real spark-submit, real Delta tables, summary in XCom."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml

from sluice.catalog import DEFAULT_CATALOG
from sluice.cli.demo_producer import DemoProducer
from sluice.storage.delta import commit_properties
from tests.helpers import expected_events

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


def xcom_value(dag_id: str, run_id: str, task_id: str, key: str = "return_value"):  # type: ignore[no-untyped-def]
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        query = XComModel.get_many(run_id=run_id, dag_ids=dag_id, task_ids=task_id, key=key)
        return [XComModel.deserialize_value(row) for row in session.scalars(query).all()]


def test_ingest_dag_runs_spark_end_to_end(airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    for variable, folder in (("SLUICE_LANDING_ROOT", "landing"), ("SLUICE_LAKE_ROOT", "lake"),
                             ("SLUICE_CHECKPOINT_ROOT", "checkpoints")):
        monkeypatch.setenv(variable, str(tmp_path / folder))
    produced = DemoProducer(tmp_path / "landing", seed=31).produce(
        files=2, lines=80, now=dt.datetime(2026, 11, 22, 9, tzinfo=dt.timezone.utc)
    )
    dag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags")).get_dag("ingest_events_bronze")

    run = dag.test()

    assert run.state == DagRunState.SUCCESS
    [summary] = xcom_value(dag.dag_id, run.run_id, "run_stream")
    [stream] = summary["streams"]
    assert stream["stream"] == "events_bronze" and stream["status"] == "succeeded"
    assert stream["input_rows"] == produced.event_lines
    # The bundled stream rescues an amount that is no number, then quarantines the purchase that lacks one
    # (purchase_has_amount): the same rows are dead letters as under schema_evolution none.
    good, bad = expected_events(tmp_path / "landing" / "events", rescue=False)
    assert (stream["output_rows"], stream["dead_letter_rows"]) == (len(good), bad)
    # The first version that holds rows: 1 on the rs engine (it creates the table first), 0 on the jvm engine.
    assert stream["delta_version_after"] >= 0
    assert (tmp_path / "lake" / "bronze" / "events" / "_delta_log").is_dir()
    [health] = xcom_value(dag.dag_id, run.run_id, "checkpoint_health")
    assert health["status"] == "OK" and [f["code"] for f in health["findings"]] == ["NEW"]


def test_failed_spark_run_fails_the_task_with_the_reason(airflow_db: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState
    from deltalake import DeltaTable

    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    DeltaTable.create(str(tmp_path / "lake" / "bronze" / "orders"), schema=pa.schema([("legacy", pa.string())]))
    dag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags")).get_dag("ingest_orders_bronze")

    run = dag.test()

    assert run.state == DagRunState.FAILED
    [failed] = xcom_value(dag.dag_id, run.run_id, "run_stream", key="failed_summary")
    assert failed["streams"][0]["status"] == "failed"
    assert "Evolve the table or point the stream at a new table" in failed["streams"][0]["error"]
    assert DeltaTable(str(tmp_path / "lake" / "bronze" / "orders")).version() == 0


@pytest.mark.parametrize("gate", ["task", "inline"])
def test_failed_health_check_stops_the_run_before_spark_starts(airflow_db: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch, gate: str) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState, TaskInstanceState

    bundled = yaml.safe_load(DEFAULT_CATALOG.read_text(encoding="utf-8"))
    events = next(stream for stream in bundled["streams"] if stream["name"] == "events_bronze")
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({**bundled, "streams": [{**events, "health_gate": gate}]}), encoding="utf-8")
    monkeypatch.setenv("SLUICE_CATALOG", str(catalog))
    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    DemoProducer(tmp_path / "landing", seed=33).produce(files=1)
    offsets = tmp_path / "checkpoints" / "bronze" / "events" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "0").write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}\n{"logOffset":0}')
    dag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags")).get_dag("ingest_events_bronze")

    run = dag.test()

    assert run.state == DagRunState.FAILED
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    if gate == "task":
        assert states == {"checkpoint_health": TaskInstanceState.FAILED,
                          "run_stream": TaskInstanceState.UPSTREAM_FAILED}
        [report] = xcom_value(dag.dag_id, run.run_id, "checkpoint_health", key="health_report")
    else:  # one task, which checked and stopped before spark-submit
        assert states == {"run_stream": TaskInstanceState.FAILED}
        [reports] = xcom_value(dag.dag_id, run.run_id, "run_stream", key="health_reports")
        report = reports["events_bronze"]
    assert report["status"] == "FAIL" and "METADATA_MISSING" in [f["code"] for f in report["findings"]]
    assert not xcom_value(dag.dag_id, run.run_id, "run_stream"), "no run summary: Spark never started"
    assert not (tmp_path / "lake" / "bronze" / "events").exists(), "no Spark run, no Delta table"


def _fake_checkpoint(root: Path) -> Path:
    checkpoint = root / "checkpoints" / "bronze" / "events"
    for log_name in ("offsets", "commits"):
        (checkpoint / log_name).mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id":"0b4c3b61-7f9b-4f6e-9d0a-1f1f6ad7e8a1"}')
    (checkpoint / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0,"conf":{}}\n{"logOffset":0}')
    (checkpoint / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    (checkpoint / "sources" / "0").mkdir(parents=True)  # the file source's log of batch 0, as Spark writes it
    (checkpoint / "sources" / "0" / "0").write_text('v1\n{"path":"file:///landing/events/a.json","timestamp":0,'
                                                    '"batchId":0}')
    return checkpoint


def test_repair_dag_backs_up_on_confirmation_only(airflow_db: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    checkpoint = _fake_checkpoint(tmp_path)
    dag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags")).get_dag("checkpoint_repair")

    refused = dag.test(run_conf={"stream": "events_bronze", "action": "backup", "confirm": False})
    assert refused.state == DagRunState.FAILED
    assert not list(checkpoint.parent.glob("events.backup-*"))

    run = dag.test(run_conf={"stream": "events_bronze", "action": "backup", "confirm": True})
    assert run.state == DagRunState.SUCCESS
    [result] = xcom_value(dag.dag_id, run.run_id, "repair")
    backup = Path(result["backup"])
    assert backup.parent == checkpoint.parent and (backup / "offsets" / "0").exists()


def test_reset_through_the_repair_dag_then_the_ingest_dag_gives_the_exact_table(
    spark: object, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented reset procedure, as an operator follows it in the UI: read the history, pick the version to
    resume after, reset with confirmation, let the next scheduled run read the rest."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    from sluice.catalog import load_catalog
    from sluice.paths import Roots
    from sluice_spark.runner import run_streams
    from tests.helpers import table_rows

    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    catalog, roots = load_catalog(), Roots.from_env()
    producer = DemoProducer(tmp_path / "landing", seed=35)
    for hour in (9, 10):
        producer.events_file(lines=40, now=dt.datetime(2026, 11, 22, hour, tzinfo=dt.timezone.utc))
        assert run_streams(spark, catalog, ["events_bronze"], roots).ok
    sink = catalog.get("events_bronze").sink_path(roots)
    dags = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags"))
    repair = dags.get_dag("checkpoint_repair")

    looked = repair.test(run_conf={"stream": "events_bronze", "action": "history"})
    assert looked.state == DagRunState.SUCCESS, "history is read-only and needs no confirmation"
    [listing] = xcom_value(repair.dag_id, looked.run_id, "repair")
    [first_batch] = [entry["version"] for entry in listing["versions"] if entry["batch_id"] == 0]

    reset = repair.test(run_conf={"stream": "events_bronze", "action": "reset", "version": first_batch,
                                  "confirm": True})
    assert reset.state == DagRunState.SUCCESS
    [result] = xcom_value(repair.dag_id, reset.run_id, "repair")
    assert result["resumes_after_batch"] == 0
    [health] = xcom_value(repair.dag_id, reset.run_id, "health_after_repair")
    assert health["status"] == "OK"

    run = dags.get_dag("ingest_events_bronze").test()

    assert run.state == DagRunState.SUCCESS
    # The bundled stream rescues an amount that is no number, then quarantines the purchase that lacks one
    # (purchase_has_amount): the same rows are dead letters as under schema_evolution none.
    good, bad = expected_events(tmp_path / "landing" / "events", rescue=False)
    assert table_rows(sink, ["event_id"]) == sorted((row[0],) for row in good)
    dead_letter = catalog.get("events_bronze").dead_letter_table_path(roots)
    assert len(table_rows(dead_letter, ["raw_record"])) == bad


def test_backfill_dag_with_conf_runs_the_real_spark_job(
    spark: object, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState, TaskInstanceState
    from deltalake import DeltaTable

    from sluice.catalog import load_catalog
    from sluice.paths import Roots
    from sluice_spark.runner import run_streams
    from tests.helpers import table_rows

    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    catalog, roots = load_catalog(), Roots.from_env()
    start = dt.datetime(2026, 11, 22, 9, tzinfo=dt.timezone.utc)
    DemoProducer(tmp_path / "landing", seed=37).events_file(lines=40, now=start + dt.timedelta(minutes=30))
    assert run_streams(spark, catalog, ["events_bronze"], roots).ok
    sink = catalog.get("events_bronze").sink_path(roots)
    DeltaTable(sink).delete("event_type = 'click'")  # rows lost downstream of the stream: replace restores them
    version = DeltaTable(sink).version()
    dag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags")).get_dag("backfill")
    conf = {"stream": "events_bronze", "start": "2026-11-22T10:00:00+01:00", "end": "2026-11-22T12:00:00+01:00",
            "mode": "replace", "dry_run": False, "reason": "clicks were deleted by mistake"}

    refused = dag.test(run_conf={**conf, "start": "2026-11-22T10:00:00"})
    assert refused.state == DagRunState.FAILED
    states = {ti.task_id: ti.state for ti in refused.get_task_instances()}
    assert states == {"plan": TaskInstanceState.FAILED, "backfill": TaskInstanceState.UPSTREAM_FAILED}
    assert DeltaTable(sink).version() == version, "a refused backfill writes nothing"

    run = dag.test(run_conf=conf)

    assert run.state == DagRunState.SUCCESS
    [plan] = xcom_value(dag.dag_id, run.run_id, "plan")
    [summary] = xcom_value(dag.dag_id, run.run_id, "backfill")
    good, _ = expected_events(tmp_path / "landing" / "events", between=(start, start + dt.timedelta(hours=2)),
                              rescue=False)  # as above: a rescued purchase without an amount is quarantined
    assert plan["file_count"] == 1 and summary["status"] == "succeeded"
    assert summary["rows_written"] == len(good) and summary["delta_version_after"] == version + 1
    assert table_rows(sink, ["event_id"]) == sorted((row[0],) for row in good)
    assert commit_properties(DeltaTable(sink).history(1)[0])["sluice.backfill.reason"] == \
        "clicks were deleted by mistake"


def test_maintenance_dag_compacts_the_streams_it_is_given(airflow_db: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The delta_maintenance DAG over a bronze table of five small commits (written by delta-rs): triggered for one
    stream, that stream's table is compacted and the other streams' tasks and the run log's are skipped; a vacuum
    retention under the table's own fails the run and changes nothing."""
    import pyarrow as pa
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState, TaskInstanceState
    from deltalake import DeltaTable, write_deltalake

    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    table = tmp_path / "lake" / "bronze" / "events"
    for index in range(5):
        write_deltalake(str(table), pa.table({"event_id": [f"e{index}a", f"e{index}b"]}), mode="append")
    rows = sorted(DeltaTable(str(table)).to_pyarrow_table().column("event_id").to_pylist())
    def maintenance_dag():  # type: ignore[no-untyped-def]
        # dag.test() leaves one run's conf in the DAG's params: each run gets a DAG of its own.
        return DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags")).get_dag("delta_maintenance")

    refused = maintenance_dag().test(run_conf={"streams": ["events_bronze"], "vacuum_retention_hours": 1})
    assert refused.state == DagRunState.FAILED
    assert DeltaTable(str(table)).version() == 4

    dag = maintenance_dag()
    run = dag.test(run_conf={"streams": ["events_bronze"]})
    assert run.state == DagRunState.SUCCESS
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states.pop("maintain_events_bronze") == TaskInstanceState.SUCCESS
    assert set(states.values()) == {TaskInstanceState.SKIPPED}, "the other streams and the run log are left alone"
    [reports] = xcom_value(dag.dag_id, run.run_id, "maintain_events_bronze")
    sink = next(report for report in reports if report["role"] == "sink")
    assert (sink["files_before"], sink["files_after"], sink["version_after"]) == (5, 1, 5)
    assert sorted(DeltaTable(str(table)).to_pyarrow_table().column("event_id").to_pylist()) == rows
