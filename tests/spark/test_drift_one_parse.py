"""JSON under a drift policy, on the records a cheaper drift check could misjudge: a NULL beside a new key,
whitespace before a colon, a key end inside a value, nested and map keys, and what Spark's parser reads but the
VARIANT's refuses. Each must come out as the rescue contract says, whatever lever a faster path takes (issue 41)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql import functions as F

from sluice.constants import CORRUPT_COLUMN, RESCUED_COLUMN, SchemaEvolution
from sluice.model.schema import parse_schema
from sluice_spark.drift.fields import parse_json_text

pytestmark = pytest.mark.spark

SCHEMA = {"id": "string", "amount": "double", "actor": "struct<id: bigint>", "items": "array<struct<sku: string>>",
          "tags": "map<string, struct<n: int>>"}
# (record, rejected, rescued)
CASES: list[tuple[str, bool, dict[str, Any] | None]] = [
    ('{"id": "a", "amount": 1.5, "actor": {"id": 1}, "items": [{"sku": "s"}]}', False, None),
    ('{"id": "a", "amount": null, "coupon": 1}', False, {"coupon": 1}),  # a NULL hides a new key from the count
    ('{"id" : "a", "coupon": 1}', False, {"coupon": 1}),  # whitespace before a colon
    ('{"id": "a", "actor": {"id": 1, "admin": true}}', False, {"actor.admin": True}),
    ('{"id": "a", "items": [{"sku": "s"}, {"sku": "t", "n": 2}]}', False, {"items[1].n": 2}),
    ('{"id": "a", "tags": {"x": {"n": 1, "m": 2}}}', False, {"tags.x.m": 2}),
    ('{"id": "a\\":", "x": 1}', False, {"x": 1}),  # a key end inside a value
    ('{"id": "a", "amount": NaN}', True, None),  # Spark's parser reads NaN, the VARIANT's does not
    ("{'id': 'a'}", True, None),  # single quotes, likewise
    ('[{"id": "a"}]', True, None),  # a top-level array of one object
    ('{"id": "a", "id": "b"}', True, None),  # a key given twice
    ('{"id": "a", "amount": "n/a"}', False, {"amount": "n/a"}),  # a misfit
]


@pytest.mark.parametrize("policy", [SchemaEvolution.RESCUE, SchemaEvolution.FAIL_ON_NEW_COLUMNS])
def test_records_a_cheaper_drift_check_could_misjudge_come_out_as_the_contract_says(
        spark: Any, policy: SchemaEvolution) -> None:
    frame = spark.createDataFrame([(index, text) for index, (text, _, _) in enumerate(CASES)], "n INT, value STRING")
    parsed = parse_json_text(frame, F.col("value"), parse_schema(SCHEMA, stream="s"), policy, {}, {"n": F.col("n")})
    rows = {row["n"]: row.asDict() for row in parsed.collect()}
    for index, (text, rejected, rescued) in enumerate(CASES):
        row = rows[index]
        if policy is SchemaEvolution.RESCUE:
            misfit = rescued is not None and "amount" in rescued
            assert (row[CORRUPT_COLUMN] is not None) == (rejected or misfit), text
            found = json.loads(row[RESCUED_COLUMN]) if row[RESCUED_COLUMN] is not None else None
            assert found == (None if rejected else rescued), text
        else:
            new = {key for key in rescued or {} if key != "amount"}
            assert set(row["_sluice_new_fields"] or ()) == (set() if rejected else new), text
