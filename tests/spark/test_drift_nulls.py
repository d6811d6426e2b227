"""JSON under a drift policy, on the records of a flat schema whose NULLs a count of keys could misjudge: a new key
whose value is NULL, a declared name inside a string column's value or in a key with an escaped quote, NULLs written
with other whitespace, a key spelt with escapes, a key given twice. Whatever lever a faster path takes (issue 41),
each must come out as when every record is parsed twice (the expectations are main's output)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql import functions as F

from sluice.constants import CORRUPT_COLUMN, RESCUED_COLUMN, SchemaEvolution
from sluice.model.schema import parse_schema
from sluice_spark.drift.fields import parse_json_text

pytestmark = pytest.mark.spark

SCHEMA = {"id": "string", "amount": "double", "page": "string", "n": "int", "tags": "array<string>"}
# (record, rejected, rescued)
CASES: list[tuple[str, bool, dict[str, Any] | None]] = [
    ('{"id": "a", "page": null, "amount": null}', False, None),
    ('{"id": "a", "page": null, "coupon": null}', False, {"coupon": None}),  # a new key whose value is NULL
    ('{"id": "a", "page": {"amount": null}, "coupon": null}', False, {"coupon": None}),  # a declared name, nested
    ('{"id": "a", "page": {"amount": null}}', False, None),
    ('{"id": "a", "page": null, "page": null}', True, None),  # a key given twice
    ('{"id": "a", "x\\"page": null}', False, {'`x"page`': None}),  # a declared name's end in a new key
    ('{"id": "a", "amount":  null, "c": null}', False, {"c": None}),  # other whitespace before a NULL
    ('{"id": "a", "amount":null,"Page":null}', False, {"Page": None}),  # another case
    ('{"id": "a", "n": null, "page": "\\": null"}', False, None),  # a NULL's key end inside a value
    ('{"id": "a", "amount": null, "more": [{"x": null}]}', False, {"more": [{"x": None}]}),
    ('{"id": "a", "tags": [{"page": null}], "coupon": null}', False, {"coupon": None}),
    ('{"id": "a", "tags": [{"page": null}]}', False, None),  # a string element's keys are no drift
    ('{"id": "a", "n": 1, "page": null, "amount": 2.5, "coupon": null}', False, {"coupon": None}),
    ('{"id": "a", "n": "x", "page": null}', False, {"n": "x"}),  # a misfit beside a NULL
    ('{"id": "\\u0061", "p\\u0061ge": null}', False, None),  # a declared key spelt with an escape
    ('{"id": "a", "pa\\u0067e": null, "page": null}', True, None),  # the same key twice, once with an escape
]


@pytest.mark.parametrize("policy", [SchemaEvolution.RESCUE, SchemaEvolution.FAIL_ON_NEW_COLUMNS])
def test_nulls_of_a_flat_schema_come_out_as_the_contract_says(spark: Any, policy: SchemaEvolution) -> None:
    frame = spark.createDataFrame([(index, text) for index, (text, _, _) in enumerate(CASES)], "n_ INT, value STRING")
    parsed = parse_json_text(frame, F.col("value"), parse_schema(SCHEMA, stream="s"), policy, {}, {"n_": F.col("n_")})
    got: dict[str, Any] = {}
    expected: dict[str, Any] = {}
    for row in parsed.collect():
        text, rejected, rescued = CASES[row["n_"]]
        if policy is SchemaEvolution.RESCUE:
            found = json.loads(row[RESCUED_COLUMN]) if row[RESCUED_COLUMN] is not None else None
            got[text] = (row[CORRUPT_COLUMN] is not None, found)
            expected[text] = (rejected or (rescued is not None and "n" in rescued), None if rejected else rescued)
        else:
            got[text] = set(row["_sluice_new_fields"] or ())
            expected[text] = set() if rejected else {key for key in rescued or {} if key != "n"}
    assert got == expected
