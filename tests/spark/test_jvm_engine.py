"""The ``jvm`` Delta engine (delta-spark's own connector), run through the real spark-submit entry point with the jars
``make venv`` resolved, and what a Spark application without those jars says (a pip-only install)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.storage.delta import read_table
from tests.helpers import (
    driver_options_env,
    events_stream,
    expected_events,
    needs_jvm_jars,
    roots_in,
    spark_submit,
    table_rows,
    write_catalog,
)

pytestmark = [pytest.mark.spark, needs_jvm_jars]

PROJECT = Path(__file__).resolve().parents[2]
RUNNER = PROJECT / "spark_apps" / "stream_runner.py"
WITHOUT_JARS = Path(__file__).resolve().parent / "without_jars_app.py"


def test_jvm_engine_writes_the_same_bronze_table_exactly_once(tmp_path: Path) -> None:
    stream_def = events_stream()
    stream_def["sink"]["engine"] = "jvm"
    catalog_path = write_catalog(tmp_path, stream_def)
    stream = load_catalog(catalog_path).get("events")
    roots = roots_in(tmp_path)
    DemoProducer(roots.landing, seed=41).produce(files=2, now=dt.datetime(2026, 11, 22, tzinfo=dt.timezone.utc))
    command = spark_submit(str(RUNNER), "--catalog", str(catalog_path), "--stream", "events", *roots.as_args())
    for _ in range(2):  # the second run finds nothing new and must add nothing
        result = subprocess.run(command, capture_output=True, text=True, env={
            **os.environ, **driver_options_env(catalog_path, ["events"], roots), "PYSPARK_PYTHON": sys.executable})
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    good, bad = expected_events(Path(roots.landing) / "events")
    columns = ["event_id", "event_type", "user_id", "amount", "event_date"]
    rows = [(*row[:4], row[4].isoformat()) for row in table_rows(stream.sink_path(roots), columns)]
    assert rows == good
    assert read_table(stream.dead_letter_table_path(roots)).num_rows == bad
    history = [json.loads(line) for line in (Path(stream.sink_path(roots)) / "_delta_log").glob("*.json")
               for line in line.read_text().splitlines()]
    writers = {entry["commitInfo"].get("engineInfo", "") for entry in history if "commitInfo" in entry}
    assert any(writer.startswith("Apache-Spark") for writer in writers), writers


def test_without_the_jars_each_feature_that_needs_them_is_refused_by_name(tmp_path: Path) -> None:
    """A Spark application started without the jars (what a pip-only install runs): a Kafka source, a checkpoint on
    s3a:// and ``engine: jvm`` each fail before anything is written, naming what to provide; ``auto`` takes the rs
    engine. (The Kafka sink needs no jar: it sends from the driver with confluent-kafka.)"""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[1]", "--conf",
         "spark.ui.enabled=false", str(WITHOUT_JARS), str(tmp_path)],
        capture_output=True, text=True, env={**os.environ, "PYSPARK_PYTHON": sys.executable}, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    outcome = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("{")))
    for name in ("kafka_source",):
        message = outcome[name]
        assert "spark-sql-kafka-0-10" in message and "kafka-clients" in message and "commons-pool2" in message
        assert "spark.jars" in message and "make venv" in message, message
    assert "hadoop-aws" in outcome["s3a_checkpoint"] and "make venv" in outcome["s3a_checkpoint"]
    assert "delta-spark's classes are not on the classpath" in outcome["jvm_engine"]
    assert "make venv" in outcome["jvm_engine"] and "--packages io.delta" in outcome["jvm_engine"]
    assert outcome["auto_engine"] == "rs"
    assert outcome["tables_created"] == []
