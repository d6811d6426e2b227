"""Stateful patterns in the catalog: each output-mode rule Spark enforces (or silently gets wrong) is refused when
the catalog loads, with the stream, the field and the fix in the message."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.catalog import parse_catalog
from sluice.constants import SinkMode
from sluice.model.patterns import WindowType
from sluice.times import parse_interval
from tests.unit.test_catalog import catalog_with, rejects

SCHEMA = {"event_id": "string not null", "user_id": "string", "amount": "double", "event_time": "timestamp not null",
          "day": "date"}
WATERMARK = {"column": "event_time", "delay": "10 minutes"}
TUMBLING = {"window": {"type": "tumbling", "column": "event_time", "duration": "1 hour"},
            "measures": {"revenue": "sum(amount)", "events": "count(*)"}}


def silver(**fields: Any) -> dict[str, Any]:
    sink = fields.pop("sink", {})
    return {"name": "silver", "source": {"type": "delta", "path": "bronze/events", "schema": SCHEMA},
            "schedule": "*/5 * * * *", "sink": {"path": "silver/events", **sink}, **fields}


def test_a_full_gold_stream_parses_with_its_output_columns() -> None:
    stream = parse_catalog(catalog_with(silver(
        watermark=WATERMARK, dedupe={"keys": ["event_id"]},
        lookup=[{"table": "dim/users", "on": ["user_id"], "columns": ["country"]}],
        aggregate={**TUMBLING, "group_by": ["country"]}, sink={"mode": "merge", "partition_by": ["country"]},
    ))).get("silver")
    assert stream.patterns.stateful
    assert stream.patterns.watermark is not None and stream.patterns.watermark.delay_seconds == 600
    assert stream.patterns.aggregate is not None and stream.patterns.aggregate.window is not None
    assert stream.patterns.aggregate.window.type is WindowType.TUMBLING
    assert stream.sink.mode is SinkMode.MERGE
    assert stream.output_columns == ("window_start", "window_end", "country", "revenue", "events")


@pytest.mark.parametrize(("text", "seconds"), [("10 minutes", 600), ("1 hour", 3600), ("30s", 30), ("2 days", 172800),
                                               ("1 minute", 60), ("5m", 300)])
def test_intervals(text: str, seconds: int) -> None:
    assert parse_interval(text) == seconds


@pytest.mark.parametrize(("fields", "fragments"), [
    ({"dedupe": {"keys": ["event_id"]}}, ["dedupe:", "state forever", "watermark"]),
    ({"watermark": WATERMARK, "dedupe": {"keys": ["id"]}}, ["dedupe.keys", "key column(s) id"]),
    ({"watermark": {"column": "day", "delay": "1 hour"}, "dedupe": {"keys": ["event_id"]}},
     ["watermark.column", "must be a timestamp", "DATE"]),
    ({"watermark": WATERMARK}, ["watermark:", "none of them; remove it"]),
    ({"watermark": {"column": "event_time", "delay": "soon"}}, ["watermark.delay", "positive duration"]),
    ({"aggregate": TUMBLING}, ["watermark:", "state grows forever", "complete"]),
    ({"watermark": WATERMARK, "aggregate": {**TUMBLING, "window": None}},
     ["sink.mode", "append mode emits an aggregate row once", "merge"]),
    ({"watermark": WATERMARK, "aggregate": {**TUMBLING, "group_by": ["user_id"], "window": {
        "type": "tumbling", "column": "day", "duration": "1 hour"}}}, ["sink.mode", "on the watermark column"]),
    ({"sink": {"mode": "complete"}}, ["sink.mode", "needs an `aggregate`"]),
    ({"sink": {"mode": "merge", "keys": ["event_id"]}}, ["sink.sequence_by", "updated_at"]),
    ({"sink": {"mode": "merge", "keys": ["user_id"], "sequence_by": "event_time"}},
     ["sink.keys", "must be declared `not null`"]),
    ({"sink": {"mode": "merge"}}, ["sink.keys", "name the key column(s)"]),
    ({"sink": {"keys": ["event_id"]}}, ["sink.keys", "for mode merge"]),
    ({"watermark": WATERMARK, "aggregate": {**TUMBLING, "window": {"type": "session", "column": "event_time",
                                                                   "gap": "5 minutes"}},
      "sink": {"mode": "merge"}}, ["sink.mode", "session window's bounds move"]),
    ({"watermark": WATERMARK, "aggregate": TUMBLING, "sink": {"mode": "merge", "keys": ["event_id"]}},
     ["sink.keys", "merged on its own keys", "remove sink.keys"]),
    ({"watermark": WATERMARK, "aggregate": {**TUMBLING, "measures": {"x": "median(amount)"}}},
     ["aggregate.measures.x", "function(column)"]),
    ({"watermark": WATERMARK, "aggregate": {**TUMBLING, "measures": {"x": "sum(price)"}}},
     ["aggregate.measures.x", "column price"]),
    ({"watermark": WATERMARK, "aggregate": {**TUMBLING, "window": {"type": "tumbling", "column": "event_time",
                                                                   "duration": "1 hour", "gap": "1 minute"}}},
     ["aggregate.window.gap", "only a session window"]),
    ({"watermark": WATERMARK, "aggregate": {**TUMBLING, "window": {"type": "sliding", "column": "event_time",
                                                                   "duration": "1 hour", "slide": "2 hours"}}},
     ["aggregate.window.slide", "skip events"]),
    ({"aggregate": {**TUMBLING, "window": None}, "sink": {"mode": "complete"},
      "fan_out": [{"path": "x", "where": "amount > 1"}]}, ["fan_out", "complete mode"]),
    ({"fan_out": [{"path": "x", "where": "amount > 1; drop table t"}]},
     ["fan_out[0].where", "must be one expression, found 2"]),
    ({"fan_out": [{"path": "x", "where": "amount > 1", "columns": ["nope"]}]}, ["fan_out[0].columns", "nope"]),
    ({"lookup": [{"table": "dim/users", "on": ["user_id"], "columns": ["amount"]}]},
     ["lookup[0].columns", "already exist"]),
    ({"lookup": [{"table": "dim/users", "on": ["user_id"], "columns": ["_sluice_rules_0"]}]},
     ["lookup[0].columns", "_sluice_rules_0 start with '_'"]),
    ({"sink": {"partition_by": ["country"]}}, ["sink.partition_by", "country"]),
])
def test_refused_combinations_name_the_field_and_the_fix(fields: dict[str, Any], fragments: list[str]) -> None:
    rejects(catalog_with(silver(**fields)), "stream 'silver'", *fragments)


CLICKS = {"type": "delta", "path": "silver/clicks",
          "schema": {"ad_id": "string not null", "click_id": "string not null", "click_time": "timestamp not null"}}
IMPRESSIONS = {"ad_id": "string not null", "impression_id": "string not null",
               "impression_time": "timestamp not null"}


def impressions(**fields: Any) -> dict[str, Any]:
    join = {"source": CLICKS, "watermark": {"column": "click_time", "delay": "10 minutes"}, "on": ["ad_id"],
            "within": {"left": "impression_time", "right": "click_time", "max_delay": "1 hour"}}
    join.update(fields.pop("join", {}))
    return {"name": "attributed", "source": {"type": "delta", "path": "silver/impressions", "schema": IMPRESSIONS},
            "schedule": "*/5 * * * *", "sink": {"path": "gold/attributed", **fields.pop("sink", {})},
            "watermark": {"column": "impression_time", "delay": "10 minutes"}, "join": join, **fields}


def test_a_stream_stream_join_parses() -> None:
    stream = parse_catalog(catalog_with(impressions(join={"type": "left_outer"}))).get("attributed")
    assert stream.patterns.join is not None and stream.patterns.join.max_delay_seconds == 3600
    assert stream.output_columns == ("ad_id", "impression_id", "impression_time", "click_id", "click_time")
    assert stream.patterns.join.source.schema_evolution.value == "none", "the joined side rescues nothing"


@pytest.mark.parametrize(("fields", "fragments"), [
    ({"watermark": None}, ["join:", "watermark on both sides"]),
    ({"join": {"watermark": None}}, ["join.watermark", "is required"]),
    ({"join": {"within": {"left": "impression_time", "right": "click_time"}}}, ["join.within.max_delay"]),
    ({"join": {"within": {"left": "ad_id", "right": "click_time", "max_delay": "1 hour"}}},
     ["join.within.left", "watermark column"]),
    ({"join": {"on": ["impression_id"]}}, ["join.on", "joined source"]),
    ({"sink": {"mode": "merge", "keys": ["ad_id"]}}, ["sink.mode", "append-only"]),
    ({"aggregate": {"group_by": ["ad_id"], "measures": {"n": "count(*)"}}}, ["aggregate", "downstream stream"]),
    ({"join": {"source": {**CLICKS, "schema": {**CLICKS["schema"], "impression_id": "string"}}}},
     ["join.source.schema", "impression_id", "both sides"]),
    ({"join": {"type": "full"}}, ["join.type", "inner, left_outer"]),
    ({"join": {"source": {**CLICKS, "schema_evolution": "rescue"}}},
     ["join.source.schema_evolution", "reads its declared columns only; it takes none"]),
])
def test_refused_joins(fields: dict[str, Any], fragments: list[str]) -> None:
    rejects(catalog_with(impressions(**fields)), "stream 'attributed'", *fragments)


def test_fan_out_tables_are_claimed_like_sinks() -> None:
    fan_out = {"fan_out": [{"path": "silver/events", "where": "amount > 1"}]}
    rejects(catalog_with(silver(**fan_out)), "stream 'silver'", "fan_out[0].path", "already used by stream 'silver'")
    twice = {"fan_out": [{"path": "big", "where": "amount > 1"}, {"path": "big", "where": "amount > 9"}]}
    rejects(catalog_with(silver(**twice)), "fan_out[1].path", "already used")
    reader = {**silver(), "name": "reader", "source": {"type": "delta", "path": "x/big", "schema": SCHEMA},
              "sink": {"path": "gold/x"}, "schedule": None}
    catalog = parse_catalog(catalog_with(silver(fan_out=[{"path": "x/big", "where": "amount > 1"}]), reader))
    assert catalog.upstream_of(catalog.get("reader")) is catalog.get("silver")


def test_merge_rules_for_sequences_and_windowless_aggregates() -> None:
    schema = {**SCHEMA, "updated_at": "timestamp"}
    nullable = silver(sink={"mode": "merge", "keys": ["event_id"], "sequence_by": "updated_at"})
    nullable["source"]["schema"] = schema
    rejects(catalog_with(nullable), "sink.sequence_by", "must be declared `not null`")
    rejects(catalog_with(silver(sink={"mode": "merge", "keys": ["event_id"], "sequence_by": "nope"})),
            "sink.sequence_by", "'nope' is not in the output")
    # A group-by aggregate has no event time to evict by: its state is one row per group, watermark or not.
    totals = parse_catalog(catalog_with(silver(aggregate={"group_by": ["user_id"], "measures": {"n": "count(*)"}},
                                               sink={"mode": "merge"}))).get("silver")
    assert totals.output_columns == ("user_id", "n")


def json_silver(**fields: Any) -> dict[str, Any]:
    stream = silver(**fields)
    stream["source"] = {"type": "files", "format": "json", "path": "events", "schema": SCHEMA,
                        **fields.pop("source", {})}
    return stream


def test_an_aggregate_reads_none_by_default_and_cannot_rescue() -> None:
    """An aggregate keeps no row to carry rescued data, and would count a value that does not fit as NULL."""
    aggregate = {"watermark": WATERMARK, "aggregate": TUMBLING, "sink": {"mode": "merge"}}
    stream = parse_catalog(catalog_with(json_silver(**aggregate))).get("silver")
    assert stream.source.schema_evolution.value == "none"
    assert "_rescued_data" not in stream.output_columns
    rescuing = json_silver(**aggregate)
    rescuing["source"]["schema_evolution"] = "rescue"
    message = rejects(catalog_with(rescuing))
    assert "source.schema_evolution" in message and "an aggregate keeps no row to carry _rescued_data" in message
    failing = json_silver(**aggregate)
    failing["source"]["schema_evolution"] = "fail_on_new_columns"
    assert parse_catalog(catalog_with(failing)).get("silver").source.schema_evolution.value == "fail_on_new_columns"


def test_a_dedupe_keeps_the_rescued_data_of_its_rows() -> None:
    stream = parse_catalog(catalog_with(json_silver(watermark=WATERMARK, dedupe={"keys": ["event_id"]}))).get("silver")
    assert stream.source.schema_evolution.value == "rescue" and "_rescued_data" in stream.output_columns
