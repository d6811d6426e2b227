"""A range backfill of an Iceberg source, by its snapshots' sequence numbers and by their commit times, against the
oracle of the landing files.

Bronze is an Iceberg table written by Sluice's Iceberg sink, one append snapshot per landing file; silver a Delta
stream reading it by snapshot. Silver loses the rows of one snapshot (a bad deploy); a backfill of that snapshot's
range appends them again, and silver equals the oracle: the rows of the landing files, decoded with the json module.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.constants import SOURCE_FILE_COLUMN
from sluice.errors import BackfillError
from sluice.operations.backfill import parse_request, plan_backfill
from sluice_spark.runner import run_streams
from tests.helpers import expected_events, roots_in, write_catalog
from tests.spark.test_iceberg import iceberg_table
from tests.spark.test_iceberg_source import silver_rows, streams

pytestmark = pytest.mark.spark

NOW = dt.datetime(2026, 11, 28, 9, 0, tzinfo=dt.timezone.utc)


def test_a_lost_snapshot_is_backfilled_by_sequence_and_by_commit_time(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from sluice_spark.backfill import run_backfill

    catalog = load_catalog(write_catalog(tmp_path, *streams()))
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=88, malformed_rate=0.08)
    files = [producer.events_file(lines=30, now=NOW + dt.timedelta(minutes=index)).files[0] for index in range(3)]
    assert run_streams(spark, catalog, ["events"], roots).streams[0].status == "succeeded"
    assert run_streams(spark, catalog, ["silver"], roots).streams[0].status == "succeeded"
    landing = Path(roots.landing) / "events"
    oracle = expected_events(landing)[0]
    assert silver_rows(roots) == oracle
    bronze = iceberg_table(catalog, roots).table()

    def snapshot_of(path: Path) -> Any:
        """The bronze snapshot that appended the file's rows, read by pyiceberg."""
        for snapshot in sorted(bronze.snapshots(), key=lambda s: s.sequence_number):
            held = bronze.scan(snapshot_id=snapshot.snapshot_id, selected_fields=(SOURCE_FILE_COLUMN,)).to_arrow()
            if any(value.endswith(path.name) for value in held.column(SOURCE_FILE_COLUMN).to_pylist()):
                return snapshot
        raise AssertionError(path)

    def lose(path: Path) -> None:
        silver = DeltaTable(f"{roots.lake}/silver/events")
        silver.delete(f"{SOURCE_FILE_COLUMN} LIKE '%{path.name}'")
        assert len(silver_rows(roots)) == len(oracle) - len(expected_events(landing, files=[path])[0])

    def backfill(run_id: str, **params: Any) -> Any:
        request = parse_request({"stream": "silver", **params}, catalog, run_id=run_id)
        summary = run_backfill(spark, catalog, request, roots)
        assert summary.ok, summary.error
        return summary

    second = snapshot_of(files[1])
    lose(files[1])
    dry = backfill("dry", start_version=second.sequence_number, end_version=second.sequence_number, dry_run=True)
    assert (dry.versions["first"], dry.versions["last"]) == (second.sequence_number,) * 2
    assert dry.versions["records"] == len(expected_events(landing, files=[files[1]])[0])
    assert len(silver_rows(roots)) < len(oracle), "a dry run writes nothing"
    done = backfill("by-sequence", start_version=second.sequence_number, end_version=second.sequence_number)
    assert done.rows_written == len(expected_events(landing, files=[files[1]])[0])
    assert silver_rows(roots) == oracle

    third = snapshot_of(files[2])
    lose(files[2])
    at = dt.datetime.fromtimestamp(third.timestamp_ms / 1000, dt.timezone.utc)
    by_time = backfill("by-time", select_by="commit_time", start=at.isoformat(),
                       end=(at + dt.timedelta(milliseconds=1)).isoformat())
    assert (by_time.versions["first"], by_time.versions["last"]) == (third.sequence_number,) * 2
    assert silver_rows(roots) == oracle

    # Refused before anything is read, naming the param.
    with pytest.raises(BackfillError, match="append only"):
        parse_request({"stream": "silver", "start_version": 1, "mode": "replace"}, catalog, run_id="r")
    latest = max(s.sequence_number for s in bronze.snapshots())
    for params, field in (({"start_version": 1, "end_version": latest + 1}, "end_version"),
                          ({"end_version": 1}, "start_version")):
        with pytest.raises(BackfillError) as caught:
            plan_backfill(parse_request({"stream": "silver", **params}, catalog, run_id="r"),
                          catalog.get("silver"), roots)
        assert caught.value.field == field
