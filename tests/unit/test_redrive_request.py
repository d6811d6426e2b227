"""Redrive params: every refusal names its field; a selection is counted without Spark; the selection's SQL keeps a
reason's quotes inside its literal."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import Catalog, load_catalog
from sluice.operations.redrive import RedriveError, parse_request, plan_redrive, redrivable, selection_sql
from tests.helpers import events_stream, roots_in, write_catalog

UTC = dt.timezone.utc


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def ask(catalog: Catalog, **params: Any) -> Any:
    return parse_request({"stream": "events_bronze", **params}, catalog, run_id="manual__2026-11-22T10:00:00+00:00")


@pytest.mark.parametrize(("params", "message"), [
    ({"stream": "nope"}, "stream: unknown stream 'nope'; known streams: events_bronze"),
    ({"stream": "events_silver"}, "stream: stream 'events_silver' cannot be redriven: its source is delta"),
    ({"stream": "activity_hourly"}, "stream: stream 'activity_hourly' cannot be redriven"),
    ({"since": "2026-11-02T00:00:00Z", "until": "2026-11-01T00:00:00Z"},
     "until: 2026-11-01T00:00:00+00:00 is not after since 2026-11-02T00:00:00+00:00"),
    ({"since": "2026-11-01T00:00:00"}, "since: '2026-11-01T00:00:00' has no UTC offset"),
    ({"until": "yesterday"}, "until: 'yesterday' is not an ISO 8601 date-time"),
    ({"timezone": "Mars/Olympus"}, "timezone: unknown time zone 'Mars/Olympus'"),
    ({"reason": "a\nb"}, "reason: expected one line of text"),
    ({"reason": "x" * 501}, "reason: expected one line of text"),
    ({"dry_run": "maybe"}, "dry_run: expected true or false, got 'maybe'"),
    ({"path": "/etc"}, "path: unknown param(s) path; a redrive takes stream, reason, since, until, timezone, dry_run"),
])
def test_bad_params_are_refused_by_name(catalog: Catalog, params: dict[str, Any], message: str) -> None:
    with pytest.raises(RedriveError) as refused:
        ask(catalog, **params)
    assert str(refused.value).startswith(message), str(refused.value)
    assert refused.value.field == message.split(":")[0]


def test_good_params_are_a_dry_run_by_default_and_naive_times_take_the_zone(catalog: Catalog) -> None:
    request = ask(catalog, since="2026-03-29T01:30", timezone="Europe/Berlin", reason="broke expectation(s)")
    assert request.dry_run is True and request.since == dt.datetime(2026, 3, 29, 0, 30, tzinfo=UTC)
    assert request.until is None and request.app_id == "sluice-redrive/events_bronze/manual__2026-11-22T10_00_00_00_00"
    assert "--dry-run" in request.to_args() and "--until" not in request.to_args()


def test_the_selection_quotes_a_reason_as_a_literal(catalog: Catalog) -> None:
    request = ask(catalog, reason="field 'a'); DROP TABLE t; --", since="2026-11-01T00:00:00Z")
    where = selection_sql(request, marked=True)
    assert where == ('"redriven_by" IS NULL AND starts_with(reason, \'field \'\'a\'\'); DROP TABLE t; --\') AND '
                     "ingested_at >= '2026-11-01T00:00:00.000000Z'")


def test_without_a_dead_letter_table_nothing_is_selected(tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, events_stream("clicks")))
    request = parse_request({"stream": "clicks"}, catalog, run_id="r")
    plan = plan_redrive(request, catalog.get("clicks"), roots_in(tmp_path))
    assert (plan.dead_letter_version, plan.rows, plan.reasons) == (None, 0, [])
    assert redrivable(catalog.get("clicks"), roots_in(tmp_path)) == []


def test_a_selection_is_counted_per_reason_and_marked_rows_are_left_out(tmp_path: Path) -> None:
    """A dead-letter table written by hand (delta-rs), as a run and a first redrive would leave it."""
    import pyarrow as pa
    from deltalake import write_deltalake

    catalog = load_catalog(write_catalog(tmp_path, events_stream("clicks")))
    stream = catalog.get("clicks")
    at = dt.datetime(2026, 11, 22, 10, tzinfo=UTC)
    rows = pa.table({"raw_record": ["{}", "{}", "x", "{}"],
                     "reason": ["missing required field 'user_id'"] * 2 + ["malformed JSON record"] * 2,
                     "source_file": ["f"] * 4, "stream": ["clicks"] * 4,
                     "ingested_at": pa.array([at, at, at + dt.timedelta(hours=1), at], pa.timestamp("us", "UTC")),
                     "redriven_by": [None, None, None, "earlier"]})
    write_deltalake(stream.dead_letter_table_path(roots_in(tmp_path)), rows)
    plan = plan_redrive(parse_request({"stream": "clicks"}, catalog, run_id="r"), stream, roots_in(tmp_path))
    assert plan.rows == 3 and plan.marked and plan.dead_letter_version == 0
    assert plan.reasons == [{"reason": "missing required field 'user_id'", "rows": 2},
                            {"reason": "malformed JSON record", "rows": 1}]
    assert plan.ingested_until == "2026-11-22T11:00:00.000000Z"
    narrowed = parse_request({"stream": "clicks", "until": "2026-11-22T10:30:00Z", "reason": "missing"}, catalog,
                             run_id="r")
    assert plan_redrive(narrowed, stream, roots_in(tmp_path)).rows == 2
    assert redrivable(stream, roots_in(tmp_path)) == plan.reasons
