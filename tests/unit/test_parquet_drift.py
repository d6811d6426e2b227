"""Parquet drift on the executors (:mod:`sluice_spark.drift.parquet`), against pyarrow data made here: every value of
a file is either in a typed column, in ``_rescued_data``, or in the record of a dead letter. No Spark session: the
function is what ``mapInArrow`` runs; the end-to-end runs are in ``tests/spark/test_drift.py``."""

from __future__ import annotations

import io
import json
import math
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sluice.constants import CORRUPT_COLUMN, RESCUED_COLUMN, SchemaEvolution
from sluice_spark.drift.parquet import ParquetReadError, conform_files, output_columns
from sluice_spark.targets import NEW_COLUMNS_COLUMN, NEW_TYPES_COLUMN


def parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def conform(declared: pa.Schema, files: list[bytes], policy: SchemaEvolution = SchemaEvolution.RESCUE
            ) -> list[dict[str, Any]]:
    arrow = {"STRING": pa.string(), "ARRAY<STRING>": pa.list_(pa.string())}
    extra = [pa.field(name, arrow[kind]) for name, kind in output_columns(policy)]
    output = pa.schema([*declared, *extra])
    batch = pa.record_batch([pa.array([f"file:/landing/{i}.parquet" for i in range(len(files))]),
                             pa.array(files, pa.binary())], names=["_source_file", "content"])
    rows = [row for out in conform_files(iter([batch]), declared=declared, output=output, policy=policy)
            for row in out.to_pylist()]
    return rows


def rescued(row: dict[str, Any]) -> dict[str, Any]:
    return json.loads(row[RESCUED_COLUMN]) if row[RESCUED_COLUMN] else {}


def test_a_map_whose_value_type_grew_keeps_every_value() -> None:
    declared = pa.schema([("labels", pa.map_(pa.string(), pa.int64()))])
    file = pa.table({"labels": pa.array([[("a", 1), ("b", 2)], None, [("c", 3)]], pa.map_(pa.string(), pa.int32()))})
    grown_type = pa.map_(pa.string(), pa.struct([("n", pa.int64()), ("extra", pa.string())]))
    structs = pa.table({"labels": pa.array([[("a", {"n": 1, "extra": "x"})]], grown_type)})
    declared_structs = pa.schema([("labels", pa.map_(pa.string(), pa.struct([("n", pa.int64())])))])

    widened = conform(declared, [parquet_bytes(file)])
    grown = conform(declared_structs, [parquet_bytes(structs)])

    assert [row["labels"] for row in widened] == [[("a", 1), ("b", 2)], None, [("c", 3)]]
    assert grown[0]["labels"] == [("a", {"n": 1})] and rescued(grown[0]) == {"labels.a.extra": "x"}


def test_values_a_type_cannot_hold_as_they_are_are_misfits() -> None:
    declared = pa.schema([("flag", pa.bool_()), ("price", pa.decimal128(10, 2)), ("n", pa.int32()),
                          ("text", pa.string())])
    file = pa.table({"flag": pa.array([1, 5], pa.int64()), "price": [1.25, 1.237], "n": pa.array([7, 2**40]),
                     "text": pa.array([b"hello", b"\xff"], pa.binary())})

    rows = conform(declared, [parquet_bytes(file)])

    assert [(row["flag"], row["price"], row["n"], row["text"]) for row in rows] == [
        (True, Decimal("1.25"), 7, "hello"), (None, None, None, None)]
    assert rescued(rows[0]) == {}
    assert rescued(rows[1]) == {"flag": 5, "price": 1.237, "n": 2**40, "text": "/w=="}
    assert json.loads(rows[1][CORRUPT_COLUMN])["n"] == 2**40, "the record as it arrived, for the dead-letter split"


def test_a_new_column_of_nan_and_infinity_is_json_spark_can_read() -> None:
    declared = pa.schema([("id", pa.string())])
    file = pa.table({"id": ["a", "b"], "score": [math.nan, math.inf], "z": [3, 4]})

    rows = conform(declared, [parquet_bytes(file)], SchemaEvolution.ADD_NEW_COLUMNS)

    assert [json.loads(row[NEW_COLUMNS_COLUMN]) for row in rows] == [{"score": "NaN", "z": 3},
                                                                     {"score": "Infinity", "z": 4}]
    assert json.loads(rows[0][NEW_TYPES_COLUMN]) == {"score": "DOUBLE", "z": "BIGINT"}


