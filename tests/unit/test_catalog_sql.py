"""Catalog SQL is checked by one allowlist wherever it reaches Spark (issue 40): transforms, expectations, fan-out
conditions and aggregate measures refuse script transforms, reflection, subqueries, table functions, variables,
hints and what reads outside the row, naming the field and the construct; and any input, however long or deeply
nested, is refused with exit 2 and one line by ``python -m sluice.catalog validate``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.catalog.__main__ import main as validate_main
from sluice.limits import SQL_MAX_CHARS, SQL_MAX_DEPTH, TYPE_MAX_DEPTH
from sluice.model.sql import Shape, SqlError, parse_sql
from sluice.model.sql_functions import AGGREGATE_FUNCTIONS, ROW_FUNCTIONS
from tests.helpers import events_stream
from tests.unit.test_patterns import TUMBLING, WATERMARK, silver
from tests.unit.test_rules import load, refused

GETENV = "java_method('java.lang.System', 'getenv', 'AWS_SECRET_ACCESS_KEY')"

# A row expression, as each place holds it: (the catalog overrides, the field a refusal names).
PLACES = {
    "transform": (lambda text: {"transform": {"sql": f"SELECT *, {text} AS probe FROM source"}, "expectations": {}},
                  "transform.sql: the transform"),
    "expectation": (lambda text: {"expectations": {"probe": {"check": text}}}, "expectations.probe.check:"),
    "fan_out": (lambda text: {"expectations": {}, "fan_out": [{"path": "x/a", "where": "true"},
                                                               {"path": "x/b", "where": text}]},
                "fan_out[1].where: the condition"),
}

# Row expressions every place refuses, each with what the refusal says.
HOSTILE_EXPRESSIONS = [
    (f"{GETENV} IS NULL", "calls java_method(), which runs JVM code"),
    ("reflect('java.lang.System', 'getenv', 'HOME') IS NULL", "calls reflect(), which runs JVM code"),
    ("try_reflect('java.lang.System', 'getenv', 'HOME') IS NULL", "calls try_reflect(), which runs JVM code"),
    ("`java_method`('java.lang.System', 'getenv', 'HOME') IS NULL", "calls java_method()"),
    ("system.builtin.reflect('java.lang.System', 'getenv', 'HOME') IS NULL", "calls reflect()"),
    ("default.upper(currency) = 'X'", "calls the qualified function upper()"),
    (f"raise_error(concat('x', {GETENV})) IS NULL", "calls raise_error()"),
    ("assert_true(amount > 0) IS NULL", "calls assert_true()"),
    ("amount IN (SELECT amount FROM source)", "has a subquery"),
    ("amount > (SELECT max(amount) FROM source)", "has a subquery"),
    ("EXISTS (SELECT 1)", "has a subquery"),
    ("(SELECT TRANSFORM(currency) USING 'env' AS k FROM source) IS NULL", "has a subquery"),
    ("'${env:AWS_SECRET_ACCESS_KEY}' IS NULL", "Spark substitutes ${...}"),
    ("${spark.hadoop.fs.s3a.secret.key} IS NULL", "Spark substitutes ${...}"),
    ("currency = :currency", "has the parameter ':currency'"),
    ("currency = ?", "has the parameter '?'"),
    ("count(*) > 0", "uses the aggregate 'COUNT(*)'"),
    ("sum(amount) OVER () > 0", "window function"),
    ("explode(array(1)) = 1", "uses the generator"),
    ("range(3) IS NULL", "calls range()"),
    ("current_user() = 'x'", "calls current_user()"),
    ("current_user = 'x'", "calls current_user()"),
    ("session_user() = 'x'", "calls session_user()"),
    ("input_file_name() = 'x'", "calls input_file_name()"),
    ("version() = 'x'", "calls version()"),
    ("uuid() = 'x'", "calls uuid()"),
    ("rand() > 0.5", "calls rand()"),
    ("xpath_boolean('<a/>', 'a')", "calls xpath_boolean()"),
    ("from_protobuf(currency, 'M', '/etc/passwd') IS NULL", "calls from_protobuf()"),
    ("aes_decrypt(unhex(currency), 'k') IS NULL", "calls aes_decrypt()"),
    ("/*+ REPARTITION(1) */ amount > 0", "has HINT"),
    ("(" * (SQL_MAX_DEPTH + 1) + "amount > 0" + ")" * (SQL_MAX_DEPTH + 1), "nests more than"),
    ("(" * 5000 + "amount > 0" + ")" * 5000, "nests more than"),
    ("abs(" * 300 + "amount" + ")" * 300 + " > 0", "nests more than"),
    ("CASE " * 100 + "WHEN amount > 0 THEN true END" * 100, "nests more than"),
    ("exists(array(amount), x -> " * 50 + "true" + ")" * 50, "nests more than"),
    ("NOT " * 3000 + "amount > 0", "nests too deeply"),
    ("- " * 3000 + "amount > 0", "nests too deeply"),
    ("INTERVAL " * 500 + "1 DAY IS NULL", "nests too deeply"),
    ("CAST(amount AS " + "array<" * 300 + "int" + ">" * 300 + ") IS NULL", "nests too deeply"),
    (" AND ".join(["amount > 0"] * 500), "operations deep"),
    ("struct(amount)." + "x." * 3000 + "y IS NULL", "operations deep"),
    ("amount > 0 AND " * (SQL_MAX_CHARS // 10) + "true", f"at most {SQL_MAX_CHARS:,}"),
    ("map(1) IS NULL", "is not valid Spark SQL"),
    ("'unterminated", "is not valid Spark SQL"),
]


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize(("text", "expected"), HOSTILE_EXPRESSIONS, ids=[text[:40] for text, _ in HOSTILE_EXPRESSIONS])
def test_every_place_refuses_what_reaches_outside_the_row(place: str, text: str, expected: str) -> None:
    overrides, field = PLACES[place]
    message = refused(**overrides(text))
    assert message.startswith(f"stream 'events': {field}"), message
    assert expected in message
    assert "\n" not in message


@pytest.mark.parametrize("text", [
    "SELECT TRANSFORM(event_id) USING 'cat' AS k FROM source",
    "SELECT TRANSFORM(*) USING '/bin/sh -c env' AS (k, v) FROM source",
    "SELECT TRANSFORM(event_id) ROW FORMAT DELIMITED USING 'python3 -c \"import os\"' AS k FROM source",
])
def test_a_script_transform_is_refused(text: str) -> None:
    message = refused(transform={"sql": text}, expectations={})
    assert message.startswith("stream 'events': transform.sql: the transform has a script transform")


@pytest.mark.parametrize(("text", "expected"), [
    ("SELECT * FROM range(10)", "must read FROM source"),
    ("SELECT * FROM source, range(10)", "JOIN"),
    ("SELECT * FROM source WHERE java_method('a', 'b') IS NULL", "has WHERE"),
    ("SET VAR x = 1", "must be SELECT"),
    ("DECLARE x INT", "must be SELECT"),
    ("SELECT * FROM source LATERAL VIEW explode(array(1)) t AS e", "LATERAL"),
    ("SELECT * FROM (SELECT * FROM source)", "must read FROM source"),
    ("WITH s AS (SELECT * FROM source) SELECT * FROM s", "has WITH"),
    ("SELECT * FROM source VERSION AS OF 1", "must read FROM source"),
])
def test_a_transform_reads_only_its_own_rows(text: str, expected: str) -> None:
    message = refused(transform={"sql": text}, expectations={})
    assert message.startswith("stream 'events': transform.sql: the transform"), message
    assert expected in message


@pytest.mark.parametrize(("measure", "expected"), [
    (f"sum({GETENV})", "calls java_method()"),
    ("count(reflect('java.lang.System', 'exit', '1'))", "calls reflect()"),
    ("max((SELECT 1))", "has a subquery"),
    ("sum(amount) OVER ()", "window function"),
    ("collect_list(amount)", "a measure is function(column)"),
    ("sum(sum(amount))", "a measure is function(column)"),
    ("'${env:HOME}'", "Spark substitutes"),
])
def test_a_measure_is_one_allowed_aggregate(measure: str, expected: str) -> None:
    from tests.unit.test_catalog import catalog_with, rejects
    stream = silver(watermark=WATERMARK, aggregate={**TUMBLING, "measures": {"x": measure}}, sink={"mode": "append"})
    message = rejects(catalog_with(stream), "stream 'silver': aggregate.measures.x: the measure")
    assert expected in message


@pytest.mark.parametrize("name", sorted(ROW_FUNCTIONS))
def test_every_allowed_function_passes_the_gate(name: str) -> None:
    # The arguments do not matter to the gate (Spark checks them when the run starts): the first form sqlglot reads.
    errors = []
    for arguments in ["a", "a, b", "a, b, c", "", "a, x -> x", "DAY FROM a", "a AS INT", "a IN b", "BOTH FROM a"]:
        try:
            parse_sql(f"{name}({arguments})", what="probe", shape=Shape.ROW)
            return
        except SqlError as exc:
            errors.append(str(exc))
    refusals = [error for error in errors if "not valid Spark SQL" not in error]
    assert not refusals and errors, refusals


@pytest.mark.parametrize("name", sorted(AGGREGATE_FUNCTIONS))
def test_the_measure_functions_pass_only_as_measures(name: str) -> None:
    parse_sql(f"{name}(a)", what="probe", shape=Shape.GROUP)
    with pytest.raises(SqlError, match="uses the aggregate"):
        parse_sql(f"{name}(a)", what="probe", shape=Shape.ROW)


def test_row_sql_a_catalog_writes_still_loads() -> None:
    text = ("SELECT * EXCEPT (currency), upper(currency) AS currency, date_format(event_time, 'yyyy-MM') AS month, "
            "CASE WHEN amount > 100 THEN 'big' ELSE 'small' END AS size, amount::DECIMAL(12, 2) AS exact, "
            "transform(array(amount), x -> x * 2) AS doubled, coalesce(user_id, 'none') AS who, "
            "sha2(event_id, 256) AS digest, to_json(named_struct('a', amount)) AS doc, "
            "r'/*+ not a hint */' AS quoted, year(event_time) AS y, position('a' IN event_type) AS at, "
            "to_date(event_time) AS event_date FROM source")
    stream = load(transform={"sql": text}, expectations={"probe": {"check": "size IN ('big', 'small') AND y > 0"}},
                  fan_out=[{"path": "x/big", "where": "size = 'big' OR doubled[0] > 200"}])
    assert "doubled" in stream.output_columns


# -- any input: exit 2, one line, bounded ----------------------------------------------------------------------------

def deep_struct(levels: int) -> str:
    return "struct<a: " * levels + "int" + ">" * levels


HOSTILE_CATALOGS: list[tuple[str, dict[str, Any] | str, str]] = [
    ("deep type", events_stream(source={"type": "files", "format": "json", "path": "events",
                                        "schema": {"a": deep_struct(5000)}}), "types nest more than"),
    ("type at the bound", events_stream(source={"type": "files", "format": "json", "path": "events",
                                                "schema": {"a": deep_struct(TYPE_MAX_DEPTH + 1)}}),
     "types nest more than"),
    ("deep array type", events_stream(source={"type": "files", "format": "json", "path": "events",
                                              "schema": {"a": "array<" * 3000 + "int" + ">" * 3000}}),
     "types nest more than"),
    ("long type", events_stream(source={"type": "files", "format": "json", "path": "events",
                                        "schema": {"a": "struct<" + ", ".join(f"f{i}: int" for i in range(20000))
                                                   + ">"}}), "characters; at most"),
    ("deep check", events_stream(expectations={"deep": {"check": "(" * 20000 + "true" + ")" * 20000}}),
     "expectations.deep.check"),
    ("deep transform", events_stream(transform={"sql": "SELECT " + "abs(" * 3000 + "1" + ")" * 3000 + " AS a FROM "
                                                "source"}), "transform.sql"),
    ("deep fan-out", events_stream(fan_out=[{"path": "x", "where": "NOT " * 5000 + "true"}]), "fan_out[0].where"),
    ("script transform", events_stream(transform={"sql": "SELECT TRANSFORM(event_id) USING 'env' AS k FROM source"}),
     "script transform"),
    ("getenv in a fan-out", events_stream(fan_out=[{"path": "x", "where": f"raise_error({GETENV}) IS NULL"}]),
     "fan_out[0].where"),
    ("deep YAML", "version: 1\nstreams: " + "[" * 5000 + "]" * 5000 + "\n", "nests"),
    ("wide YAML", "version: 1\nx: [" + "a," * 400_000 + "a]\n", "YAML values"),
    ("broken YAML", "version: 1\nstreams: [a\n", "is not valid YAML"),
    ("SQL sqlglot reads as a command", events_stream(expectations={"odd": {"check": "if upper + 1"}}),
     "expectations.odd.check"),
]


def write(tmp_path: Path, catalog: dict[str, Any] | str) -> Path:
    path = tmp_path / "catalog.yaml"
    text = catalog if isinstance(catalog, str) else yaml.safe_dump({"version": 1, "streams": [catalog]}, width=10**9)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("case", "catalog", "expected"), HOSTILE_CATALOGS, ids=[case for case, *_ in HOSTILE_CATALOGS])
def test_validate_refuses_any_input_with_exit_2_and_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             case: str, catalog: dict[str, Any] | str,
                                                             expected: str) -> None:
    assert validate_main(["validate", str(write(tmp_path, catalog))]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1, error[:2000]
    assert expected in error


@pytest.mark.parametrize(("catalog", "expected"), [
    (events_stream(expectations={"deep": {"check": "NOT " * 5000 + "true"}},
                   source={"type": "files", "format": "json", "path": "events", "schema": {"a": deep_struct(5000)}}),
     "error: stream 'events': source.schema.a: types nest more than"),
    # sqlglot warns on stderr before it reads this as a command, which the check then refuses.
    (events_stream(expectations={"odd": {"check": "if upper + 1"}}), "error: stream 'events': expectations.odd.check"),
], ids=["deep nesting", "a command to sqlglot"])
def test_the_validate_command_prints_one_line_and_exits_2(tmp_path: Path, catalog: dict[str, Any],
                                                          expected: str) -> None:
    done = subprocess.run([sys.executable, "-m", "sluice.catalog", "validate", str(write(tmp_path, catalog))],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith(expected) and done.stderr.count("\n") == 1, done.stderr[-2000:]
