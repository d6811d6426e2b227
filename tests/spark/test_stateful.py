"""Silver and gold patterns over scheduled availableNow runs, each checked against the same query run as a batch.

The upstream table is written increment by increment with delta-rs, with duplicates, late events and a bad row;
after each increment every stream runs once, through the real runner on the rs engine, as the Airflow task would
run it. The oracles are Spark batch queries over all the rows written so far, minus those that the watermark made
late (worked out here from the same rule Spark uses: a row is late when its window ended at or before the watermark
the run started with), and, for append-mode windows, only the windows that the final watermark has closed.
"""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from sluice.catalog import load_catalog
from sluice.summary import StreamRunSummary
from sluice_spark.runner import run_streams
from tests.helpers import roots_in, table_rows, write_catalog

pytestmark = pytest.mark.spark

T0 = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)
DELAY = dt.timedelta(minutes=10)
EVENT_SCHEMA = {"event_id": "string not null", "user_id": "string not null", "amount": "double",
                "event_time": "timestamp not null"}
ARROW_EVENTS = pa.schema([("event_id", pa.string()), ("user_id", pa.string()), ("amount", pa.float64()),
                          ("event_time", pa.timestamp("us", tz="UTC"))])


def at(minute: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minute)


# (event_id, user_id, amount, minute). Comments give the watermark each run starts with (max event time seen so far
# minus 10 minutes) and what it makes of the row.
INCREMENTS: list[list[tuple[str, str | None, float, int]]] = [
    [("e1", "u1", 10.0, 1), ("e2", "u2", 20.0, 4), ("e1", "u1", 10.0, 1), ("e3", "u1", 5.0, 12),
     ("e4", "u3", 7.0, 26)],
    # watermark 00:16: e5 (00:08) is late; the copy of e3 (00:12) is late too; e6 comes twice in one batch
    [("e5", "u2", 3.0, 8), ("e3", "u1", 5.0, 12), ("e6", "u3", 4.0, 21), ("e7", "u1", 6.0, 33),
     ("e6", "u3", 4.0, 21), ("bad", None, 1.0, 30), ("wild", None, 1.0, 90)],  # dead letters move no watermark
    # watermark 00:23: e9 (00:24) is on time; the copy of e7 (00:33) is a duplicate within the watermark
    [("e8", "u2", 9.0, 52), ("e9", "u1", 1.0, 24), ("e7", "u1", 6.0, 33)],
]


def source(path: str, schema: dict[str, str] = EVENT_SCHEMA) -> dict[str, Any]:
    return {"type": "delta", "path": path, "schema": schema}


def stream(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "source": source("raw/events"), "schedule": "*/5 * * * *", "checkpoint": name,
            "sink": {"path": f"out/{name}", "engine": "rs"}, **fields}


WATERMARK = {"column": "event_time", "delay": "10 minutes"}
MEASURES = {"revenue": "sum(amount)", "events": "count(*)"}
STREAMS = [
    stream("deduped", watermark=WATERMARK, dedupe={"keys": ["event_id"]}),
    stream("tumbling", watermark=WATERMARK, aggregate={
        "window": {"type": "tumbling", "column": "event_time", "duration": "10 minutes"}, "measures": MEASURES}),
    stream("sliding", watermark=WATERMARK, aggregate={
        "window": {"type": "sliding", "column": "event_time", "duration": "10 minutes", "slide": "5 minutes"},
        "measures": MEASURES}),
    # A longer delay: nothing is late for it, and its closed sessions are compared whole.
    stream("sessions", watermark={"column": "event_time", "delay": "30 minutes"}, aggregate={
        "window": {"type": "session", "column": "event_time", "gap": "10 minutes"}, "group_by": ["user_id"],
        "measures": MEASURES}),
    {**stream("running", watermark=WATERMARK, aggregate={
        "window": {"type": "tumbling", "column": "event_time", "duration": "10 minutes"}, "measures": MEASURES}),
     "sink": {"path": "out/running", "engine": "rs", "mode": "merge"}},
    {**stream("per_user", aggregate={"group_by": ["user_id"], "measures": MEASURES}),
     "sink": {"path": "out/per_user", "engine": "rs", "mode": "complete"}},
]