def test_list_elements_are_named_by_their_position_in_their_own_row() -> None:
    element = pa.struct([("sha", pa.string()), ("verified", pa.bool_())])
    declared = pa.schema([("commits", pa.list_(pa.struct([("sha", pa.string())])))])
    file = pa.table({"commits": pa.array([[{"sha": "a", "verified": True}], None,
                                          [{"sha": "b"}, {"sha": "c", "verified": False}]], pa.list_(element))})

    rows = conform(declared, [parquet_bytes(file)])

    assert [row["commits"] for row in rows] == [[{"sha": "a"}], None, [{"sha": "b"}, {"sha": "c"}]]
    assert [rescued(row) for row in rows] == [{"commits[0].verified": True}, {}, {"commits[1].verified": False}]


def test_a_file_that_is_no_parquet_is_one_dead_letter_and_one_cut_short_stops_the_run() -> None:
    declared = pa.schema([("id", pa.string())])
    [dead] = conform(declared, [b"id,amount\np1,2\n"])
    assert dead["id"] is None and dead[CORRUPT_COLUMN].startswith("unreadable Parquet file: ")

    whole = parquet_bytes(pa.table({"id": ["a"]}))
    with pytest.raises(ParquetReadError, match="not a whole Parquet file"):
        conform(declared, [whole[: len(whole) // 2]])


# Text Arrow's number parsers take and text they refuse, side by side: signs, hex, blanks, exponents, NaN, infinity,
# digits of other scripts, separators, overflow.
_NUMBER_TEXTS = ["1", "-2", "+3", "0x1F", "0X1f", " 4", "4 ", "1e3", "1E-2", "nan", "NaN", "inf", "-Infinity", "1.5",
                 ".5", "5.", "abc", "", None, "\u0661\u0662", "\uff11\uff12", "1_000", "99999999999999999999", "-0",
                 "true", "12.345", "1,5", "u01234", "\t7", "0b101", "1d", "1f"]


@pytest.mark.parametrize("target", [pa.int8(), pa.int64(), pa.uint16(), pa.float32(), pa.float64(),
                                    pa.decimal128(12, 2), pa.decimal128(5, 0)], ids=str)
def test_text_set_aside_in_one_pass_is_what_the_cast_itself_refuses(target: pa.DataType) -> None:
    from sluice_spark.drift.parquet import _cast_or_bisect, _screened_cast

    texts = pa.array(_NUMBER_TEXTS * 2, pa.string())

    screened, screened_failed = _screened_cast(texts, target, True)
    halved, halved_failed = _cast_or_bisect(texts, target, True)

    assert screened_failed == halved_failed and screened_failed
    assert str(screened.to_pylist()) == str(halved.to_pylist())  # NaN is no NaN's equal


def test_a_rescued_misfit_carries_its_record_only_where_a_dead_letter_may_need_it() -> None:
    declared = pa.schema([("id", pa.string()), ("n", pa.int64())])
    output = pa.schema([*declared, *(pa.field(name, pa.string()) for name, _ in
                                     output_columns(SchemaEvolution.RESCUE))])
    file = parquet_bytes(pa.table({"id": ["a", None, "c"], "n": ["x", "y", "3"]}))
    batch = pa.record_batch([pa.array(["file:/landing/0.parquet"]), pa.array([file], pa.binary())],
                            names=["_source_file", "content"])

    rows = [row for out in conform_files(iter([batch]), declared=declared, output=output,
                                         policy=SchemaEvolution.RESCUE, required=frozenset({"id"}))
            for row in out.to_pylist()]
    every = conform(declared, [file])

    # A row whose required id is there is no dead letter: its misfit is in _rescued_data, its record is not kept.
    assert [rescued(row) for row in rows] == [{"n": "x"}, {"n": "y"}, {}] == [rescued(row) for row in every]
    assert [row[CORRUPT_COLUMN] for row in rows] == [None, '{"id": null, "n": "y"}', None]
    assert [row[CORRUPT_COLUMN] is not None for row in every] == [True, True, False]
