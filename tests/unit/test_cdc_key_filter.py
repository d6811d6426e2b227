"""The filter a type 2 cdc batch on the rs engine reads its table with: the touched keys' values, each column IN
its own, quoted as DataFusion reads them; the whole table when the keys cannot be written so, or are too many."""

from __future__ import annotations

from pyspark.sql.types import DateType, LongType, StringType

from sluice_spark.write.cdc import _KEY_FILTER_MAX, key_filter


def test_each_key_column_takes_the_values_of_the_touched_keys() -> None:
    touched = [(3, "it's"), (1, "b"), (3, "b")]
    assert key_filter(touched, ["id", 're"gion'], [LongType(), StringType()]) == (
        '"id" IN (1, 3) AND "re""gion" IN (\'b\', \'it\'\'s\')')


def test_the_whole_table_is_read_when_the_keys_cannot_be_listed() -> None:
    assert key_filter([], ["id"], [LongType()]) is None
    assert key_filter([(1,)] * (_KEY_FILTER_MAX + 1), ["id"], [LongType()]) is None
    assert key_filter([("2026-11-27",)], ["day"], [DateType()]) is None
