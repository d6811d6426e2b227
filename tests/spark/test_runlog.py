"""The run log under the lake root: one row per stream per run in ``_sluice/runs`` (a run id written twice stays one
row), one row per micro-batch in ``_sluice/batches`` matching Spark's progress, written by real runs."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.storage import runlog
from sluice_spark.runner import run_streams
from tests.helpers import events_stream, roots_in, write_catalog

pytestmark = pytest.mark.spark

NOW = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)


def test_runs_and_batches_are_logged_once_per_run(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, events_stream(trigger={"max_files_per_trigger": 1})))
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=3, malformed_rate=0.1)
    for index in range(2):
        producer.events_file(lines=30, now=NOW + dt.timedelta(minutes=index))
    first = run_streams(spark, catalog, ["events"], roots, run_id="ingest_events/scheduled__1/run_stream").streams[0]
    producer.events_file(lines=20, now=NOW + dt.timedelta(minutes=5))
    second = run_streams(spark, catalog, ["events"], roots, run_id="ingest_events/scheduled__2/run_stream").streams[0]
    assert first.status == "succeeded", first.error
    assert second.status == "succeeded", second.error

    rows = runlog.runs(roots.lake, "events")
    assert [row["run_id"] for row in rows] == [first.run_id, second.run_id]
    for row, summary in zip(rows, (first, second), strict=True):
        assert (row["kind"], row["dag_id"], row["dag_run_id"]) == ("run", "ingest_events", summary.run_id.split("/")[1])
        for column in ("query_id", "status", "batches", "input_rows", "output_rows", "dead_letter_rows",
                       "delta_version_before", "delta_version_after"):
            assert row[column] == getattr(summary, column), column
        assert row["started_at"] <= row["ended_at"]

    logged = runlog.batches(roots.lake, "events")
    assert [(row["run_id"], row["batch_id"]) for row in logged] == [
        *((first.run_id, batch) for batch in first.batch_ids), *((second.run_id, batch) for batch in second.batch_ids)]
    assert sum(row["input_rows"] for row in logged if row["run_id"] == first.run_id) == first.input_rows
    assert all(json.loads(row["phases_ms"])["addBatch"] >= 0 and json.loads(row["sources"]) for row in logged)

    # The same run id again (Airflow's retry of the task) replaces its row: still one per run.
    again = run_streams(spark, catalog, ["events"], roots, run_id=second.run_id).streams[0]
    assert again.batches == 0
    rows = runlog.runs(roots.lake, "events")
    assert [row["run_id"] for row in rows] == [first.run_id, second.run_id]
    assert rows[1]["batches"] == 0 and rows[1]["input_rows"] == 0


def test_a_run_log_that_cannot_be_written_does_not_fail_the_run(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, events_stream()))
    roots = roots_in(tmp_path)
    DemoProducer(roots.landing, seed=4).events_file(lines=10, now=NOW)
    Path(roots.lake, "_sluice").mkdir(parents=True)
    Path(roots.lake, "_sluice", "runs").write_text("a file where the table should be")
    [run] = run_streams(spark, catalog, ["events"], roots).streams
    assert run.status == "succeeded", run.error
    assert runlog.batches(roots.lake, "events")  # what could be written was
