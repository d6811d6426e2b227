"""An Iceberg sink's fan-out tables on the pip-only engine, against the oracle of the events files.

Each fan-out table is an Iceberg table of the sink's catalog: the good rows its ``where`` takes, its ``columns``,
its partition spec, one append snapshot per batch carrying the query id and batch id, read back by pyiceberg (not
by the writer under test). A batch Spark replays is skipped by every table that holds it; a run killed after the
sink's commit and before the fan-out tables' commits is finished by the rerun, each table taking the batch once.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.constants import INGEST_TIME_COLUMN, CommitInfo, FaultCode
from sluice.kinds.iceberg import IcebergSink
from sluice.operations.health import check_stream
from sluice.operations.maintenance import maintain
from sluice.operations.streams_view import detail, overview
from sluice.paths import Roots
from sluice.storage.delta import read_table
from sluice.storage.iceberg import IcebergTableFormat
from sluice_spark.runner import run_streams
from tests.helpers import events_stream, expected_events, roots_in, write_catalog
from tests.spark.test_crash_recovery import kill_at_then_rerun
from tests.spark.test_iceberg import iceberg_rows, iceberg_table

pytestmark = pytest.mark.spark

NOW = dt.datetime(2026, 11, 28, 8, 0, tzinfo=dt.timezone.utc)
CLICK_COLUMNS = ("event_id", "user_id", "amount")


def fanned_events() -> dict[str, Any]:
    return events_stream(sink={"format": "iceberg", "table": "bronze.events", "engine": "rs"},
                         trigger={"max_files_per_trigger": 1},
                         fan_out=[{"table": "bronze.clicks", "where": "event_type = 'click'",
                                   "columns": list(CLICK_COLUMNS), "partition_by": ["bucket(4, user_id)"]},
                                  {"table": "bronze.big", "where": "amount > 50", "partition_by": ["event_date"]}])


def fan_out_table(catalog: Any, roots: Roots, index: int) -> IcebergTableFormat:
    stream = catalog.get("events")
    assert isinstance(stream.sink, IcebergSink)
    sink = stream.sink.fan_out_sink(stream.patterns.fan_out[index])
    return IcebergTableFormat(sink.identifier, sink.catalog_properties(roots))


def clicks_rows(table: IcebergTableFormat) -> list[tuple[Any, ...]]:
    data = table.table().scan(selected_fields=CLICK_COLUMNS).to_arrow().to_pylist()
    return sorted((tuple(row[c] for c in CLICK_COLUMNS) for row in data), key=repr)


def oracle(roots: Roots) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]], int]:
    """The sink's good rows, the clicks' and the big amounts', and the dead-letter count, from the files."""
    good, bad = expected_events(Path(roots.landing) / "events")
    clicks = sorted(((row[0], row[2], row[3]) for row in good if row[1] == "click"), key=repr)
    big = [row for row in good if row[3] is not None and row[3] > 50]
    return good, clicks, big, bad


def assert_tables_equal_the_oracle(catalog: Any, roots: Roots, query_id: str, batches: list[int]) -> None:
    good, clicks, big, bad = oracle(roots)
    sink, clicks_table, big_table = iceberg_table(catalog, roots), fan_out_table(catalog, roots, 0), \
        fan_out_table(catalog, roots, 1)
    assert iceberg_rows(sink) == good
    assert clicks_rows(clicks_table) == clicks and clicks
    assert iceberg_rows(big_table) == big and big
    assert read_table(catalog.get("events").dead_letter_table_path(roots)).num_rows == bad
    for table in (sink, clicks_table, big_table):
        assert table.batches(query_id) == batches, table.name
        assert all(dict(s.summary.additional_properties)[CommitInfo.STREAM] == "events"
                   for s in table.table().snapshots())


def clicks_reader() -> dict[str, Any]:
    """A stream reading the first fan-out table by snapshot (``source.type: iceberg``), never run here."""
    return {"name": "clicks", "transform": "identity", "checkpoint": "silver/clicks", "schedule": "*/5 * * * *",
            "source": {"type": "iceberg", "table": "bronze.clicks", "schema_evolution": "none",
                       "schema": {"event_id": "string not null", "user_id": "string not null",
                                  "amount": "decimal(12,2)"}},
            "sink": {"path": "silver/clicks", "engine": "rs"}}


