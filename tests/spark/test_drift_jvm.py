"""Sluice's JVM drift check (``include/jvm/drift``, ``python -m sluice jvm-classes``) against the column expressions it
stands in for (issue 41): over a varied corpus of JSON records, every drift policy's columns come out the same either
way, and the check itself passes the clean records and catches every record that holds something to find."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql import functions as F

from sluice.constants import RESCUED_COLUMN, SchemaEvolution
from sluice.model.schema import parse_schema
from sluice_spark.drift import fields
from sluice_spark.drift.fields import JVM_DRIFT_ENV, parse_json_text
from sluice_spark.targets import NEW_COLUMNS_COLUMN, NEW_FIELDS_COLUMN
from tests.spark.test_drift import BROKEN, DRIFTED, FIRST
from tests.spark.test_drift import SCHEMA as DRIFT_SCHEMA
from tests.spark.test_drift_one_parse import CASES

pytestmark = pytest.mark.spark

SCHEMA = {**DRIFT_SCHEMA, "items": "array<struct<sku: string, quantity: int>>", "tags": "map<string, struct<n: int>>",
          "note": "string"}
FLAT = {"id": "string", "amount": "double", "note": "string"}
# Records the check must pass: nothing beyond the declared keys, each given once, in one object both parsers read.
CLEAN = [
    *(json.dumps(item, ensure_ascii=False) for item in FIRST),
    '{"id": "a", "amount": null, "actor": null, "payload": {"size": null, "commits": [], "labels": {}}}',
    '{"id": "ü✓", "note": {"any": [1, {"deep": "x"}], "other": null}, "tags": {"k": {"n": 1}, "l": null}}',
    '{"id": "a", "\\u0061mount": 1.5, "actor": {"i\\u0064": 1}}',  # escaped declared keys
    '{"id": "a", "amount": "n/a", "items": [{"sku": "s", "quantity": "two"}]}',  # misfits: Spark's parser flags them
    '{"id":"a","items":[{"sku":"s"},{"quantity":2}],"payload":{"commits":[{"sha":"x","message":"\\"k\\":"}]}}',
]
MAP_KEY_TWICE = '{"id": "a", "payload": {"labels": {"bug": 1, "bug": 2}}}'
# Records the check must catch: a new key at any depth, a key given twice at any depth, or text that is no object.
DRIFTING = [
    '{"id": "a", "coupon": "X1"}',
    '{"id": "a", "Amount": 2}',  # names match exactly, as Spark's parser matches them
    '{"id": "a", "items": [{"sku": "s"}, {"sku": "t", "quantity": 1, "gift": {"wrap": true}}]}',
    '{"id": "a", "payload": {"commits": [{"sha": "x"}, {"sha": "y", "deep": {"k": [1, {"z": 2}]}}]}}',
    '{"id": "a", "tags": {"k": {"n": 1, "extra": true}}}',  # a new key in a map's struct value
    '{"id": "a", "am\\"ount": 1}',  # an escaped quote in a new key
    '{"id": "a", "actor": {"id": 1, "lögin": "x"}}',  # unicode in a new key
    '{"id": "a", "🙂": 1}',
    '{"id": "a", "id": "b"}',
    '{"id": "a", "actor": {"id": 1, "id": 2}}',
    '{"id": "a", "note": {"x": 1, "x": 2}}',  # a key twice in a value the schema takes as text
    MAP_KEY_TWICE,
    '{"id": "a", "amount": NaN}',
    "{'id': 'a'}",
    '[{"id": "a"}]',
    ' {"id": "a"}',
    '{"id": "a"} ',
    '{"id": "a"} {"coupon": 1}',
    '{"id": "a", "items": [{"sku": "s"}',
    '{"id": "a", "items": [}',
    '/* c */{"id": "a"}',
    "",
    "null",
    '"text"',
]
# More that are neither: misfits of every kind, NULLs, shapes that are not the declared ones, big numbers.
OTHERS = [
    '{"id": "a", "actor": 5, "payload": [1, 2], "items": {"sku": "s"}}',
    '{"id": "a", "actor": {"id": 99999999999999999999999}, "amount": 1e400}',
    '{"id": "a", "payload": {"labels": {"x": null, "y": {"z": 1}}}, "created_at": "yesterday"}',
    '{"id": "a", "tags": {"k": [1], "l": {"n": "one"}}, "items": [null, 3, {"quantity": 1.5}]}',
    '{"id": null}',
    "{}",
]
CORPUS = [*CLEAN, *DRIFTING, *OTHERS, *(json.dumps(item, ensure_ascii=False) for item in DRIFTED), *BROKEN,
          *(text for text, _, _ in CASES)]


def parsed_rows(spark: Any, monkeypatch: pytest.MonkeyPatch, schema: dict[str, str], policy: SchemaEvolution,
                jvm: bool) -> tuple[list[dict[str, Any]], str]:
    """Every record of the corpus through :func:`parse_json_text`, with the JVM check or without it: the rows in
    order, and the plan."""
    monkeypatch.setenv(JVM_DRIFT_ENV, "1" if jvm else "0")
    frame = spark.createDataFrame(list(enumerate(CORPUS)), "n INT, value STRING")
    parsed = parse_json_text(frame, F.col("value"), parse_schema(schema, stream="s"), policy, {}, {"n": F.col("n")})
    rows = sorted((row.asDict(recursive=True) for row in parsed.collect()), key=lambda row: row["n"])
    return rows, parsed._jdf.queryExecution().optimizedPlan().toString()


@pytest.mark.parametrize("schema", [SCHEMA, FLAT], ids=["nested", "flat"])
@pytest.mark.parametrize("policy", [SchemaEvolution.RESCUE, SchemaEvolution.FAIL_ON_NEW_COLUMNS,
                                    SchemaEvolution.ADD_NEW_COLUMNS])
def test_the_jvm_check_gives_the_same_columns_as_the_column_expressions(
        spark: Any, monkeypatch: pytest.MonkeyPatch, schema: dict[str, str], policy: SchemaEvolution) -> None:
    with_jvm, jvm_plan = parsed_rows(spark, monkeypatch, schema, policy, jvm=True)
    without, plan = parsed_rows(spark, monkeypatch, schema, policy, jvm=False)
    assert fields._MAY_DRIFT in jvm_plan, "the JVM check is not in the plan: is sluice-drift.jar on the classpath " \
                                          "(python -m sluice jvm-classes)?"
    assert fields._MAY_DRIFT not in plan
    differ = {CORPUS[row["n"]]: (jvm_row, row) for jvm_row, row in zip(with_jvm, without, strict=True)
              if repr(jvm_row) != repr(row)}  # repr: NaN is no NaN's equal
    # The one difference, on purpose: a key given twice in an object read as a map is a dead letter, as every other
    # key given twice; the key count of the column expressions misses it (the typed map holds both entries).
    twice = differ.pop(MAP_KEY_TWICE, None)
    assert differ == {}
    if schema is SCHEMA:
        assert twice is not None
        assert (twice[0]["_corrupt_record"], twice[1]["_corrupt_record"]) == (MAP_KEY_TWICE, None)
    found = [row for row in without if any(row.get(name) for name in (RESCUED_COLUMN, NEW_FIELDS_COLUMN,
                                                                       NEW_COLUMNS_COLUMN))]
    assert len(found) >= 15, "the corpus holds drift to find"


def test_the_check_passes_clean_records_and_catches_every_drifting_one(spark: Any) -> None:
    assert fields._jvm_may_drift(spark), "sluice-drift.jar is not on the classpath (python -m sluice jvm-classes)"
    ddl = parse_schema(SCHEMA, stream="s").ddl(nullable_only=True)
    frame = spark.createDataFrame([(text,) for text in CLEAN + DRIFTING], "value STRING")
    found = [row[0] for row in frame.select(F.call_function(fields._MAY_DRIFT, "value", F.lit(ddl))).collect()]
    assert [text for text, drifts in zip(CLEAN, found, strict=False) if drifts] == []
    assert [text for text, drifts in zip(DRIFTING, found[len(CLEAN):], strict=True) if not drifts] == []


# Keys and values whose bytes in ``_rescued_data`` are the VARIANT's and Jackson's to write: escapes, unicode, number
# forms, several new keys (the VARIANT's order), keys that need backticks, misfits at every depth.
BYTES = [
    '{"id": "a", "zeta": 1, "Alpha": 2, "beta\\u0000": "\\t\\"q\\"", "\\u00e9": [1.50, 1e3, -0.0, 123456789012345678]}',
    '{"id": "a", "a.b": {"c`d": null}, " ": true, "items": [{"sku": "s", "x y": 1.0E-7}, 7, {"quantity": "2"}]}',
    '{"id": "a", "tags": {"k.1": {"n": 1, "m": {"deep": [1, 2]}}, "`": {"n": "x"}}, "amount": "1,5", "x": {}}',
    '{"id": "a", "payload": {"labels": {"z": 1, "a": [true]}, "commits": [{"sha": 1, "new": "\\ud83d\\ude42"}]}}',
    '{"id": "a", "actor": {"id": 1.25, "login": {"nested": "obj"}, "x": []}, "created_at": 5}',
]


def test_rescue_is_one_java_call_per_flagged_record(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``rescue`` with the JVM classes, ``_rescued_data`` comes from Sluice's JVM rescue (no VARIANT and no
    higher-order function in the plan) and is the same, byte for byte, as the column expressions' walk."""
    def rows(jvm: bool) -> tuple[list[tuple[Any, ...]], str]:
        monkeypatch.setenv(JVM_DRIFT_ENV, "1" if jvm else "0")
        frame = spark.createDataFrame(list(enumerate([*BYTES, *CORPUS])), "n INT, value STRING")
        parsed = parse_json_text(frame, F.col("value"), parse_schema(SCHEMA, stream="s"), SchemaEvolution.RESCUE, {},
                                 {"n": F.col("n")})
        found = sorted(tuple(row) for row in parsed.select("n", RESCUED_COLUMN, "_corrupt_record").collect())
        return found, parsed._jdf.queryExecution().executedPlan().toString()

    with_jvm, jvm_plan = rows(True)
    without, _ = rows(False)
    assert fields._RESCUE in jvm_plan and "parseJson" not in jvm_plan and "lambda" not in jvm_plan
    twice = CORPUS.index(MAP_KEY_TWICE) + len(BYTES)
    assert [row for row in with_jvm if row[0] != twice] == [row for row in without if row[0] != twice]
    assert all(row[1] for row in with_jvm[:len(BYTES)]), "every record of BYTES rescues something"
