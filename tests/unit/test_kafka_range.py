"""Planning a range backfill of a Kafka source without a broker: the offsets param's shape, the checks against a
partition's watermarks and the live stream's checkpoint, a time range's offsets, what an append leaves out, and the
replace predicate as delta-rs evaluates it. Every refusal names its param."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from sluice.catalog import parse_catalog
from sluice.errors import BackfillError
from sluice.model.predicates import DATAFUSION, SPARK_SQL, RowFilter, render
from sluice.operations.backfill import count_rows, parse_request
from sluice.operations.kafka_range import (
    PartitionRange,
    check_offsets,
    less_held,
    lineage_offsets,
    parse_offsets,
    time_ranges,
)
from tests.kafka_data import kafka_stream

T = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.timezone.utc)
MARKS = {("clicks", 0): (5, 40), ("clicks", 1): (0, 30)}
COMMITTED = {"clicks": {"0": 40, "1": 25}}


def refused(field: str, fragment: str, call: Any, *args: Any, **kwargs: Any) -> None:
    with pytest.raises(BackfillError) as caught:
        call(*args, **kwargs)
    assert caught.value.field == field and fragment in str(caught.value), str(caught.value)


def test_the_request_takes_offsets_or_a_time_range_and_refuses_by_name() -> None:
    catalog = parse_catalog({"version": 1, "streams": [kafka_stream()]})
    request = parse_request({"stream": "clicks", "offsets": '{"0": [10, 20], "1": [0, 4]}', "mode": "replace"},
                            catalog, run_id="r")
    assert request.offsets == {"clicks": {"0": [10, 20], "1": [0, 4]}} and request.select_by == "offset"
    assert '--offsets={"clicks": {"0": [10, 20], "1": [0, 4]}}' in request.to_args()
    assert request.range_text.startswith("offsets ")
    by_time = parse_request({"stream": "clicks", "start": "2026-11-22T12:00:00Z", "end": "2026-11-22T13:00:00Z"},
                            catalog, run_id="r")
    assert by_time.select_by == "timestamp" and by_time.offsets is None and by_time.start == T
    cases = {
        "offsets": {},
        "start": {"offsets": {"0": [1, 2]}, "start": "2026-11-22T12:00:00Z", "end": "2026-11-22T13:00:00Z"},
        "end": {"start": "2026-11-22T13:00:00Z", "end": "2026-11-22T12:00:00Z"},
        "start_version": {"start_version": 3},
        "select_by": {"select_by": "version", "offsets": {"0": [1, 2]}},
        "max_files_per_trigger": {"offsets": {"0": [1, 2]}, "max_files_per_trigger": 3},
        "mode": {"offsets": {"0": [1, 2]}, "mode": "upsert"},
    }
    for field, params in cases.items():
        refused(field, "", parse_request, {"stream": "clicks", **params}, catalog, run_id="r")


def test_the_offsets_shape_is_refused_by_name() -> None:
    assert parse_offsets({"clicks": {"1": [0, 0]}}, ["clicks"], None) == {"clicks": {"1": [0, 0]}}
    assert parse_offsets('{"t-7": {"0": [1, 2]}}', [], "t-.*") == {"t-7": {"0": [1, 2]}}
    refused("offsets", "not valid JSON", parse_offsets, "{0: [1]}", ["clicks"], None)
    refused("offsets", "expected JSON such as", parse_offsets, [], ["clicks"], None)
    refused("offsets", "name the topic", parse_offsets, {"0": [1, 2]}, ["a", "b"], None)
    refused("offsets", "does not read topic 'other'", parse_offsets, {"other": {"0": [1, 2]}}, ["clicks"], None)
    refused("offsets", "expected a partition number", parse_offsets, {"x": [1, 2]}, ["clicks"], None)
    refused("offsets", "expected [first, last]", parse_offsets, {"0": [1]}, ["clicks"], None)
    refused("offsets", "expected [first, last]", parse_offsets, {"0": [-1, 3]}, ["clicks"], None)
    refused("offsets", "first offset 9 is after the last, 3", parse_offsets, {"0": [9, 3]}, ["clicks"], None)


def test_offsets_are_checked_against_retention_the_latest_and_the_live_stream() -> None:
    ranges = check_offsets({"clicks": {"0": [5, 39], "1": [0, 24]}}, MARKS, COMMITTED)
    assert [(p.partition, p.first, p.last, p.offsets) for p in ranges] == [(0, 5, 39, 35), (1, 0, 24, 25)]
    refused("offsets", "offset 4 was deleted by retention; the earliest the topic holds is 5", check_offsets,
            {"clicks": {"0": [4, 10]}}, MARKS, COMMITTED)
    refused("offsets", "offset 40 is past the latest, 39", check_offsets, {"clicks": {"0": [5, 40]}}, MARKS,
            COMMITTED)
    refused("offsets", "has no partition 2; it has 0, 1", check_offsets, {"clicks": {"2": [0, 1]}}, MARKS,
            COMMITTED)
    refused("offsets", "the live stream has read up to offset 24", check_offsets, {"clicks": {"1": [0, 25]}}, MARKS,
            COMMITTED)
    refused("offsets", "read up to offset -1", check_offsets, {"clicks": {"1": [0, 0]}}, MARKS, None)


def test_a_time_range_keeps_to_what_the_live_stream_read_and_refuses_an_empty_one() -> None:
    end = T + dt.timedelta(hours=1)
    starts = {("clicks", 0): 12, ("clicks", 1): -1}
    ends = {("clicks", 0): 20, ("clicks", 1): -1}
    ranges, notes = time_ranges(starts, ends, MARKS, COMMITTED, start=T, end=end)
    assert ranges == [PartitionRange("clicks", 0, 12, 19)] and notes == []
    ranges, notes = time_ranges({("clicks", 0): 30, ("clicks", 1): 20}, {}, MARKS, COMMITTED, start=T, end=end)
    assert ranges == [PartitionRange("clicks", 0, 30, 39), PartitionRange("clicks", 1, 20, 24)]
    assert notes == ["clicks:1: offsets 25 to 29 are not read by the live stream yet; its next run ingests them, so "
                     "the backfill leaves them alone"]
    refused("start", "deleted by retention", time_ranges, {("clicks", 0): 5}, {}, MARKS, COMMITTED, start=T, end=end)
    refused("start", "nothing to backfill", time_ranges, {}, {}, MARKS, COMMITTED, start=T, end=end)


def test_an_append_reads_only_the_offsets_no_table_holds() -> None:
    held = lineage_offsets(["kafka://clicks/0/3", "kafka://clicks/0/4", "kafka://clicks/0/7", "kafka://other/0/5",
                            "file:///not/kafka"])
    assert held == {("clicks", 0): {3, 4, 7}, ("other", 0): {5}}
    left = less_held([PartitionRange("clicks", 0, 2, 9), PartitionRange("clicks", 1, 0, 1)], held)
    assert [(p.partition, p.first, p.last) for p in left] == [(0, 2, 2), (0, 5, 6), (0, 8, 9), (1, 0, 1)]
    assert less_held([PartitionRange("clicks", 0, 3, 4)], held) == []


def test_the_replace_predicate_takes_exactly_the_rows_of_the_offsets(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    lineage = [f"kafka://{topic}/{partition}/{offset}" for topic in ("clicks", "clicks-2") for partition in (0, 1, 10)
               for offset in (0, 5, 9, 10, 100)]
    write_deltalake(table, pa.table({"_source_file": lineage}))
    where = RowFilter(file_column="_source_file", offsets=(("clicks", 1, 5, 10), ("clicks-2", 10, 0, 9)))
    assert count_rows(table, where) == 3 + 3
    assert RowFilter.from_dict(where.to_dict()) == where
    assert "`_source_file` >= 'kafka://clicks/1/5'" in render(where, SPARK_SQL)
    assert render(where, DATAFUSION).startswith('((substr("_source_file", 1, 17) = \'kafka://clicks/1/\'')
    write_deltalake(table, pa.table({"_source_file": ["kafka://clicks/1/7"]}), mode="overwrite",
                    predicate=render(where, DATAFUSION))  # delta-rs records the predicate in its commit
    assert count_rows(table, where) == 1 and count_rows(table, RowFilter(file_column="_source_file", offsets=(
        ("clicks", 0, 0, 100),))) == 5
    with pytest.raises(ValueError):
        RowFilter(file_column="_source_file", files=("a",), offsets=(("t", 0, 1, 2),))
