"""The catalog's key table (sluice.catalog.keys) against the parsers, and the JSON Schema generated from it.

The table is checked against what the loader does, block by block: it lists exactly the keys the parser accepts (read
from the parser's own "allowed here" refusal), and every bound, choice, type and required key it declares is one the
loader refuses past. The schema must accept the bundled catalogs and refuse what the loader refuses, where a schema
can tell.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from sluice.catalog import DEFAULT_CATALOG, parse_catalog
from sluice.catalog.keys import BLOCKS, Block, Key, Type, reference_markdown
from sluice.catalog.schema import SCHEMA_FILE, catalog_schema, schema_text
from sluice.catalog.yaml_loader import load_yaml
from sluice.errors import CatalogError
from tests.helpers import events_stream
from tests.unit.test_catalog import silver as delta_stream
from tests.unit.test_kafka import kafka_stream
from tests.unit.test_patterns import TUMBLING, WATERMARK, impressions
from tests.unit.test_patterns import silver as pattern_stream

VALIDATOR = jsonschema.Draft202012Validator(catalog_schema())
BUNDLED = [DEFAULT_CATALOG, DEFAULT_CATALOG.with_name("streams_kafka.yaml")]


def catalog_with(*streams: dict[str, Any]) -> dict[str, Any]:
    return {"version": 1, "streams": list(streams)}


# Each block of the table, in a catalog the loader accepts, with the path to the block's mapping.
EXAMPLES: dict[str, tuple[Callable[[], dict[str, Any]], tuple[Any, ...]]] = {
    "catalog": (lambda: catalog_with(events_stream()), ()),
    "stream": (lambda: catalog_with(events_stream()), ("streams", 0)),
    "source (files, json)": (lambda: catalog_with(events_stream()), ("streams", 0, "source")),
    "source (files, csv)": (lambda: catalog_with(events_stream(source={
        **events_stream()["source"], "format": "csv", "options": {"header": True}})), ("streams", 0, "source")),
    "source (files, parquet)": (lambda: catalog_with(events_stream(source={
        **events_stream()["source"], "format": "parquet", "options": {}})), ("streams", 0, "source")),
    "clean": (lambda: catalog_with(events_stream(source={**events_stream()["source"], "clean": {
        "action": "archive", "after": "7 days", "archive_to": "archive/events"}})), ("streams", 0, "source", "clean")),
    "notifications": (lambda: catalog_with(events_stream(source={
        **events_stream()["source"], "path": "s3a://landing/events", "notifications": {
            "queue": "landing-events", "list_every": "6 hours", "connection": "sluice_queue"}})),
        ("streams", 0, "source", "notifications")),
    "source (delta)": (lambda: catalog_with(events_stream(), delta_stream()), ("streams", 1, "source")),
    "source (kafka)": (lambda: catalog_with(kafka_stream()), ("streams", 0, "source")),
    "sink (delta)": (lambda: catalog_with(events_stream()), ("streams", 0, "sink")),
    "sink (kafka)": (lambda: catalog_with(events_stream(sink={"format": "kafka", "topic": "events.out"})),
                     ("streams", 0, "sink")),
    "source (iceberg)": (lambda: catalog_with({
        "name": "silver", "transform": "identity", "checkpoint": "silver/events", "schedule": "*/5 * * * *",
        "source": {"type": "iceberg", "table": "bronze.events", "schema": {"event_id": "string not null"},
        "options": {"streaming-skip-delete-snapshots": True}}, "sink": {"path": "silver/events"}}),
        ("streams", 0, "source")),
    "sink (iceberg)": (lambda: catalog_with(events_stream(sink={"format": "iceberg", "table": "bronze.events"})),
                       ("streams", 0, "sink")),
    "expectation": (lambda: catalog_with(events_stream(expectations={"known": {"check": "event_id IS NOT NULL"}})),
                    ("streams", 0, "expectations", "known")),
    "watermark": (lambda: catalog_with(pattern_stream(watermark=WATERMARK, dedupe={"keys": ["event_id"]})),
                  ("streams", 0, "watermark")),
    "dedupe": (lambda: catalog_with(pattern_stream(watermark=WATERMARK, dedupe={"keys": ["event_id"]})),
               ("streams", 0, "dedupe")),
    "join": (lambda: catalog_with(impressions()), ("streams", 0, "join")),
    "within": (lambda: catalog_with(impressions()), ("streams", 0, "join", "within")),
    "lookup": (lambda: catalog_with(pattern_stream(lookup=[{"table": "dim/users", "on": ["user_id"],
                                                            "columns": ["country"]}])), ("streams", 0, "lookup", 0)),
    "aggregate": (lambda: catalog_with(pattern_stream(watermark=WATERMARK, aggregate=copy.deepcopy(TUMBLING),
                                                      sink={"mode": "merge"})), ("streams", 0, "aggregate")),
    "window": (lambda: catalog_with(pattern_stream(watermark=WATERMARK, aggregate=copy.deepcopy(TUMBLING),
                                                   sink={"mode": "merge"})), ("streams", 0, "aggregate", "window")),
    "cdc": (lambda: catalog_with(events_stream(sink={
        "path": "silver/users", "mode": "cdc", "keys": ["user_id"], "sequence_by": "event_time",
        "cdc": {"delete_when": "event_type = 'deleted'", "scd_type": 2, "except_columns": ["page"],
                "track_history_columns": ["currency"], "delete_retention": "3 days"}})), ("streams", 0, "sink", "cdc")),
    "fan_out": (lambda: catalog_with(events_stream(fan_out=[{"path": "bronze/purchases",
                                                             "where": "event_type = 'purchase'"}])),
                ("streams", 0, "fan_out", 0)),
    "dead_letter": (lambda: catalog_with(events_stream(dead_letter={"path": "bronze/events_rejected"})),
                    ("streams", 0, "dead_letter")),
    "arrival": (lambda: catalog_with(events_stream(arrival={"settle": "10s", "max_wait": "2 minutes"})),
                ("streams", 0, "arrival")),
    "trigger": (lambda: catalog_with(events_stream(trigger={"max_files_per_trigger": 5})), ("streams", 0, "trigger")),
    "alerts": (lambda: catalog_with(events_stream(alerts={"warn_files": 10})), ("streams", 0, "alerts")),
    "backfill": (lambda: catalog_with(events_stream(backfill={"max_range_days": 3})), ("streams", 0, "backfill")),
}


def example(block: Block) -> tuple[dict[str, Any], dict[str, Any]]:
    """A fresh accepted catalog holding the block, and the block's mapping inside it."""
    build, path = EXAMPLES[block.name]
    raw = copy.deepcopy(build())  # the examples share module-level dicts of other tests
    found: Any = raw
    for step in path:
        found = found[step]
    return raw, found


