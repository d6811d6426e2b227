"""The catalog's type language: Spark SQL's complex types nested to any depth, checked without pyspark, with errors
that point at the bad part; and `python -m sluice.catalog validate`."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.catalog import parse_catalog
from sluice.errors import CatalogError
from sluice.model.types import TypeSyntaxError, parse
from tests.helpers import events_stream, write_catalog

GITHUB_SCHEMA = {
    "id": "string not null",
    "type": "string not null",
    "actor": "struct<id: bigint not null, login: string, `display.name`: string>",
    "repo": "struct<id: bigint, name: string>",
    "payload": "struct<size: int, commits: array<struct<sha: string, `author-email`: string>>, labels: "
               "map<string, bigint>>",
    "created_at": "timestamp",
    "`user-agent`": "string",
    "score": "smallint",
    "rank": "tinyint",
    "seen_at": "timestamp_ntz",
}


def github_stream() -> dict[str, object]:
    return events_stream(source={"type": "files", "format": "json", "path": "github", "schema": dict(GITHUB_SCHEMA)},
                         transform="identity", sink={"path": "bronze/github", "engine": "rs"})


@pytest.mark.parametrize(("text", "sql", "nullable"), [
    ("struct<id: bigint, login: string>", "STRUCT<`id`: BIGINT, `login`: STRING>", True),
    ("struct<id bigint not null>", "STRUCT<`id`: BIGINT NOT NULL>", True),
    ("array<string> not null", "ARRAY<STRING>", False),
    ("array<struct<sha: string>>", "ARRAY<STRUCT<`sha`: STRING>>", True),
    ("MAP<string, array<map<string, decimal(10,2)>>>", "MAP<STRING, ARRAY<MAP<STRING, DECIMAL(10,2)>>>", True),
    ("struct<`a.b`: int, `c d`: struct<`e-f`: timestamp_ntz>>", "STRUCT<`a.b`: INT, `c d`: STRUCT<`e-f`: "
     "TIMESTAMP_NTZ>>", True),
    ("smallint", "SMALLINT", True), ("tinyint not null", "TINYINT", False),
])
def test_complex_types_nest_to_any_depth(text: str, sql: str, nullable: bool) -> None:
    data_type, is_nullable = parse(text)
    assert (data_type.sql(), is_nullable) == (sql, nullable)


@pytest.mark.parametrize(("text", "message"), [
    ("struct<id bigint", "expected '>' to close struct<...> (or ',' before the next field) at position 16"),
    ("array<>", "expected a type at position 6: array<⟨here⟩>"),
    ("map<string>", "expected ',' between a map's key type and its value type at position 10"),
    ("struct<>", "expected a field name"),
    ("struct<a: int, a: string>", "field 'a' is declared twice"),
    ("struct<a: varchar>", "unknown type 'varchar'"),
    ("decimal(39,2)", "decimal precision must be 1..38"),
    ("array<int> not", "expected 'null' after 'not'"),
    # What Spark would get wrong later is refused now.
    ("map<string, struct<x: int not null>>", "a 'not null' inside a map's keys or values is not checked"),
    ("struct<`[]`: int>", "a field name cannot be '[]'"),
    ("struct<id: int, ID: int>", "field 'ID' is declared twice (names are case-insensitive)"),
])
def test_a_bad_type_is_refused_pointing_at_the_bad_part(text: str, message: str) -> None:
    with pytest.raises(TypeSyntaxError) as raised:
        parse(text)
    assert message in str(raised.value)


def test_the_catalog_names_the_field_of_a_bad_nested_type() -> None:
    stream = events_stream()
    stream["source"]["schema"] = {"event_id": "string not null", "actor": "struct<id bigint"}
    with pytest.raises(CatalogError, match=r"stream 'events'.*source\.schema\.actor.*close struct"):
        parse_catalog({"streams": [stream]})


def test_a_github_like_schema_loads_with_nested_not_null_paths() -> None:
    stream = github_stream()
    schema = parse_catalog({"streams": [stream]}).get("events").source.schema
    assert schema.names[-4:] == ["user-agent", "score", "rank", "seen_at"]
    assert schema.required == ["id", "type"]
    assert schema.required_paths == ["id", "type", "actor.id"]
    assert "`display.name`: STRING" in schema.ddl()


def test_csv_cannot_declare_complex_columns() -> None:
    stream = events_stream(source={"type": "files", "format": "csv", "path": "events",
                                   "schema": {"id": "string", "tags": "array<string>"}})
    with pytest.raises(CatalogError, match=r"source\.schema\.tags.*a csv field holds text"):
        parse_catalog({"streams": [stream]})


def test_validate_prints_the_streams_or_the_first_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sluice.catalog.__main__ import main

    stream = github_stream()
    good = write_catalog(tmp_path, stream)
    assert main(["validate", str(good)]) == 0
    out = capsys.readouterr().out
    assert "events: files json github -> delta bronze/github (append, rs)" in out
    assert "    actor: STRUCT<`id`: BIGINT NOT NULL, `login`: STRING, `display.name`: STRING>" in out
    assert "  schema_evolution rescue (undeclared fields and misfits in _rescued_data)" in out
    stream["source"]["schema"] = {"id": "array<>"}  # type: ignore[index]
    (tmp_path / "bad").mkdir()
    bad = write_catalog(tmp_path / "bad", stream)
    assert main(["validate", str(bad)]) == 2
    assert "stream 'events'" in capsys.readouterr().err


def test_validate_checks_the_bundled_catalog() -> None:
    from sluice.catalog.__main__ import main

    assert main(["validate"]) == 0



def _policy(source: dict[str, object]) -> str:
    stream = events_stream(source=source, transform="identity", sink={"path": "bronze/events", "engine": "rs"})
    return parse_catalog({"streams": [stream]}).get("events").source.schema_evolution.value


JSON_SOURCE = {"type": "files", "format": "json", "path": "events", "schema": {"id": "string not null"}}
KAFKA_SOURCE = {"type": "kafka", "format": "json", "options": {"subscribe": "t"}, "schema": {"id": "string"}}


@pytest.mark.parametrize(("source", "policy"), [
    (JSON_SOURCE, "rescue"),
    ({**JSON_SOURCE, "format": "csv"}, "rescue"),
    ({**JSON_SOURCE, "format": "parquet"}, "rescue"),
    ({**JSON_SOURCE, "format": "parquet", "options": {"int96RebaseMode": "LEGACY"}}, "none"),
    (KAFKA_SOURCE, "rescue"),
    ({"type": "delta", "path": "bronze/x", "schema": {"id": "string"}}, "rescue"),
    ({"type": "delta", "path": "bronze/x", "schema": {"id": "string"}, "schema_evolution": "fail_on_new_columns"},
     "fail_on_new_columns"),
    ({**JSON_SOURCE, "schema_evolution": "fail_on_new_columns"}, "fail_on_new_columns"),
    ({**JSON_SOURCE, "schema_evolution": "add_new_columns"}, "add_new_columns"),
    ({**JSON_SOURCE, "schema_evolution": "none", "options": {"allowComments": True}}, "none"),
])
def test_the_drift_policy_defaults_to_rescue_where_the_source_can_rescue(source: dict[str, object],
                                                                        policy: str) -> None:
    assert _policy(source) == policy


@pytest.mark.parametrize(("source", "field", "message"), [
    ({**JSON_SOURCE, "schema_evolution": "sometimes"}, "source.schema_evolution",
     "unknown value 'sometimes'; expected one of rescue, add_new_columns, fail_on_new_columns, none"),
    ({**JSON_SOURCE, "format": "parquet", "options": {"datetimeRebaseMode": "LEGACY"}, "schema_evolution": "rescue"},
     "source.options.datetimeRebaseMode",
     "reads each Parquet file with pyarrow, which takes no Spark reader option"),
    ({**JSON_SOURCE, "format": "csv", "schema_evolution": "fail_on_new_columns"}, "source.schema_evolution",
     "fail_on_new_columns finds a CSV file's new columns by the names in its header: set options.header: true"),
    ({**JSON_SOURCE, "format": "csv", "options": {"header": True, "enforceSchema": True},
      "schema_evolution": "add_new_columns"}, "source.schema_evolution", "(without enforceSchema)"),
    ({**KAFKA_SOURCE, "format": "avro", "value_schema": '{"type": "record", "name": "r", "fields": [{"name": "id", '
                                                        '"type": "string"}]}', "schema_evolution": "rescue"},
     "source.schema_evolution", "a kafka avro source cannot follow rescue; it takes none"),
    ({**JSON_SOURCE, "options": {"allowComments": True}}, "source.options.allowComments",
     "set schema_evolution: none to read lenient JSON"),
    ({**JSON_SOURCE, "options": {"encoding": "UTF-16"}}, "source.options.encoding", "reads UTF-8 text"),
])
def test_a_policy_the_source_cannot_follow_is_refused_naming_the_field(source: dict[str, object], field: str,
                                                                      message: str) -> None:
    with pytest.raises(CatalogError) as raised:
        _policy(source)
    assert "stream 'events'" in str(raised.value) and field in str(raised.value) and message in str(raised.value)


def test_rules_and_transforms_may_read_the_rescued_column_only_where_it_exists() -> None:
    rule = {"no_drift": {"check": "_rescued_data IS NULL", "on_violation": "warn"}}
    stream = events_stream(source=dict(JSON_SOURCE), transform="identity", expectations=rule,
                           sink={"path": "bronze/events", "engine": "rs"})
    loaded = parse_catalog({"streams": [stream]}).get("events")
    assert "_rescued_data" in loaded.output_columns
    stream["source"] = {**JSON_SOURCE, "schema_evolution": "none"}
    with pytest.raises(CatalogError, match="_rescued_data"):
        parse_catalog({"streams": [stream]})


@pytest.mark.parametrize(("overrides", "reason"), [
    ({"sink": {"format": "kafka", "topic": "out"}}, "a kafka sink has no table schema to add columns to"),
    ({"sink": {"path": "bronze/events", "mode": "merge", "keys": ["id"], "sequence_by": "at"}},
     "mode merge does not append"),
    ({"fan_out": [{"path": "bronze/copy", "where": "id IS NOT NULL"}]}, "fan-out tables"),
    ({"dedupe": {"keys": ["id"]}, "watermark": {"column": "at", "delay": "1 hour"}},
     "stateful steps"),
])
def test_add_new_columns_is_refused_where_one_append_cannot_take_a_new_column(overrides: dict[str, object],
                                                                              reason: str) -> None:
    source = {**JSON_SOURCE, "schema": {"id": "string not null", "at": "timestamp not null"},
              "schema_evolution": "add_new_columns"}
    stream = events_stream(source=source, transform="identity", sink={"path": "bronze/events", "engine": "rs"})
    stream.update(overrides)
    with pytest.raises(CatalogError) as raised:
        parse_catalog({"streams": [stream]})
    assert "source.schema_evolution" in str(raised.value) and reason in str(raised.value)
    assert "choose rescue" in str(raised.value)
