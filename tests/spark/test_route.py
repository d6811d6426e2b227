"""The routing step on a DataFrame built by hand (sluice_spark.steps.route): the quality split, the rules and the
fan-out, checked against an oracle computed in Python from the same rows, with no source and no sink."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pytest

from sluice.catalog import parse_catalog
from sluice.constants import INGEST_TIME_COLUMN
from sluice.errors import CatalogError
from sluice.model.expectations import QUARANTINE_REASON
from tests.helpers import EXAMPLE_RULES, RULES_SCHEMA, events_stream

pytestmark = pytest.mark.spark

UTC = dt.timezone.utc
NOW = dt.datetime.now(UTC).replace(microsecond=0)
FAN_OUT = {"path": "silver/large", "where": "abs(amount) > 10"}
COLUMNS = [*RULES_SCHEMA, "_corrupt_record", "_source_file"]
SCHEMA = ("event_id string, event_type string, user_id string, amount decimal(12,2), currency string, "
          "event_time timestamp, _corrupt_record string, _source_file string")


def stream(**overrides: Any) -> Any:
    # ``none``: a record that is no JSON is the reader's reject, before any rule.
    definition = events_stream(**{
        "source": {"type": "files", "format": "json", "path": "events", "schema": RULES_SCHEMA,
                   "schema_evolution": "none"},
        "transform": {"sql": "SELECT *, amount * 2 AS doubled FROM source"}, "expectations": EXAMPLE_RULES,
        "sink": {"path": "bronze/events", "engine": "rs"}, "fan_out": [FAN_OUT], **overrides})
    return parse_catalog({"version": 1, "streams": [definition]}).get("events")


def event(event_id: str, *, event_type: str | None = "click", user_id: str | None = "u1",
          amount: str | None = "5.00", currency: str | None = "EUR", event_time: dt.datetime = NOW,
          corrupt: str | None = None) -> tuple[Any, ...]:
    if corrupt is not None:
        return (None, None, None, None, None, None, corrupt, f"landing/{event_id}.json")
    return (event_id, event_type, user_id, None if amount is None else Decimal(amount), currency, event_time, None,
            f"landing/{event_id}.json")


ROWS = [
    event("e1"),
    event("e2", amount="25.00"),
    event("e3", corrupt='{"event_id": "e3", "amount": '),
    event("e4", event_type=None),
    event("e5", amount="-3.00"),
    event("e6", event_time=NOW + dt.timedelta(days=30)),
    event("e7", user_id=None),
    event("e8", amount=None, currency="XYZ"),
    event("e9", amount="-50.00"),
    event("e10", amount="11.00", currency=None),
]


def oracle(rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    """Where each row goes, from the rules' meaning written in Python: the reader's rejects and missing required
    fields are dead letters; a ``quarantine`` rule broken makes one too, a ``fail`` rule broken stops the batch (no
    table takes the row), a ``drop`` rule broken drops it; a ``warn`` rule is only counted. A fan-out table takes
    the good rows its ``where`` selects."""
    good, dead, failed, large = {}, {}, set(), set()
    for row in rows:
        record = dict(zip(COLUMNS, row, strict=True))
        if record["_corrupt_record"] is not None:
            dead[json.loads(record["_corrupt_record"] + "0}")["event_id"]] = "malformed JSON record"
            continue
        missing = [name for name in ("event_id", "event_type", "event_time") if record[name] is None]
        if missing:
            dead[record["event_id"]] = f"missing required field '{missing[0]}'"
            continue
        amount = record["amount"]
        broke = [name for name, holds in (
            ("valid_amount", amount is None or amount >= 0),
            ("known_currency", record["currency"] in ("EUR", "USD", "GBP")),
            ("not_from_the_future", record["event_time"] <= dt.datetime.now(UTC) + dt.timedelta(hours=1)),
            ("has_user", record["user_id"] is not None)) if not holds]
        if "has_user" in broke:
            failed.add(record["event_id"])
        elif "valid_amount" in broke:
            dead[record["event_id"]] = QUARANTINE_REASON + ", ".join(broke)
        elif "not_from_the_future" not in broke:
            good[record["event_id"]] = None if amount is None else amount * 2
            if amount is not None and abs(amount) > 10:
                large.add(record["event_id"])
    return {"good": good, "dead": dead, "failed": failed, "large": large}


def test_the_quality_split_rules_and_fan_out_match_the_oracle(spark: Any) -> None:
    from sluice_spark.steps.route import route

    routed = route(spark.createDataFrame(ROWS, SCHEMA), stream())
    expected = oracle(ROWS)
    assert expected["good"] and expected["dead"] and expected["failed"] and expected["large"], "every route is used"
    assert {row["event_id"]: row["doubled"] for row in routed.good().collect()} == expected["good"]
    dead = routed.dead_letters().collect()
    assert {row["stream"] for row in dead} == {"events"}
    assert all(row["source_file"].startswith("landing/") for row in dead), "a dead letter keeps its lineage"
    by_event = {}
    for row in dead:
        raw = row["raw_record"]
        event_id = json.loads(raw + "0}" if raw.endswith(": ") else raw)["event_id"]
        by_event[event_id] = row["reason"]
    assert by_event == expected["dead"]
    assert {row["event_id"] for row in routed.failed().collect()} == expected["failed"]
    [large] = routed.outputs()
    assert {row["event_id"] for row in large.collect()} == expected["large"]
    assert large.columns[-1] == INGEST_TIME_COLUMN and "doubled" in large.columns
    assert routed.data_columns[-1] == INGEST_TIME_COLUMN and "doubled" in routed.data_columns


def test_a_stream_without_rules_or_fan_out_routes_each_row_once(spark: Any) -> None:
    from sluice_spark.steps.route import route
    from sluice_spark.targets import ROUTE_COLUMN

    plain = stream(expectations={}, fan_out=[])
    routed = route(spark.createDataFrame(ROWS, SCHEMA), plain)
    routes = [row[ROUTE_COLUMN] for row in routed.frame.collect()]
    assert len(routes) == len(ROWS) and routed.outputs() == []
    assert routed.failed().count() == 0
    assert routed.dead_letters().count() == 2  # the reader's reject and the missing event type
    assert routed.good().count() == len(ROWS) - 2


def test_route_refuses_a_frame_that_does_not_fit_its_stream(spark: Any) -> None:
    from sluice_spark.steps.route import route

    frame = spark.createDataFrame(ROWS, SCHEMA)
    with pytest.raises(CatalogError, match=r"^stream 'events': source: .*_source_file"):
        route(frame.drop("_source_file"), stream())
    with pytest.raises(CatalogError, match=r"^stream 'events': patterns.lookup: "):
        route(frame, stream(), dimensions=[(object(), frame)])  # type: ignore[list-item]
    with pytest.raises(CatalogError, match=r"^stream 'events': patterns.join: "):
        route(frame, stream(), joined=frame)


def test_the_dead_letter_reason_parses_a_corrupt_record_once_and_compiles_with_the_rules(spark: Any) -> None:
    """``from_json`` is not compiled to Java code: the re-parse of a corrupt record is planned once, in a step of its
    own, and the reason, the transform's columns and the rules' flags stay in whole-stage codegen (issue 41)."""
    from sluice_spark.steps.route import route
    from sluice_spark.targets import REASON_COLUMN

    plan = route(spark.createDataFrame(ROWS, SCHEMA), stream()).frame._jdf.queryExecution().executedPlan().toString()
    assert plan.count("from_json(") == 1, plan
    nodes = [line.lstrip(" +-:") for line in plan.splitlines()]
    [reparse] = [node for node in nodes if "from_json(" in node]
    assert REASON_COLUMN not in reparse and "doubled" not in reparse, reparse
    for made in (f" AS {REASON_COLUMN}#", " AS doubled#"):  # in a whole-stage codegen stage
        steps = [node for node in nodes if made in node]
        assert steps and all(node.startswith("*(") for node in steps), steps
