"""Backfills with real Spark into tables that a real stream filled: replace, append, dry run, daylight saving.

The oracle is the json module over the landing files (tests.helpers.expected_events), never the code under test.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from sluice.catalog import Catalog, load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.constants import DeltaEngine
from sluice.operations.backfill import parse_request
from sluice.operations.jars import spark_jars
from sluice.paths import Roots
from sluice.storage.delta import commit_properties
from sluice_spark.backfill import run_backfill
from sluice_spark.runner import run_streams
from tests.helpers import (
    events_stream,
    expected_events,
    fresh_world,
    keep_pristine,
    roots_in,
    table_rows,
    write_catalog,
)

pytestmark = pytest.mark.spark

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 22, 8, 0, tzinfo=UTC)
COLUMNS = ["event_id", "event_type", "user_id", "amount"]
# The range backfilled: the second and third files' events, minus their late ones.
START, END = NOW + dt.timedelta(minutes=50), NOW + dt.timedelta(hours=2, minutes=10)


@pytest.fixture(scope="module")
def golden(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three hourly files ingested by a real stream run; each test gets a fresh copy at the same path (the file
    source log records absolute paths). ``maxFileAge`` is one hour, so a file restored with old times is never
    read by the stream."""
    folder = tmp_path_factory.mktemp("backfill") / "world"
    folder.mkdir()
    write_catalog(folder, events_stream(
        source={**events_stream()["source"], "options": {"recursiveFileLookup": True, "pathGlobFilter": "*.json",
                                                          "maxFileAge": "1h"}},
        backfill={"event_time_column": "event_time", "max_range_days": 3},
    ))
    producer = DemoProducer(folder / "landing", seed=61, malformed_rate=0.05, late_rate=0.2)
    for hour in range(3):
        produced = producer.events_file(lines=30, now=NOW + dt.timedelta(hours=hour))
        stamp = (NOW + dt.timedelta(hours=hour)).timestamp()
        os.utime(produced.files[0], (stamp, stamp))
    assert run_streams(spark, load_catalog(folder / "catalog.yaml"), ["events"], roots_in(folder)).ok
    return keep_pristine(folder)


@pytest.fixture
def world(golden: Path) -> tuple[Catalog, Roots, Path]:
    return fresh_world(golden)


def request(catalog: Catalog, run_id: str, **params: Any) -> Any:
    defaults = {"stream": "events", "start": START.isoformat(), "end": END.isoformat(), "mode": "replace"}
    return parse_request({**defaults, **params}, catalog, run_id=run_id)


def rows(roots: Roots, **where: Any) -> list[tuple[Any, ...]]:
    return table_rows(Path(roots.lake, "bronze", "events").as_posix(), COLUMNS, **where)


def in_range(row: tuple[Any, ...], times: dict[str, dt.datetime]) -> bool:
    return START <= times[row[0]] < END


def event_times(landing: Path) -> dict[str, dt.datetime]:
    times = {}
    for path in landing.rglob("*.json"):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
                times[record["event_id"]] = dt.datetime.fromisoformat(record["event_time"])
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return times


