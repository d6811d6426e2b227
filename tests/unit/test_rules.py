"""Expectations and SQL transforms, checked when the catalog loads (no Spark): what is refused, with the rule or the
transform named, and what the transform hands on to the rules, the patterns and the sink."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.catalog import parse_catalog
from sluice.errors import CatalogError
from sluice.model.expectations import NullResult, Violation
from sluice.model.sql import SqlTransform, _select_list, spark_select
from tests.helpers import EXAMPLE_RULES, RULES_SCHEMA, events_stream

SCHEMA = {**RULES_SCHEMA, "actor": "struct<id: bigint, login: string>"}
TRANSFORM = ("SELECT * EXCEPT (event_type), lower(trim(event_type)) AS event_type, to_date(event_time) AS event_date, "
             "amount * 100 AS cents FROM source")
RULES = EXAMPLE_RULES


def load(**overrides: Any) -> Any:
    stream = events_stream(**{"source": {"type": "files", "format": "json", "path": "events", "schema": SCHEMA},
                              "transform": {"sql": TRANSFORM}, "expectations": RULES, **overrides})
    return parse_catalog({"version": 1, "streams": [stream]}).get("events")


def refused(**overrides: Any) -> str:
    with pytest.raises(CatalogError) as raised:
        load(**overrides)
    return str(raised.value)


def test_the_rules_and_the_sql_transform_load_with_their_columns() -> None:
    stream = load()
    assert isinstance(stream.transform, SqlTransform)
    assert stream.transform.names == ["event_id", "user_id", "amount", "currency", "event_time", "actor",
                                      "_rescued_data", "_source_file", "event_type", "event_date", "cents"]
    assert dict(stream.transform.columns)["event_date"] == "DATE"
    # The lineage column is Sluice's: the table gets it whatever the transform says, so the patterns do not see it.
    assert "_source_file" not in stream.output_columns and "cents" in stream.output_columns
    assert [(rule.name, rule.on_violation) for rule in stream.expectations] == [
        ("valid_amount", Violation.QUARANTINE), ("known_currency", Violation.WARN),
        ("not_from_the_future", Violation.DROP), ("has_user", Violation.FAIL)]
    assert all(rule.on_null is NullResult.VIOLATES for rule in stream.expectations)


def test_rules_see_the_columns_the_transform_produces() -> None:
    stream = load(expectations={"cents_fit": {"check": "cents < 1000000", "on_violation": "warn"},
                                "has_login": {"check": "actor.login IS NOT NULL", "on_null": "passes"}})
    assert [rule.on_violation for rule in stream.expectations] == [Violation.WARN, Violation.WARN]
    assert stream.expectations[1].on_null is NullResult.PASSES
    message = refused(transform={"sql": "SELECT event_id, event_time FROM source"})
    assert "expectations.valid_amount.check" in message and "'amount', which does not exist here" in message


def test_partition_columns_are_checked_against_the_transform_output() -> None:
    assert load(sink={"path": "bronze/events", "partition_by": ["event_date"], "engine": "rs"}).sink.partition_by
    message = refused(sink={"path": "bronze/events", "partition_by": ["kind"], "engine": "rs"})
    assert "sink.partition_by" in message and "kind" in message


@pytest.mark.parametrize(("rule", "expected"), [
    ({"check": "amont >= 0"}, "expectations.bad.check: the check of 'bad' names the column 'amont', which does not "
                              "exist here"),
    ({"check": "amount + 1"}, "is not a boolean expression: 'amount + 1' gives DECIMAL"),
    ({"check": "lower(currency)"}, "gives STRING"),
    ({"check": "amount >="}, "is not valid Spark SQL"),
    ({"check": "sum(amount) > 0"}, "uses the aggregate 'SUM(amount)'"),
    ({"check": "amount > 0; DROP TABLE x"}, "must be one expression, found 2"),
    ({"check": "SELECT 1"}, "must be an expression over the row, not a statement"),
    ({"check": "amount > (SELECT max(amount) FROM source)"}, "has a subquery"),
    ({"check": "currency = '${env:AWS_SECRET_ACCESS_KEY}'"}, "Spark substitutes ${...}"),
    ({"check": "reflect('java.lang.System', 'exit', '1') IS NULL"}, "calls reflect(), which runs JVM code"),
    ({"check": "amount > 0", "on_violation": "explode"}, "expectations.bad.on_violation: unknown value 'explode'; "
                                                         "expected one of warn, drop, quarantine, fail"),
    ({"check": "amount > 0", "on_null": "maybe"}, "expectations.bad.on_null: unknown value 'maybe'"),
    ({"check": "amount > 0", "severity": "high"}, "expectations.bad: unknown key(s) severity"),
    ({}, "expectations.bad.check: is required"),
])
def test_bad_rules_are_refused_with_the_rule_named(rule: dict[str, Any], expected: str) -> None:
    message = refused(expectations={"bad": rule})
    assert message.startswith("stream 'events': ")
    assert expected in message


def test_a_rule_name_must_be_an_identifier() -> None:
    assert "a rule's name must match" in refused(expectations={"Bad Name": {"check": "amount > 0"}})


@pytest.mark.parametrize(("sql", "expected"), [
    ("SELECT *, lower(nope) AS n FROM source", "names the column 'nope', which does not exist here"),
    ("SELECT * FROM source WHERE amount > 0", "has WHERE: a WHERE clause drops rows; drop them with an expectation"),
    ("SELECT currency, count(*) AS n FROM source GROUP BY currency", "has GROUP"),
    ("SELECT count(*) AS n FROM source", "uses the aggregate 'COUNT(*)'"),
    ("SELECT * FROM source UNION ALL SELECT * FROM source", "is a set operation (UNION)"),
    ("SELECT * FROM source JOIN source AS b ON true", "has JOIN: a join changes the number of rows"),
    ("SELECT DISTINCT * FROM source", "has DISTINCT"),
    ("SELECT *, explode(array(1, 2)) AS e FROM source", "uses the generator"),
    ("SELECT *, row_number() OVER (ORDER BY event_time) AS n FROM source", "window function"),
    ("SELECT * FROM events", "must read FROM source"),
    ("SELECT *, lower(event_type) FROM source", "needs a name: add AS <column>"),
    ("SELECT *, lower(event_type) AS event_type FROM source", "produces the column 'event_type' twice"),
    ("SELECT lower(event_type AS e FROM source", "is not valid Spark SQL: Expecting )"),
    ("DELETE FROM source", "must be SELECT ... FROM source"),
    ("SELECT * EXCEPT (nope) FROM source", "names the column 'nope'"),
    ("SELECT *, CAST(NULL AS STRING) AS _dead_letter_reason FROM source", "names that start with '_' are Sluice's"),
    ("SELECT *, '${env:HOME}' AS home FROM source", "Spark substitutes ${...}"),
    ("SELECT *, java_method('java.lang.Math', 'random') AS r FROM source", "calls java_method()"),
    ("SELECT *, try_avg(amount) AS a FROM source", "uses the aggregate 'TRY_AVG(amount)'"),
    ("SELECT *, histogram_numeric(amount, 3) AS h FROM source", "uses the aggregate"),
    ("SELECT /*+ REPARTITION(3) */ * FROM source", "has HINT: a hint (/*+ ... */) changes how Spark plans"),
    ("SELECT * FROM source TABLESAMPLE (10 PERCENT)", "TABLESAMPLE drops rows"),
    ("SELECT * FROM source AS s TABLESAMPLE (10 PERCENT)", "TABLESAMPLE drops rows"),
    ("SELECT *, any(amount > 0) AS a FROM source", "uses the aggregate"),
    ("SELECT *, vector_sum(array(amount)) AS v FROM source", "uses the aggregate"),
    ("SELECT * FROM source DISTRIBUTE BY currency", "DISTRIBUTE BY repartitions the batch"),
    ("SELECT * FROM source UNPIVOT (v FOR k IN (event_type, currency))", "PIVOT and UNPIVOT change the number of rows"),
])
def test_bad_transforms_are_refused_with_the_reason(sql: str, expected: str) -> None:
    message = refused(transform={"sql": sql}, expectations={})
    assert message.startswith("stream 'events': transform.sql: the transform")
    assert expected in message


def test_casts_to_types_with_commas_keep_their_select_items_whole() -> None:
    sql = ("SELECT *, map('a', 1)::MAP<STRING, BIGINT> AS m, CAST(array(1) AS ARRAY<STRUCT<a: INT, b: INT>>) AS s, "
           "amount < 5 AS small, 1 >> 1 AS shifted FROM source")
    assert _select_list("SELECT map < 5 AS a, array > 1 AS b FROM t") == ["map < 5 AS a", "array > 1 AS b"], \
        "a column named like a type compares"

    stream = load(transform={"sql": sql}, expectations={}, sink={"path": "bronze/events", "engine": "rs"})
    assert isinstance(stream.transform, SqlTransform)
    assert [projection.text for projection in stream.transform.projections][1:] == [
        "map('a', 1)::MAP<STRING, BIGINT> AS m", "CAST(array(1) AS ARRAY<STRUCT<a: INT, b: INT>>) AS s",
        "amount < 5 AS small", "1 >> 1 AS shifted"]


def test_a_lineage_column_may_be_selected_by_name() -> None:
    stream = load(transform={"sql": "SELECT event_id, event_time, _source_file FROM source"}, expectations={},
                  sink={"path": "bronze/events", "engine": "rs"})
    assert isinstance(stream.transform, SqlTransform)
    assert stream.transform.names == ["event_id", "event_time", "_source_file"]


def test_unknown_python_transform_points_at_sql() -> None:
    message = refused(transform="no_such_transform", expectations={})
    assert "unknown transform 'no_such_transform'" in message and "{sql: SELECT ...}" in message


def test_the_sql_spark_runs_keeps_the_users_text_and_carries_sluices_columns() -> None:
    stream = load(transform={"sql": "SELECT * EXCEPT (currency), concat('{', event_type, '}') AS tagged FROM source s"},
                  expectations={}, sink={"path": "bronze/events", "engine": "rs"})
    assert isinstance(stream.transform, SqlTransform)
    assert spark_select(stream.transform, ["_dead_letter_reason", "_source_file"]) == (
        "SELECT * EXCEPT (`_dead_letter_reason`, `_source_file`, `currency`), "
        "concat('{{', event_type, '}}') AS tagged, `_dead_letter_reason`, `_source_file` FROM {source} AS `s`")


def test_the_bundled_catalog_uses_expectations_and_a_sql_transform() -> None:
    from sluice.catalog import load_catalog

    catalog = load_catalog()
    assert any(stream.expectations for stream in catalog)
    assert any(isinstance(stream.transform, SqlTransform) for stream in catalog)


@pytest.mark.parametrize("message", [
    "[CAST_INVALID_INPUT] The value 'x' of the type \"STRING\" cannot be cast to \"INT\" because it is malformed.",
    "org.apache.spark.SparkArithmeticException: [DIVIDE_BY_ZERO] Division by zero. SQLSTATE: 22012",
    "[ARITHMETIC_OVERFLOW] long overflow.",
    "[INVALID_ARRAY_INDEX_IN_ELEMENT_AT] The index 5 is out of bounds.",
])
def test_an_ansi_error_of_a_value_is_permanent_and_says_what_to_do(message: str) -> None:
    from sluice_spark.runner import explained, is_permanent

    assert is_permanent(RuntimeError(message))
    assert explained(message).startswith(message) and "try_* functions" in explained(message)
    assert not is_permanent(RuntimeError("[STREAM_FAILED] Connection reset by peer"))
    assert explained("Connection reset by peer") == "Connection reset by peer"


def test_a_run_that_maps_case_is_known_from_its_sql_and_its_csv_headers() -> None:
    """Such a run gets Spark's case mappings loaded ahead, on the other core (sluice_spark.session)."""
    from sluice_spark.runner import maps_case

    plain = "SELECT *, to_date(event_time) AS event_date FROM source"
    assert maps_case(load())  # the transform lowers event_type
    assert not maps_case(load(transform={"sql": plain}))
    bounds = "SELECT *, upper_bound AS lower_bound, to_date(event_time) AS event_date FROM source"
    assert not maps_case(load(transform={"sql": bounds}, source={
        "type": "files", "format": "json", "path": "events", "schema": {**SCHEMA, "upper_bound": "int"}}))
    for check in ("UPPER(currency) IN ('EUR', 'USD')", "currency ILIKE 'e%'", "initcap (currency) <> 'X'",
                  "str_to_map(currency)['a'] IS NULL", "currency COLLATE UTF8_LCASE = 'eur'"):
        rules = {**RULES, "cased": {"check": check, "on_violation": "warn"}}
        assert maps_case(load(transform={"sql": plain}, expectations=rules)), check
    fan_out = [{"path": "silver/eur", "where": "lcase(currency) = 'eur'"}]
    assert maps_case(load(transform={"sql": plain}, fan_out=fan_out))

    def csv(**options: Any) -> Any:
        source = {"type": "files", "format": "csv", "path": "orders", "schema": {"order_id": "string not null"},
                  "options": options, "schema_evolution": "rescue"}
        stream = events_stream("orders", source=source, transform="identity", sink={"path": "bronze/orders"})
        return parse_catalog({"version": 1, "streams": [stream]}).get("orders")

    assert maps_case(csv(header="true"))  # each file's header is matched to the schema without case
    assert not maps_case(csv(header="true", enforceSchema="true"))
    assert not maps_case(csv())

    def python(transform: str) -> Any:
        stream = events_stream(transform=transform, sink={"path": "bronze/events"})
        return parse_catalog({"version": 1, "streams": [stream]}).get("events")

    assert maps_case(python("bronze_events"))  # it declares that it lowers event_type
    assert not maps_case(python("identity"))
