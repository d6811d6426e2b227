"""A range backfill of an Iceberg source, by its snapshots' sequence numbers and by their commit times, against the
oracle of the landing files.

Bronze is an Iceberg table written by Sluice's Iceberg sink, one append snapshot per landing file; silver a Delta
stream reading it by snapshot. Silver loses the rows of one snapshot (a bad deploy); a backfill of that snapshot's
range appends them again, and silver equals the oracle: the rows of the landing files, decoded with the json module.
"""

from __future__ import annotations

import datetime as dt
import functools
import signal
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
from tests.spark.test_crash_recovery import BACKFILL_RUNNER, kill_application, submit, wait_for
from tests.spark.test_iceberg import iceberg_table
from tests.spark.test_iceberg_source import silver_rows, streams

pytestmark = pytest.mark.spark

NOW = dt.datetime(2026, 11, 28, 9, 0, tzinfo=dt.timezone.utc)


def appending_snapshot(bronze: Any, path: Path) -> Any:
    """The bronze snapshot that appended the landing file's rows, read by pyiceberg (a run reads files of one
    minute's mtime in no set order)."""
    for snapshot in sorted(bronze.snapshots(), key=lambda s: s.sequence_number):
        held = bronze.scan(snapshot_id=snapshot.snapshot_id, selected_fields=(SOURCE_FILE_COLUMN,)).to_arrow()
        if any(value.endswith(path.name) for value in held.column(SOURCE_FILE_COLUMN).to_pylist()):
            return snapshot
    raise AssertionError(path)


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
    snapshot_of = functools.partial(appending_snapshot, bronze)

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



@pytest.mark.slow
@pytest.mark.parametrize("fault", [
    "between_commits:1",  # batch 1 in silver, not in the dead-letter table nor the checkpoint
    "after_commit:1",  # batch 1 in both tables, the checkpoint's commits/1 not written
])
def test_a_backfill_killed_at_a_crash_point_then_retried_gives_the_oracles_table(spark: Any, tmp_path: Path,
                                                                                 fault: str) -> None:
    """Silver lost the rows of two bronze snapshots; a backfill of their sequence range, one snapshot a batch, is
    SIGKILLed at the crash point of its second batch. The retry (same run id: the frozen plan, the same checkpoint
    and query id) replays that batch, silver skips it, and silver equals the oracle, each row once. The retry runs in
    the session, through the backfill's own code."""
    from deltalake import DeltaTable

    from sluice.storage.tableformat import DeltaTableFormat
    from sluice_spark.backfill import run_backfill

    catalog_path = write_catalog(tmp_path, *streams())
    catalog, roots = load_catalog(catalog_path), roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=89, malformed_rate=0.08)
    files = [producer.events_file(lines=20, now=NOW + dt.timedelta(minutes=index)).files[0] for index in range(3)]
    for stream in ("events", "silver"):
        assert run_streams(spark, catalog, [stream], roots).streams[0].status == "succeeded"
    landing = Path(roots.landing) / "events"
    oracle = expected_events(landing)[0]
    assert silver_rows(roots) == oracle
    bronze = iceberg_table(catalog, roots).table()
    assert len(bronze.snapshots()) == 3, "one bronze snapshot per landing file"
    lost = sorted(files, key=lambda path: appending_snapshot(bronze, path).sequence_number)[1:]  # the newest two
    silver = f"{roots.lake}/silver/events"
    DeltaTable(silver).delete(" OR ".join(f"{SOURCE_FILE_COLUMN} LIKE '%{path.name}'" for path in lost))
    assert len(silver_rows(roots)) == len(oracle) - len(expected_events(landing, files=lost)[0])
    params = {"start_version": appending_snapshot(bronze, lost[0]).sequence_number,
              "end_version": appending_snapshot(bronze, lost[1]).sequence_number, "max_files_per_trigger": 1}
    faults = tmp_path / "faults"
    faults.mkdir()
    point = fault.split(":")[0]
    crashed = submit(catalog_path, roots, ("SLUICE_FAULT_POINT", fault), ("SLUICE_FAULT_DIR", str(faults)),
                     run_id="retried", log=faults / "crashed.log", stream="silver", runner=BACKFILL_RUNNER,
                     params=[f"--{name.replace('_', '-')}={value}" for name, value in params.items()])
    wait_for(faults / f"{point}.reached", crashed, faults / "crashed.log")
    kill_application(crashed, faults / f"{point}.reached")
    assert crashed.returncode == -signal.SIGKILL
    assert silver_rows(roots) == oracle, "the killed run committed both batches to silver"

    retried = run_backfill(spark, catalog, parse_request({"stream": "silver", **params}, catalog, run_id="retried"),
                           roots)

    assert retried.ok, retried.error
    assert retried.replayed_batches == [1]
    assert silver_rows(roots) == oracle  # the replayed batch once, not twice
    assert DeltaTableFormat(silver).recorded_batch(retried.query_id) == 1