def write_increment(path: Path, rows: list[tuple[str, str | None, float, int]]) -> None:
    columns = list(zip(*[(event_id, user, amount, at(minute)) for event_id, user, amount, minute in rows],
                       strict=True))
    write_deltalake(str(path), pa.Table.from_arrays([pa.array(c) for c in columns], schema=ARROW_EVENTS),
                    mode="append")


def watermarks(delay: dt.timedelta = DELAY) -> list[dt.datetime | None]:
    """The watermark each run starts with, and after the last: the newest good event time before it, minus delay."""
    marks: list[dt.datetime | None] = [None]
    newest: dt.datetime | None = None
    for rows in INCREMENTS:
        for _, user, _, minute in rows:
            if user is not None:
                newest = max(newest or at(minute), at(minute))
        assert newest is not None
        marks.append(newest - delay)
    return marks


def all_rows(spark: Any) -> Any:
    """Every good row written, with the watermark its run started with."""
    marks = watermarks()
    data = [(event_id, user, amount, at(minute), marks[run])
            for run, rows in enumerate(INCREMENTS) for event_id, user, amount, minute in rows if user is not None]
    return spark.createDataFrame(data, "event_id string, user_id string, amount double, event_time timestamp, "
                                       "watermark timestamp")


def batch_windows(spark: Any, window: Any, *, closed_by: dt.datetime | None) -> list[tuple[Any, ...]]:
    """The windowed aggregate as a batch: rows whose window had closed when they arrived are left out."""
    from pyspark.sql import functions as F

    frame = all_rows(spark).select("*", window.alias("w"))
    frame = frame.where(F.col("watermark").isNull() | (F.col("w.end") > F.col("watermark")))
    if closed_by is not None:
        frame = frame.where(F.col("w.end") <= F.lit(closed_by))
    result = frame.groupBy("w").agg(F.sum("amount").alias("revenue"), F.count(F.lit(1)).alias("events"))
    return sorted(((row.w.start.replace(tzinfo=dt.timezone.utc), row.w.end.replace(tzinfo=dt.timezone.utc),
                    row.revenue, row.events) for row in result.collect()), key=repr)


def utc(value: Any) -> Any:
    return value.astimezone(dt.timezone.utc) if isinstance(value, dt.datetime) else value


