"""The ``jvm`` Delta engine (delta-spark's own connector), run through the real spark-submit entry point.

delta-spark's jars come from Maven Central, which this project's CI cannot reach, so the test runs only when
``SLUICE_DELTA_JARS`` names the jars (comma-separated: delta-spark and delta-storage for the installed
delta-spark version). It then checks the same bronze table as the ``rs`` engine, read back with delta-rs.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.storage.delta import read_table
from tests.helpers import events_stream, expected_events, roots_in, table_rows, write_catalog

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        not os.environ.get("SLUICE_DELTA_JARS"),
        reason="needs delta-spark's JVM jars (SLUICE_DELTA_JARS); Maven Central is unreachable from this CI",
    ),
]

RUNNER = Path(__file__).resolve().parents[2] / "spark_apps" / "stream_runner.py"


def test_jvm_engine_writes_the_same_bronze_table_exactly_once(tmp_path: Path) -> None:
    stream_def = events_stream()
    stream_def["sink"]["engine"] = "jvm"
    catalog_path = write_catalog(tmp_path, stream_def)
    stream = load_catalog(catalog_path).get("events")
    roots = roots_in(tmp_path)
    DemoProducer(roots.landing, seed=41).produce(files=2, now=dt.datetime(2026, 11, 22, tzinfo=dt.timezone.utc))
    command = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
               "--jars", os.environ["SLUICE_DELTA_JARS"], str(RUNNER), "--catalog", str(catalog_path),
               "--stream", "events", *roots.as_args()]
    for _ in range(2):  # the second run finds nothing new and must add nothing
        result = subprocess.run(command, capture_output=True, text=True, env={**os.environ,
                                "PYSPARK_PYTHON": sys.executable})
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    good, bad = expected_events(Path(roots.landing) / "events")
    columns = ["event_id", "event_type", "user_id", "amount", "event_date"]
    rows = [(*row[:4], row[4].isoformat()) for row in table_rows(stream.sink_path(roots), columns)]
    assert rows == good
    assert read_table(stream.dead_letter_table_path(roots)).num_rows == bad