def test_fan_out_tables_equal_the_oracle_once_per_batch_and_a_replay_is_skipped(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, fanned_events(), clicks_reader()))
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=83, malformed_rate=0.08)
    for index in range(3):
        producer.events_file(lines=40, now=NOW + dt.timedelta(minutes=index))

    summary = run_streams(spark, catalog, ["events"], roots).streams[0]

    assert summary.status == "succeeded", summary.error
    assert_tables_equal_the_oracle(catalog, roots, summary.query_id, [0, 1, 2])
    clicks, big = fan_out_table(catalog, roots, 0), fan_out_table(catalog, roots, 1)
    assert (clicks.partitioning, big.partitioning) == (["bucket(4, user_id)"], ["event_date"])
    assert clicks.schema().names == [*CLICK_COLUMNS, INGEST_TIME_COLUMN]
    snapshots = {table.name: len(table.table().snapshots()) for table in (clicks, big)}

    # Spark replays batch 2 (its commit forgotten): every table holds it and skips it.
    commits = Path(catalog.get("events").checkpoint_path(roots)) / "commits"
    for name in ("2", ".2.crc"):
        (commits / name).unlink(missing_ok=True)
    again = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert again.status == "succeeded", again.error
    assert_tables_equal_the_oracle(catalog, roots, summary.query_id, [0, 1, 2])
    assert {table.name: len(table.table().snapshots()) for table in (clicks, big)} == snapshots

    # Maintenance and the health gate see the fan-out tables as they see the sink's.
    reports = maintain(catalog, roots, ["events"], dry_run=True)["events"]
    assert [report["role"] for report in reports] == ["sink", "fan_out[0]", "fan_out[1]", "dead_letter"]
    checkpoint = Path(catalog.get("events").checkpoint_path(roots))
    for folder in ("offsets", "commits"):  # the checkpoint goes back to batch 1: every table is ahead of it
        for name in ("2", ".2.crc"):
            (checkpoint / folder / name).unlink(missing_ok=True)
    report = check_stream(catalog.get("events"), roots)
    ahead = [f.message for f in report.findings if f.code == FaultCode.SINK_AHEAD_OF_CHECKPOINT]
    assert [message.split(" table holds")[0] for message in ahead] == [
        "the sink", "the dead_letter", "the fan_out[0]", "the fan_out[1]"]

    # A stream reading a fan-out table has its lag from that table's snapshots: every append of the clicks waits.
    waiting = overview(catalog, roots, ["clicks"])[0]
    click_appends = [c for c in clicks.commits() if c.operation == "append"]
    assert (waiting["versions"], waiting["records"]) == (len(click_appends), len(oracle(roots)[1]))

    # The Streams page shows the sink's snapshots, as it shows a Delta sink's versions and not its fan-out tables';
    # its checkpoint report names each fan-out table ahead of the checkpoint, as the gate does.
    page = detail(catalog.get("events"), roots)
    assert [row["snapshot_id"] for row in page["versions"]] == [
        commit.snapshot_id for commit in reversed(iceberg_table(catalog, roots).commits())]
    assert page["health"]["status"] == "FAIL" and "SINK_AHEAD_OF_CHECKPOINT" in page["health"]["codes"]
    assert [finding["message"].split(" table holds")[0] for finding in page["health"]["findings"]
            if finding["code"] == "SINK_AHEAD_OF_CHECKPOINT"] == [
        "the sink", "the dead_letter", "the fan_out[0]", "the fan_out[1]"]


@pytest.mark.parametrize("fault", ["between_commits:1", "before_commit:1"])
def test_a_run_killed_at_a_crash_point_then_rerun_gives_every_table_once(tmp_path: Path, fault: str) -> None:
    """``between_commits:1``: batch 1 is in the sink's table, in no fan-out table nor the dead-letter table, and
    Spark has not recorded it done: the rerun replays it, the sink's table skips it, the others take it.
    ``before_commit:1``: batch 1's sink files are written, nothing committed: the rerun writes it everywhere."""
    catalog_path = write_catalog(tmp_path, fanned_events())
    catalog = load_catalog(catalog_path)
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=84, malformed_rate=0.1)
    for index in range(3):
        producer.events_file(lines=40, now=NOW + dt.timedelta(minutes=index))
    summary_file = tmp_path / "summary.json"

    kill_at_then_rerun(catalog_path, roots, fault, tmp_path / "faults", summary=summary_file)

    query_id = json.loads(summary_file.read_text())["streams"][0]["query_id"]
    assert_tables_equal_the_oracle(catalog, roots, query_id, [0, 1, 2])