def checkpoint_digest(checkpoint: Path) -> dict[str, str]:
    return {str(p.relative_to(checkpoint)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(checkpoint.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("engine", ["rs", "jvm"])
def test_replace_repairs_the_range_only_and_twice_is_the_same(spark: Any, world: tuple[Catalog, Roots, Path],
                                                              engine: str) -> None:
    """The replace backfill on each engine, over a table the rs engine wrote: one commit swaps the range."""
    if engine == "jvm" and not spark_jars():
        pytest.skip("needs the JVM jars (delta-spark): `make venv` with Maven")
    backfill_engine = DeltaEngine(engine)
    catalog, roots, folder = world
    landing = folder / "landing" / "events"
    sink = catalog.get("events").sink_path(roots)
    live = Path(catalog.get("events").checkpoint_path(roots))
    live_before = checkpoint_digest(live)
    times = event_times(landing)
    # Corrupt every amount, inside the range and outside it.
    DeltaTable(sink).update(updates={"amount": "amount + 1000"}, predicate="amount IS NOT NULL")
    corrupted = rows(roots)

    dry = run_backfill(spark, catalog, request(catalog, "dry", dry_run=True), roots, engine=backfill_engine)
    version = DeltaTable(sink).version()
    assert dry.ok and dry.delta_version_after == version and rows(roots) == corrupted, "a dry run writes nothing"
    wanted_in_range = [row[:4] for row in expected_events(landing, between=(START, END))[0]]
    assert dry.rows_written == len(wanted_in_range) and dry.rows_replaced == len(wanted_in_range)
    assert dry.files == 2 and dry.pending_files == 0, "the file written before the range holds none of it"

    summary = run_backfill(spark, catalog, request(catalog, "first", reason="amounts were corrupted"), roots,
                           engine=backfill_engine)

    assert summary.ok and summary.batches == 1
    assert summary.delta_version_after == version + 1, "the range is swapped in one commit"
    assert summary.input_rows == summary.rows_written + summary.rows_outside_range + summary.dead_letter_rows
    after = rows(roots)
    assert sorted((r for r in after if in_range(r, times)), key=repr) == sorted(wanted_in_range, key=repr)
    assert [r for r in after if not in_range(r, times)] == [r for r in corrupted if not in_range(r, times)]
    commit = DeltaTable(sink).history(1)[0]
    info = commit_properties(commit)
    assert (info["sluice.backfill.runId"], info["sluice.backfill.reason"]) == ("first", "amounts were corrupted")

    again = run_backfill(spark, catalog, request(catalog, "second"), roots, engine=backfill_engine)
    assert again.ok and rows(roots) == after, "the same backfill again gives the same table"
    assert checkpoint_digest(live) == live_before, "the live checkpoint is byte-for-byte unchanged"

    producer = DemoProducer(folder / "landing", seed=62)
    new = producer.events_file(lines=12, now=NOW + dt.timedelta(hours=3))
    stream = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert stream.batches == 1 and stream.input_rows == len(new.files[0].read_text().splitlines())


def test_append_fills_a_file_the_stream_never_reads_once(spark: Any, world: tuple[Catalog, Roots, Path]) -> None:
    catalog, roots, folder = world
    two_days_ago = NOW - dt.timedelta(days=2)
    archive = DemoProducer(folder / "landing", seed=63, malformed_rate=0.1).events_file(lines=25, now=two_days_ago)
    stamp = two_days_ago.timestamp()
    os.utime(archive.files[0], (stamp, stamp))
    # Older than the stream's maxFileAge horizon: the live stream skips it for good.
    assert run_streams(spark, catalog, ["events"], roots).streams[0].batches == 0
    before = rows(roots)
    dead_letter = catalog.get("events").dead_letter_table_path(roots)
    dead_before = len(table_rows(dead_letter, ["raw_record"]))
    window = {"start": (two_days_ago - dt.timedelta(hours=1)).isoformat(), "end": (NOW + dt.timedelta(hours=3))
              .isoformat(), "select_by": "file_time", "mode": "append", "max_files_per_trigger": 1}

    summary = run_backfill(spark, catalog, request(catalog, "archive", **window), roots)

    good, bad = expected_events(folder / "landing", files=archive.files)
    assert summary.ok and summary.files == 1 and summary.held_files == 3
    assert (summary.rows_written, summary.dead_letter_rows) == (len(good), bad)
    assert rows(roots) == sorted(before + [row[:4] for row in good], key=repr)
    assert len(table_rows(dead_letter, ["raw_record"])) == dead_before + bad
    version = DeltaTable(catalog.get("events").sink_path(roots)).version()

    again = run_backfill(spark, catalog, request(catalog, "archive-again", **window), roots)

    assert again.ok and again.files == 0 and again.held_files == 4
    assert DeltaTable(catalog.get("events").sink_path(roots)).version() == version, "running it twice adds nothing"


def test_a_range_across_daylight_saving_selects_the_intended_hours(spark: Any, tmp_path: Path) -> None:
    """Europe/Berlin skips 02:00-03:00 on 2026-03-29: local 00:00 to 06:00 is five hours, 23:00Z to 04:00Z."""
    write_catalog(tmp_path, events_stream(backfill={"event_time_column": "event_time"}))
    catalog, roots = load_catalog(tmp_path / "catalog.yaml"), roots_in(tmp_path)
    first = dt.datetime(2026, 3, 28, 20, tzinfo=UTC)
    lines = [json.dumps({"event_id": f"e{i}", "event_type": "click", "user_id": "u1",
                         "event_time": (first + dt.timedelta(minutes=15 * i)).isoformat().replace("+00:00", "Z")})
             for i in range(48)]
    path = Path(roots.landing, "events", "2026-03-29", "quarter-hours.json")
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")
    stamp = (first + dt.timedelta(hours=12)).timestamp()
    os.utime(path, (stamp, stamp))
    assert run_streams(spark, catalog, ["events"], roots).ok
    params = {"start": "2026-03-29T00:00:00", "end": "2026-03-29T06:00:00", "timezone": "Europe/Berlin"}
    ask = parse_request({"stream": "events", "mode": "replace", "dry_run": True, **params}, catalog, run_id="dst")
    assert (ask.start, ask.end) == (dt.datetime(2026, 3, 28, 23, tzinfo=UTC), dt.datetime(2026, 3, 29, 4, tzinfo=UTC))

    summary = run_backfill(spark, catalog, ask, roots)

    assert summary.ok and summary.rows_written == 5 * 4 and summary.rows_replaced == 5 * 4


def test_replace_selects_a_file_whose_name_holds_quotes_and_timestamps(spark: Any, tmp_path: Path) -> None:
    """A file name is user data: its quotes must stay inside their literal on both engines' predicates. The rs run
    is real; the jvm predicate is checked by Spark's own SQL parser over the same table read as a batch."""
    from sluice.model.predicates import SPARK_SQL, render
    from sluice.operations.backfill import plan_backfill

    write_catalog(tmp_path, events_stream())
    catalog, roots = load_catalog(tmp_path / "catalog.yaml"), roots_in(tmp_path)
    producer = DemoProducer(tmp_path / "landing", seed=64, malformed_rate=0.1)
    plain = producer.events_file(lines=20, now=NOW).files[0]
    quoted = producer.events_file(lines=20, now=NOW + dt.timedelta(hours=1)).files[0]
    quoted = quoted.rename(quoted.with_name("report'2026-11-23T10.00.00Z'.json"))
    for path in (plain, quoted):
        os.utime(path, (NOW.timestamp(), NOW.timestamp()))
    assert run_streams(spark, catalog, ["events"], roots).ok
    sink = catalog.get("events").sink_path(roots)
    DeltaTable(sink).update(updates={"event_type": "'corrupted'"})
    corrupted = rows(roots)
    ask = parse_request({"stream": "events", "start": (NOW - dt.timedelta(minutes=1)).isoformat(),
                         "end": (NOW + dt.timedelta(minutes=1)).isoformat(), "select_by": "file_time",
                         "mode": "replace"}, catalog, run_id="quoted")
    plan = plan_backfill(ask, catalog.get("events"), roots)
    assert plan.sink_filter is not None
    batch = spark.read.parquet(*DeltaTable(sink).file_uris())  # the current version's files
    good, _ = expected_events(tmp_path / "landing")
    assert batch.where(render(plan.sink_filter, SPARK_SQL)).count() == plan.rows_to_replace == len(good)
    quoted_only = [uri for uri in plan.sink_filter.files if "report'" in uri]
    assert quoted_only, plan.sink_filter.files
    from dataclasses import replace as replaced

    only = replaced(plan.sink_filter, files=tuple(quoted_only))
    expected_quoted, _ = expected_events(tmp_path / "landing", files=[quoted])
    assert batch.where(render(only, SPARK_SQL)).count() == len(expected_quoted) > 0

    summary = run_backfill(spark, catalog, ask, roots)

    assert summary.ok and summary.rows_replaced == len(good), summary
    after = rows(roots)
    assert set(after) ^ {row[:4] for row in good} == set(), "the table equals the json oracle"
    assert all(row[1] == "corrupted" for row in corrupted)


def mirrored_on_s3(catalog: Catalog, roots: Roots, bucket: str) -> tuple[Roots, Any]:
    """The world with its landing zone, checkpoints and tables on S3, as Spark would have written them there: the
    source log and the tables name each file by its URI on the store. Returns the roots and how a local file's path
    or URI is spelled on the store."""
    from deltalake import write_deltalake

    from sluice.storage.checkpoint import local_file_path
    from sluice.storage.delta import read_table
    from sluice.storage.landing import spark_file_uri
    from sluice.storage.store import folder
    from tests.object_store import upload, uri

    remote = Roots(landing=f"s3a://{bucket}/landing", lake=uri(bucket, "lake"), checkpoints=uri(bucket, "checkpoints"))

    def moved(spelled: str) -> str:
        """The URI Spark records for the file's copy on the store (percent-encoded, as Hadoop's Path spells it)."""
        path = local_file_path(spelled)
        if not path.startswith(roots.landing):
            return spelled
        return spark_file_uri(remote.landing + path.removeprefix(roots.landing))

    upload(Path(roots.landing), remote.landing)
    checkpoints = folder(remote.checkpoints)
    for path in sorted(Path(roots.checkpoints).rglob("*")):
        if path.is_file():
            *parents, name = path.relative_to(roots.checkpoints).parts
            data = path.read_bytes()
            if "sources" in parents and not name.startswith("."):  # the file source log (not its .crc files): a
                # version line, then one JSON entry per file
                head, *entries = data.decode().split("\n")
                data = "\n".join([head, *(json.dumps({**json.loads(line), "path": moved(json.loads(line)["path"])})
                                          if line else line for line in entries)]).encode()
            checkpoints.child(*parents).write_bytes(name, data)
    for table in catalog.get("events").tables(roots):
        rows = read_table(table.path)
        column = "_source_file" if "_source_file" in rows.column_names else "source_file"
        mapped = rows.set_column(rows.column_names.index(column), column,
                                 [[moved(value) for value in rows.column(column).to_pylist()]])
        write_deltalake(table.path.replace(roots.lake, remote.lake), mapped)
    return remote, moved


@pytest.mark.parametrize("mode", ["replace", "append"])
def test_planning_on_s3_is_the_planning_on_disk(world: tuple[Catalog, Roots, Path], s3: str, mode: str) -> None:
    """A backfill planned over a landing zone, a checkpoint and tables on S3 picks the files, leaves the live
    stream's, and counts the rows to replace as it does over the same world on disk. (The run itself reads with
    Spark's s3a connector, which comes from Maven: not on this machine.)"""
    from sluice.operations.backfill import plan_backfill

    catalog, roots, folder_ = world
    stream = catalog.get("events")
    DemoProducer(folder_ / "landing", seed=62).events_file(lines=10, now=NOW + dt.timedelta(hours=3))  # unread yet
    remote, moved = mirrored_on_s3(catalog, roots, s3)
    ask = request(catalog, f"s3-{mode}", mode=mode, start=NOW.isoformat(),
                  end=(NOW + dt.timedelta(days=3)).isoformat(), select_by="event_time")

    on_disk, on_s3 = plan_backfill(ask, stream, roots), plan_backfill(ask, stream, remote)

    def portable(plan: Any) -> dict[str, Any]:
        data = plan.to_dict()
        data["files"] = sorted((moved(f["path"]), f["size"]) for f in data["files"])
        for name in ("sink_filter", "dead_letter_filter"):
            if data[name]:
                data[name]["files"] = sorted(moved(spelled) for spelled in data[name]["files"])
        return data

    assert portable(on_s3) == portable(on_disk)
    assert on_s3.pending_files == 1, "the file the live stream has not read yet is left to it"
    if mode == "replace":
        assert len(on_s3.files) == 3 and on_s3.rows_to_replace > 0 and on_s3.sink_filter is not None
        assert all(spelled.startswith(f"s3a://{s3}/landing/") for spelled in on_s3.sink_filter.files)
    else:
        assert on_s3.held_files == 3 and not on_s3.files, "append skips the files the tables hold"
