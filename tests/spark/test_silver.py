"""A catalog stream with a Delta source: silver reads bronze by version, through the real runner, on the rs engine.

The oracle is the bronze table read by delta-rs: after each bronze and silver run, silver holds exactly bronze's
rows, once each, with bronze's lineage column.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.lag.observe import LagStatus, check
from sluice_spark.runner import run_streams
from tests.helpers import events_stream, roots_in, table_rows, write_catalog

pytestmark = pytest.mark.spark

NOW = dt.datetime(2026, 11, 22, 11, 0, tzinfo=dt.timezone.utc)
COLUMNS = ["event_id", "event_type", "user_id", "amount", "event_time", "event_date", "_source_file"]
SILVER = {
    "name": "events_silver",
    "source": {"type": "delta", "path": "bronze/events", "schema": {
        "event_id": "string not null", "event_type": "string not null", "user_id": "string not null",
        "amount": "decimal(12,2)", "event_time": "timestamp not null", "event_date": "date"}},
    "transform": "identity",
    "sink": {"path": "silver/events", "partition_by": ["event_date"], "engine": "rs"},
    "checkpoint": "silver/events",
    "alerts": {"warn_records": 1},
}


def test_silver_reads_each_bronze_version_once_with_its_lineage(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, events_stream(), SILVER))
    roots = roots_in(tmp_path)
    silver = catalog.get("events_silver")
    assert catalog.upstream_of(silver) is catalog.get("events")
    producer = DemoProducer(tmp_path / "landing", seed=61, malformed_rate=0.05)
    read_version, previous = -1, 0  # silver has read bronze up to this version, holding this many rows

    for round_ in range(2):
        for index in range(2):
            producer.events_file(lines=40, now=NOW + dt.timedelta(minutes=10 * round_ + index))
        run_streams(spark, catalog, ["events"], roots)
        bronze = table_rows(str(tmp_path / "lake" / "bronze" / "events"), COLUMNS)

        bronze_version = DeltaTable(str(tmp_path / "lake" / "bronze" / "events")).version()
        waiting = check(silver, roots)
        assert waiting.observation.backlog.versions == bronze_version - read_version
        assert waiting.observation.backlog.records == len(bronze) - previous
        assert waiting.status is LagStatus.WARN

        run_streams(spark, catalog, ["events_silver"], roots)
        assert table_rows(str(tmp_path / "lake" / "silver" / "events"), COLUMNS) == bronze
        assert check(silver, roots).status is LagStatus.OK
        read_version, previous = bronze_version, len(bronze)


def test_a_silver_table_with_a_missing_column_fails_with_its_name(spark: Any, tmp_path: Path) -> None:
    from sluice.errors import SluiceError

    schema = {**SILVER["source"]["schema"], "country": "string"}  # type: ignore[index]
    broken = {**SILVER, "source": {**SILVER["source"], "schema": schema}}  # type: ignore[dict-item]
    catalog = load_catalog(write_catalog(tmp_path, events_stream(), broken))
    DemoProducer(tmp_path / "landing", seed=62).events_file(lines=10, now=NOW)
    run_streams(spark, catalog, ["events"], roots_in(tmp_path))
    with pytest.raises(SluiceError, match="has no column\\(s\\) country"):
        run_streams(spark, catalog, ["events_silver"], roots_in(tmp_path))


def test_the_bundled_medallion_chain_equals_its_batch_oracles(spark: Any, tmp_path: Path) -> None:
    """The shipped catalog's bronze -> silver (dedupe) -> gold (hourly, merged) over two rounds of demo events,
    with their duplicates and stragglers: silver holds each bronze event once, and gold equals the batch
    aggregate of silver."""
    from pyspark.sql import functions as F

    catalog, roots = load_catalog(), roots_in(tmp_path)
    producer = DemoProducer(tmp_path / "landing", seed=63, malformed_rate=0.02)
    lake = tmp_path / "lake"
    for round_ in range(2):
        produced = producer.produce(files=2, lines=60, now=NOW + dt.timedelta(hours=round_))
        assert produced.duplicates and produced.late
        for name in ("events_bronze", "events_silver", "activity_hourly"):
            summary = run_streams(spark, catalog, [name], roots)
            assert summary.ok, summary.streams[0].error

        bronze = table_rows(str(lake / "bronze" / "events"), ["event_id", "event_type", "amount", "event_time"])
        silver = table_rows(str(lake / "silver" / "events"), ["event_id", "event_type", "amount", "event_time"])
        assert silver == sorted(set(bronze), key=repr) and len(silver) < len(bronze)
        frame = spark.createDataFrame(silver, "event_id string, event_type string, amount decimal(12,2), "
                                              "event_time timestamp")
        oracle = frame.groupBy(F.window("event_time", "1 hour").alias("w"), "event_type").agg(
            F.count(F.lit(1)).alias("events"), F.sum("amount").alias("revenue"))
        expected = sorted(((row.w.start.replace(tzinfo=dt.timezone.utc), row.event_type, row.events, row.revenue)
                           for row in oracle.collect()), key=repr)
        gold = table_rows(str(lake / "gold" / "activity_hourly"), ["window_start", "event_type", "events", "revenue"])
        assert sorted(((start.astimezone(dt.timezone.utc), kind, events, revenue)
                       for start, kind, events, revenue in gold), key=repr) == expected