def schema_errors(raw: object) -> list[str]:
    return [f"{error.json_path}: {error.message}" for error in VALIDATOR.iter_errors(raw)]


def both_refuse(raw: dict[str, Any], what: str) -> None:
    with pytest.raises(CatalogError):
        parse_catalog(raw)
    assert schema_errors(raw), f"the schema accepts what the loader refuses: {what}"


def test_every_block_has_an_example_that_both_accept() -> None:
    assert set(EXAMPLES) == {block.name for block in BLOCKS}
    for block in BLOCKS:
        raw, _ = example(block)
        parse_catalog(raw)
        assert not schema_errors(raw), block.name


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: block.name)
def test_each_block_lists_exactly_the_keys_its_parser_accepts(block: Block) -> None:
    raw, mapping = example(block)
    mapping["zz_unknown"] = 1
    with pytest.raises(CatalogError) as caught:
        parse_catalog(raw)
    allowed = re.search(r"allowed here: (.*)$", str(caught.value))
    assert allowed is not None, str(caught.value)
    assert sorted(allowed.group(1).split(", ")) == sorted(key.name for key in block.keys)
    assert schema_errors(raw), "the schema accepts an unknown key"


def keys_of(kind: Callable[[Key], bool]) -> list[tuple[Block, Key]]:
    return [(block, key) for block in BLOCKS for key in block.keys if kind(key)]


def _id(case: tuple[Block, Key]) -> str:
    return f"{case[0].name}.{case[1].name}"


@pytest.mark.parametrize("case", keys_of(lambda key: key.maximum is not None or key.minimum is not None), ids=_id)
def test_bounds_are_the_loaders(case: tuple[Block, Key]) -> None:
    block, key = case
    if key.maximum is not None:
        raw, mapping = example(block)
        mapping[key.name] = key.maximum + 1
        both_refuse(raw, f"{key.name} above its bound")
    if key.minimum is not None:
        raw, mapping = example(block)
        mapping[key.name] = key.minimum - 1
        both_refuse(raw, f"{key.name} below its bound")


@pytest.mark.parametrize("case", keys_of(lambda key: key.type is Type.CHOICE), ids=_id)
def test_choices_are_the_loaders(case: tuple[Block, Key]) -> None:
    block, key = case
    raw, mapping = example(block)
    mapping[key.name] = "zz_none_of_them"
    both_refuse(raw, f"an unknown {key.name}")


@pytest.mark.parametrize("case", keys_of(lambda key: key.required), ids=_id)
def test_required_keys_are_the_loaders(case: tuple[Block, Key]) -> None:
    block, key = case
    raw, mapping = example(block)
    del mapping[key.name]
    both_refuse(raw, f"no {key.name}")


@pytest.mark.parametrize("case", keys_of(lambda key: key.type in (Type.INTEGER, Type.BOOLEAN)), ids=_id)
def test_scalar_types_are_the_loaders(case: tuple[Block, Key]) -> None:
    block, key = case
    raw, mapping = example(block)
    mapping[key.name] = "1" if key.type is Type.INTEGER else "yes"
    both_refuse(raw, f"{key.name} of the wrong type")
    if key.type is Type.INTEGER:
        raw, mapping = example(block)
        mapping[key.name] = True
        both_refuse(raw, f"{key.name} as a boolean")