def rows_of(tmp_path: Path, name: str, columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted((tuple(utc(v) for v in row) for row in table_rows(str(tmp_path / "lake" / "out" / name), columns)),
                  key=repr)


def summaries(spark: Any, catalog: Any, tmp_path: Path) -> dict[str, StreamRunSummary]:
    summary = run_streams(spark, catalog, [s.name for s in catalog], roots_in(tmp_path))
    assert summary.ok, [(s.stream, s.error) for s in summary.streams]
    return {s.stream: s for s in summary.streams}


def test_silver_and_gold_patterns_equal_their_batch_oracles(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    catalog = load_catalog(write_catalog(tmp_path, *STREAMS))
    raw = tmp_path / "lake" / "raw" / "events"
    runs = []
    for rows in INCREMENTS:
        write_increment(raw, rows)
        runs.append(summaries(spark, catalog, tmp_path))
    final = watermarks()[-1]
    assert final == at(42)

    # Silver: every event once, except the one that came after the watermark had passed it.
    deduped = rows_of(tmp_path, "deduped", ["event_id", "user_id", "amount", "event_time"])
    oracle = all_rows(spark).where(F.col("event_id") != "e5").dropDuplicates(["event_id"])
    assert deduped == sorted(((r.event_id, r.user_id, r.amount, r.event_time.replace(tzinfo=dt.timezone.utc))
                              for r in oracle.collect()), key=repr)
    assert [run["deduped"].late_rows for run in runs] == [0, 2, 0]  # e5 and the late copy of e3
    assert [run["deduped"].duplicate_rows for run in runs] == [1, 1, 1]
    assert [run["deduped"].dead_letter_rows for run in runs] == [0, 2, 0]
    assert [run["deduped"].input_rows for run in runs] == [len(rows) for rows in INCREMENTS]
    assert table_rows(str(tmp_path / "lake" / "out" / "deduped_dead_letter"), ["reason"]) == [
        ("missing required field 'user_id'",)] * 2

    # Gold, append: exactly the windows the final watermark closed, each written once.
    window = ["window_start", "window_end", "revenue", "events"]
    assert rows_of(tmp_path, "tumbling", window) == batch_windows(
        spark, F.window("event_time", "10 minutes"), closed_by=final)
    assert [run["tumbling"].late_rows for run in runs] == [0, 1, 0]  # e5: its window had closed at 00:16
    assert rows_of(tmp_path, "sliding", window) == batch_windows(
        spark, F.window("event_time", "10 minutes", "5 minutes"), closed_by=final)
    # Gold, merge (update mode): every window, closed or not, as the batch query sees it now.
    assert rows_of(tmp_path, "running", window) == batch_windows(spark, F.window("event_time", "10 minutes"),
                                                                 closed_by=None)
    # Gold, complete: the whole result, every run.
    per_user = all_rows(spark).groupBy("user_id").agg(F.sum("amount").alias("r"), F.count(F.lit(1)).alias("n"))
    assert rows_of(tmp_path, "per_user", ["user_id", "revenue", "events"]) == sorted(
        (tuple(row) for row in per_user.collect()), key=repr)

    # Sessions of 10 idle minutes per user, closed by the final watermark (00:52 - 30 minutes).
    sessions = all_rows(spark).groupBy(F.session_window("event_time", "10 minutes").alias("w"), "user_id").agg(
        F.sum("amount").alias("revenue"), F.count(F.lit(1)).alias("events")).where(F.col("w.end") <= at(22))
    assert rows_of(tmp_path, "sessions", ["window_start", "window_end", "user_id", "revenue", "events"]) == sorted(
        ((r.w.start.replace(tzinfo=dt.timezone.utc), r.w.end.replace(tzinfo=dt.timezone.utc), r.user_id, r.revenue,
          r.events) for r in sessions.collect()), key=repr)
    assert len(rows_of(tmp_path, "sessions", ["user_id"])) == 3  # u1 twice, u2 once: not a vacuous comparison

    # The checkpoint health gate sees the state, and refuses a stateful checkpoint that lost it.
    from sluice.operations.health import Health, check_stream

    tumbling = catalog.get("tumbling")
    report = check_stream(tumbling, roots_in(tmp_path))
    assert report.status is Health.OK and report.facts["state_bytes"] > 0, report.findings
    shutil.rmtree(tmp_path / "checkpoints" / "tumbling" / "state")
    assert [f.code for f in check_stream(tumbling, roots_in(tmp_path)).findings] == ["STATE_MISSING"]

    # State is bounded by the watermark, run after run. Dedupe keeps a key while its event time + 10 minutes is
    # after the watermark (00:16, 00:23, 00:42 after each run): {e3, e4}, {e4, e6, e7}, {e7, e8}, out of 9 keys.
    # The tumbling aggregate keeps the windows that have not closed: {10-20, 20-30}, {20-30, 30-40}, {50-60}.
    assert [run["deduped"].state_rows for run in runs] == [2, 3, 2]
    assert [run["tumbling"].state_rows for run in runs] == [2, 2, 1]
    assert runs[-1]["per_user"].state_rows == 3  # complete mode keeps every group, by design


def users_catalog(tmp_path: Path) -> Any:
    updates = {"user_id": "string not null", "plan": "string", "updated_at": "timestamp not null"}
    return load_catalog(write_catalog(tmp_path, {
        "name": "users", "source": source("raw/users", updates), "schedule": "0 * * * *", "checkpoint": "users",
        "sink": {"path": "out/users", "engine": "rs", "mode": "merge", "keys": ["user_id"],
                 "sequence_by": "updated_at"},
        "fan_out": [{"path": "out/paid", "where": "plan = 'paid'", "columns": ["user_id", "updated_at"]}],
    }))


def land_users(tmp_path: Path, rows: list[tuple[str, str, int]]) -> None:
    schema = pa.schema([("user_id", pa.string()), ("plan", pa.string()), ("updated_at", pa.timestamp("us", "UTC"))])
    write_deltalake(str(tmp_path / "lake" / "raw" / "users"), pa.Table.from_pylist(
        [{"user_id": u, "plan": p, "updated_at": at(m)} for u, p, m in rows], schema=schema), mode="append")


def test_a_replayed_merge_batch_changes_nothing(spark: Any, tmp_path: Path) -> None:
    catalog = users_catalog(tmp_path)

    def land(rows: list[tuple[str, str, int]]) -> None:
        land_users(tmp_path, rows)

    land([("u1", "free", 1), ("u2", "free", 2), ("u1", "paid", 5)])  # two versions of u1 in one batch
    summaries(spark, catalog, tmp_path)
    land([("u2", "paid", 9), ("u1", "free", 3), ("u3", "free", 4)])  # u1's version from 00:03 is older: ignored
    summaries(spark, catalog, tmp_path)
    expected = [("u1", "paid", at(5)), ("u2", "paid", at(9)), ("u3", "free", at(4))]
    assert rows_of(tmp_path, "users", ["user_id", "plan", "updated_at"]) == expected
    assert rows_of(tmp_path, "paid", ["user_id", "updated_at"]) == [("u1", at(5)), ("u2", at(9))]
    versions = {name: DeltaTable(str(tmp_path / "lake" / "out" / name)).version() for name in ("users", "paid")}

    # A crash after the tables committed batch 1 but before the checkpoint did: Spark replays the batch.
    checkpoint = tmp_path / "checkpoints" / "users"
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    replay = summaries(spark, catalog, tmp_path)["users"]
    assert replay.batch_ids == [last]
    assert {name: DeltaTable(str(tmp_path / "lake" / "out" / name)).version() for name in versions} == versions
    assert rows_of(tmp_path, "users", ["user_id", "plan", "updated_at"]) == expected


@pytest.mark.parametrize("join_type", ["inner", "left_outer"])
def test_stream_stream_join_with_a_lookup_equals_the_batch_join(spark: Any, tmp_path: Path, join_type: str) -> None:
    """Inner and left outer. A left-outer row without a match is emitted, with NULLs, once the watermark closes
    its time bound: here i2 (00:05, bound 00:20), by the final watermark min(00:41, 00:50) - 10 minutes = 00:31."""
    from pyspark.sql import functions as F

    impressions = {"ad_id": "string not null", "impression_id": "string not null",
                   "impression_time": "timestamp not null"}
    clicks = {"ad_id": "string not null", "click_id": "string not null", "click_time": "timestamp not null"}
    catalog = load_catalog(write_catalog(tmp_path, {
        "name": "attributed", "source": source("raw/impressions", impressions), "schedule": "*/5 * * * *",
        "watermark": {"column": "impression_time", "delay": "10 minutes"},
        "join": {"source": source("raw/clicks", clicks), "watermark": {"column": "click_time", "delay": "10 minutes"},
                 "on": ["ad_id"], "type": join_type, "within": {"left": "impression_time", "right": "click_time",
                                                                "max_delay": "15 minutes"}},
        "lookup": [{"table": "dim/ads", "on": ["ad_id"], "columns": ["category"]}],
        "sink": {"path": "out/attributed", "engine": "rs"},
    }))
    lake = tmp_path / "lake"
    write_deltalake(str(lake / "dim" / "ads"), pa.table({"ad_id": ["a1", "a3"], "category": ["shoes", "hats"]}))

    def land(table: str, rows: list[tuple[str, str, int]], time_column: str, id_column: str) -> None:
        write_deltalake(str(lake / "raw" / table), pa.Table.from_pylist(
            [{"ad_id": ad, id_column: key, time_column: at(minute)} for ad, key, minute in rows],
            schema=pa.schema([("ad_id", pa.string()), (id_column, pa.string()),
                              (time_column, pa.timestamp("us", "UTC"))])), mode="append")

    increments = [
        ([("a1", "i1", 0), ("a2", "i2", 5), ("a1", "i3", 20)], [("a1", "c1", 10), ("a2", "c2", 30)]),
        ([("a2", "i4", 40), ("a3", "i5", 41)], [("a1", "c3", 30), ("a2", "c4", 44), ("a3", "c5", 50)]),
    ]
    for shown, clicked in increments:
        land("impressions", shown, "impression_time", "impression_id")
        land("clicks", clicked, "click_time", "click_id")
        summaries(spark, catalog, tmp_path)

    def frame(rows: list[tuple[str, str, int]], names: str) -> Any:
        return spark.createDataFrame([(ad, key, at(minute)) for ad, key, minute in rows], names)

    left = frame([row for shown, _ in increments for row in shown], "ad_id string, impression_id string, "
                                                                      "impression_time timestamp")
    right = frame([row for _, clicked in increments for row in clicked], "ad_id string, click_id string, "
                                                                         "click_time timestamp")
    shown_at = F.col("l.impression_time")
    within = F.col("r.click_time").between(shown_at, shown_at + F.expr("INTERVAL 15 MINUTES"))
    dim = spark.createDataFrame([("a1", "shoes"), ("a3", "hats")], "ad_id string, category string")
    # A left-outer row without a match is final once the watermark (the older side's newest time - 10 minutes)
    # has passed its time bound; until then it may still be matched.
    final = min(max(r.impression_time for r in left.collect()), max(r.click_time for r in right.collect()))
    closed = F.col("l.impression_time") + F.expr("INTERVAL 15 MINUTES") < F.lit(final) - F.expr("INTERVAL 10 MINUTES")
    outer = left.alias("l").join(right.alias("r"), (F.col("l.ad_id") == F.col("r.ad_id")) & within, join_type)
    outer = outer.where(F.col("r.click_id").isNotNull() | closed)
    oracle = outer.select("l.ad_id", "impression_id", "click_id").join(dim, "ad_id", "left")
    expected = sorted((tuple(row) for row in oracle.collect()), key=repr)
    assert ("a2", "i4", "c4", None) in expected  # a2 has no category
    assert len(expected) == (5 if join_type == "left_outer" else 4)  # c2 came too late for i2, which stands alone
    assert rows_of(tmp_path, "attributed", ["ad_id", "impression_id", "click_id", "category"]) == expected
    from sluice.operations.health import Health, check_stream

    report = check_stream(catalog.get("attributed"), roots_in(tmp_path))
    assert report.status is Health.OK, report.findings  # both sides, each read for good rows and dead letters


def test_a_crash_between_the_merge_and_the_fan_out_is_finished_by_the_next_run(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch's MERGE commits, then the run dies before its fan-out commit (foreachBatch runs in this process, so
    the crash point is raised here): the next run replays the batch, skips the MERGE and writes the fan-out."""
    from sluice_spark.write import batches as writers

    catalog = users_catalog(tmp_path)
    land_users(tmp_path, [("u1", "free", 1), ("u2", "paid", 2)])
    summaries(spark, catalog, tmp_path)
    land_users(tmp_path, [("u1", "paid", 5), ("u3", "paid", 6)])

    def crash(point: str, batch_id: int | None = None) -> None:
        if point == "between_commits" and batch_id == 1:
            raise RuntimeError("crash between commits")

    monkeypatch.setattr(writers.faults, "reach", crash)
    failed = run_streams(spark, catalog, ["users"], roots_in(tmp_path)).streams[0]
    assert failed.status == "failed" and "crash between commits" in (failed.error or "")
    users, paid = (DeltaTable(str(tmp_path / "lake" / "out" / name)) for name in ("users", "paid"))
    assert (users.transaction_version(failed.query_id), paid.transaction_version(failed.query_id)) == (1, 0)
    merged_at = users.version()

    monkeypatch.undo()
    replay = summaries(spark, catalog, tmp_path)["users"]
    assert replay.batch_ids == [1]
    assert DeltaTable(str(tmp_path / "lake" / "out" / "users")).version() == merged_at  # the MERGE was not redone
    assert rows_of(tmp_path, "users", ["user_id", "plan", "updated_at"]) == [
        ("u1", "paid", at(5)), ("u2", "paid", at(2)), ("u3", "paid", at(6))]
    assert rows_of(tmp_path, "paid", ["user_id", "updated_at"]) == [("u1", at(5)), ("u2", at(2)), ("u3", at(6))]
