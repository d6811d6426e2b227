"""Backfill params: every refusal names its field, and nothing in them reaches a path, a conf or a command."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import Catalog, load_catalog
from sluice.operations.backfill import BackfillError, parse_request, plan_backfill
from tests.helpers import events_stream, roots_in, write_catalog

UTC = dt.timezone.utc


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def ask(catalog: Catalog, **params: Any) -> Any:
    base = {"stream": "events_bronze", "start": "2026-11-01T00:00:00Z", "end": "2026-11-02T00:00:00Z"}
    return parse_request({**base, **params}, catalog, run_id="manual__2026-11-22T10:00:00+00:00")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"stream": "nope"}, "stream: unknown stream 'nope'; known streams: events_bronze, orders_bronze, "
                             "events_silver, activity_hourly"),
        ({"stream": "../events_bronze"}, "stream: unknown stream '../events_bronze'"),
        ({"stream": "/data/lake/bronze/events"}, "stream: unknown stream '/data/lake/bronze/events'"),
        ({"end": "2026-10-31T00:00:00Z"}, "end: 2026-10-31T00:00:00+00:00 is not after start"),
        ({"end": "2026-12-15T00:00:00Z"}, "end: the range is 44 days, 0:00:00, longer than the 31 days"),
        ({"start": "2026-11-01T00:00:00"}, "start: '2026-11-01T00:00:00' has no UTC offset"),
        ({"start": "last tuesday"}, "start: 'last tuesday' is not an ISO 8601 date-time"),
        ({"start": "2026-11-01"}, "start: '2026-11-01' is a Date, not a date-time"),
        ({"timezone": "../../etc/localtime"}, "timezone: unknown time zone"),
        ({"mode": "merge"}, "mode: unknown mode 'merge'; expected one of append, replace"),
        ({"select_by": "partition"}, "select_by: unknown value 'partition'"),
        ({"mode": "replace", "max_files_per_trigger": 5}, "max_files_per_trigger: replace reads the range in one"),
        ({"max_files_per_trigger": 0}, "max_files_per_trigger: expected an integer from 1 to 100000"),
        ({"max_files_per_trigger": 10**12}, "max_files_per_trigger: expected an integer from 1 to 100000"),
        ({"dry_run": "maybe"}, "dry_run: expected true or false"),
        ({"reason": "line one\nline two"}, "reason: expected one line of text"),
        ({"spark.driver.memory": "64g"}, "spark.driver.memory: unknown param(s) spark.driver.memory"),
        ({"checkpoint": "/tmp/elsewhere"}, "checkpoint: unknown param(s) checkpoint"),
    ],
)
def test_bad_params_are_refused_with_the_field(catalog: Catalog, params: dict[str, Any], message: str) -> None:
    with pytest.raises(BackfillError) as refused:
        ask(catalog, **params)
    assert str(refused.value).startswith(message)


def test_naive_times_take_the_time_zone_across_daylight_saving(catalog: Catalog) -> None:
    spring = ask(catalog, start="2026-03-29T00:00:00", end="2026-03-29T06:00:00", timezone="Europe/Berlin")
    assert (spring.start, spring.end) == (dt.datetime(2026, 3, 28, 23, tzinfo=UTC), dt.datetime(2026, 3, 29, 4,
                                                                                                 tzinfo=UTC))
    autumn = ask(catalog, start="2026-10-25T00:00:00", end="2026-10-25T06:00:00", timezone="Europe/Berlin")
    assert autumn.end - autumn.start == dt.timedelta(hours=7)


def test_offsets_win_and_defaults_apply(catalog: Catalog) -> None:
    request = ask(catalog, start="2026-11-01T00:00:00+01:00", dry_run="true")
    assert request.start == dt.datetime(2026, 10, 31, 23, tzinfo=UTC)
    assert (request.mode, request.select_by, request.dry_run) == ("append", "event_time", True)
    assert request.run_key == "manual__2026-11-22T10_00_00_00_00"
    assert "--dry-run" in request.to_args() and "--max-files-per-trigger" not in request.to_args()


def test_a_stateful_stream_is_not_backfilled() -> None:
    from sluice.catalog import parse_catalog
    from tests.helpers import events_stream

    deduped = events_stream("deduped", watermark={"column": "event_time", "delay": "1 hour"},
                            dedupe={"keys": ["event_id"]})
    with pytest.raises(BackfillError) as refused:
        ask(parse_catalog({"version": 1, "streams": [deduped]}), stream="deduped")
    assert str(refused.value).startswith("stream: stream 'deduped' keeps state in its checkpoint")
    split = events_stream("split", fan_out=[{"path": "bronze/purchases", "where": "event_type = 'purchase'"}])
    with pytest.raises(BackfillError, match="fans out"):
        ask(parse_catalog({"version": 1, "streams": [split]}), stream="split")


@pytest.mark.parametrize(("params", "field"), [
    ({"start": "0001-01-01T00:00:00+01:00"}, "start"),  # year 0 once in UTC
    ({"start": "0001-01-01T00:00:00Z", "end": "0001-01-02T00:00:00Z"}, "start"),  # a clock skew before it is year 0
    ({"start": "0001-01-01T00:00:00", "end": "0001-01-02T00:00:00", "timezone": "Asia/Tokyo"}, "start"),
    ({"end": "9999-12-31T23:59:59-01:00"}, "end"),  # year 10000 once in UTC
    ({"start": "9999-12-30T00:00:00Z", "end": "9999-12-31T23:00:00Z"}, "start"),
    ({"start": "9999-12-31T00:00:00", "end": "9999-12-31T23:00:00", "timezone": "America/New_York"}, "start"),
])
def test_times_at_the_edges_of_the_calendar_are_refused_with_the_field(catalog: Catalog, params: dict[str, Any],
                                                                       field: str) -> None:
    with pytest.raises(BackfillError) as refused:
        ask(catalog, **params)
    assert refused.value.field == field and "outside the times a backfill takes" in str(refused.value)


def test_a_file_name_that_is_not_utf8_is_refused_with_the_field(tmp_path: Path) -> None:
    """A file the live stream will never read (behind its maxFileAge horizon) is the backfill's, and its name has no
    UTF-8 spelling for Spark, the plan's JSON or the tables' file column."""
    catalog = load_catalog(write_catalog(tmp_path, events_stream()))
    stream, roots = catalog.get("events"), roots_in(tmp_path)
    now = time.time()
    checkpoint = Path(stream.checkpoint_path(roots))
    for log, text in (("offsets", 'v1\n{}\n{"logOffset":0}\n'), ("commits", "v1\n{}\n"),
                      ("sources/0", f'v1\n{{"path":"file:///new.json","timestamp":{int(now * 1000)},"batchId":0}}\n')):
        (checkpoint / log).mkdir(parents=True)
        (checkpoint / log / "0").write_text(text)
    landing = Path(roots.landing, "events")
    landing.mkdir(parents=True)
    old = os.path.join(os.fsencode(landing), b"old-\xff\x1b[2J.json")
    Path(os.fsdecode(old)).write_text('{"event_id": "1"}\n')
    os.utime(old, (now - 20 * 86400, now - 20 * 86400))
    request = parse_request({"stream": "events", "start": dt.datetime.fromtimestamp(now - 25 * 86400, UTC).isoformat(),
                             "end": dt.datetime.fromtimestamp(now, UTC).isoformat(), "select_by": "file_time"},
                            catalog, run_id="r")
    with pytest.raises(BackfillError) as refused:
        plan_backfill(request, stream, roots)
    assert refused.value.field == "source.path" and "old-\\xff\\x1b[2J.json" in str(refused.value)