# The refusals of tests/unit/test_catalog.py, test_kafka.py and test_patterns.py that a schema can express.
def _with(change: Callable[[dict[str, Any]], Any], build: Callable[[], dict[str, Any]] = events_stream) -> Any:
    def make() -> dict[str, Any]:
        stream = build()
        change(stream)
        return catalog_with(stream)
    return make


REFUSALS: dict[str, Callable[[], dict[str, Any]]] = {
    "unknown stream key": lambda: catalog_with(events_stream(sheduel="* * * * *")),
    "unknown source key": _with(lambda s: s["source"].update(glob="*.json")),
    "unknown top-level key": lambda: {**catalog_with(events_stream()), "stream": []},
    "source without schema": _with(lambda s: s["source"].pop("schema")),
    "bad stream name": lambda: catalog_with(events_stream("Events-Bronze")),
    "both trigger limits": lambda: catalog_with(events_stream(trigger={"max_files_per_trigger": 5,
                                                                       "max_bytes_per_trigger": 1024})),
    "non-positive trigger limit": lambda: catalog_with(events_stream(trigger={"max_files_per_trigger": 0})),
    "boolean as an integer": lambda: catalog_with(events_stream(trigger={"max_files_per_trigger": True})),
    "unknown source option": _with(lambda s: s["source"]["options"].update(maxFilesPerTrigger=10)),
    "unknown engine": _with(lambda s: s["sink"].update(engine="photon")),
    "unknown format": _with(lambda s: s["source"].update(format="xml")),
    "missing sink": _with(lambda s: s.pop("sink")),
    "unsupported version": lambda: {**catalog_with(events_stream()), "version": 2},
    "unknown transform": lambda: catalog_with(events_stream(transform="silverize")),
    "bad group name": lambda: catalog_with(events_stream(group="Nightly")),
    "email without @": lambda: catalog_with(events_stream(alerts={"email_to": ["ops"]})),
    "tags not strings": lambda: catalog_with(events_stream(tags=[1])),
    "bad duration": lambda: catalog_with(pattern_stream(watermark={"column": "event_time", "delay": "soon"})),
    "join type full": lambda: catalog_with(impressions(join={"type": "full"})),
    "kafka options without a subscription": lambda: catalog_with(kafka_stream(options={
        "startingOffsets": "earliest"})),
    "kafka options with two subscriptions": lambda: catalog_with(kafka_stream(options={
        "subscribe": "a", "subscribePattern": "b.*"})),
    "kafka broker setting in options": lambda: catalog_with(kafka_stream(options={
        "subscribe": "a", "kafka.bootstrap.servers": "broker:9092"})),
    "kafka sink without topic": lambda: catalog_with(events_stream(sink={"format": "kafka"})),
    "kafka sink in merge mode": lambda: catalog_with(events_stream(sink={"format": "kafka", "topic": "t",
                                                                         "mode": "merge"})),
    "measure name not an identifier": lambda: catalog_with(pattern_stream(
        watermark=WATERMARK, aggregate={**TUMBLING, "measures": {"two words": "count(*)"}}, sink={"mode": "merge"})),
    "an empty schema": _with(lambda s: s["source"].update(schema={})),
    "dedupe without keys": lambda: catalog_with(pattern_stream(watermark=WATERMARK, dedupe={"keys": []})),
    "transform with a key beside sql": lambda: catalog_with(events_stream(transform={"sql": "SELECT * FROM source",
                                                                                     "lang": "sql"})),
}


@pytest.mark.parametrize("name", REFUSALS)
def test_the_schema_refuses_what_the_loader_refuses(name: str) -> None:
    both_refuse(REFUSALS[name](), name)


@pytest.mark.parametrize("path", BUNDLED, ids=lambda path: path.name)
def test_the_bundled_catalogs_name_the_schema_and_pass_it(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.splitlines()[0] == "# yaml-language-server: $schema=./catalog/streams.schema.json"
    assert (path.parent / "catalog" / "streams.schema.json").resolve() == SCHEMA_FILE
    assert not schema_errors(load_yaml(text, source=str(path)))


def test_the_shipped_schema_is_the_generated_one() -> None:
    assert SCHEMA_FILE.read_text(encoding="utf-8") == schema_text(), "run `make schema`"
    jsonschema.Draft202012Validator.check_schema(json.loads(schema_text()))


def test_the_reference_names_every_key_with_its_bound() -> None:
    text = reference_markdown()
    for block in BLOCKS:
        for key in block.keys:
            assert f"| `{key.name}` |" in text
    assert "<= 1,000,000 |" in text  # max_files_per_trigger's bound, from sluice.limits
