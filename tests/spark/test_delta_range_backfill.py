"""Range backfills of a Delta source on both engines: a silver stream replays versions of its upstream table.

The oracle is the upstream table read by delta-rs at its versions (the rows version v added are the rows of the
snapshot at v less those at v - 1), never the code under test.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from sluice.catalog import Catalog, load_catalog
from sluice.operations.backfill import BackfillError, parse_request, plan_backfill
from sluice.paths import Roots
from sluice_spark.backfill import run_backfill
from sluice_spark.runner import run_streams
from tests.helpers import roots_in, write_catalog

SILVER = {
    "name": "silver",
    "source": {"type": "delta", "path": "up", "schema": {"id": "bigint not null", "amount": "double"}},
    "transform": "identity",
    "sink": {"path": "silver", "engine": "rs"},
    "checkpoint": "silver",
    "schedule": "*/5 * * * *",
}


def append(table: Path, ids: range) -> int:
    write_deltalake(str(table), pa.table({"id": pa.array(list(ids), pa.int64()),
                                          "amount": pa.array([i / 4 for i in ids], pa.float64())}), mode="append")
    return DeltaTable(str(table)).version()


def added(table: Path, first: int, last: int) -> Counter[int]:
    """The ids versions ``first`` to ``last`` added, from delta-rs snapshots."""
    before = Counter() if first == 0 else Counter(
        DeltaTable(str(table), version=first - 1).to_pyarrow_table().column("id").to_pylist())
    return Counter(DeltaTable(str(table), version=last).to_pyarrow_table().column("id").to_pylist()) - before


def silver_ids(roots: Roots) -> Counter[int]:
    return Counter(DeltaTable(f"{roots.lake}/silver").to_pyarrow_table().column("id").to_pylist())


def world(tmp_path: Path, engine: str = "rs") -> tuple[Catalog, Roots, Path]:
    catalog = load_catalog(write_catalog(tmp_path, {**SILVER, "sink": {"path": "silver", "engine": engine}}))
    roots = roots_in(tmp_path)
    upstream = Path(roots.lake) / "up"
    for ids in (range(0, 10), range(10, 15), range(15, 22)):
        append(upstream, ids)
    return catalog, roots, upstream


def test_a_delta_range_is_refused_by_name_before_anything_is_read(tmp_path: Path) -> None:
    catalog, roots, _ = world(tmp_path)
    refusals = {
        "mode": {"start_version": 1, "mode": "replace"},
        "start": {"start_version": 1, "start": "2026-11-22T00:00:00Z", "end": "2026-11-23T00:00:00Z",
                  "select_by": "version"},
        "start_version": {"end_version": 2},
        "end_version": {"start_version": 2, "end_version": 1},
        "select_by": {"start_version": 1, "select_by": "file_time"},
    }
    for field, params in refusals.items():
        with pytest.raises(BackfillError) as refused:
            parse_request({"stream": "silver", **params}, catalog, run_id="r")
        assert refused.value.field == field, (field, str(refused.value))
    past = parse_request({"stream": "silver", "start_version": 1, "end_version": 9}, catalog, run_id="r")
    with pytest.raises(BackfillError, match=r"^end_version: .* no version 9; its latest is 2"):
        plan_backfill(past, catalog.get("silver"), roots)
    plan = plan_backfill(parse_request({"stream": "silver", "start_version": 1}, catalog, run_id="r"),
                         catalog.get("silver"), roots)
    assert plan.versions is not None and (plan.versions["first"], plan.versions["last"]) == (1, 2)
    assert [v["records"] for v in plan.versions["versions"]] == [5, 7] and plan.files == []


@pytest.mark.spark
@pytest.mark.parametrize("engine", ["rs", "jvm"])
def test_versions_and_commit_times_append_exactly_those_rows_again(spark: Any, tmp_path: Path, engine: str) -> None:
    """On jvm too: the range is read by sluice_delta (delta-spark's streaming source has no ending version), and
    written by delta-spark."""
    catalog, roots, upstream = world(tmp_path, engine)
    assert run_streams(spark, catalog, ["silver"], roots).ok
    expected = added(upstream, 0, 2)
    assert silver_ids(roots) == expected

    dry = run_backfill(spark, catalog, parse_request({"stream": "silver", "start_version": 1, "end_version": 2,
                                                      "dry_run": True}, catalog, run_id="dry"), roots)
    assert dry.ok and dry.versions is not None
    assert [(v["version"], v["records"]) for v in dry.versions["versions"]] == [(1, 5), (2, 7)]
    assert dry.rows_written == 12 and silver_ids(roots) == expected, "a dry run writes nothing"

    append(upstream, range(22, 30))  # version 3: after the range's end, never read by it
    one = parse_request({"stream": "silver", "start_version": 1, "end_version": 1}, catalog, run_id="v1")
    summary = run_backfill(spark, catalog, one, roots)
    assert summary.ok and summary.rows_written == 5, summary
    expected += added(upstream, 1, 1)
    assert silver_ids(roots) == expected
    again = run_backfill(spark, catalog, one, roots)  # the same run again: its batches are already committed
    assert again.ok and silver_ids(roots) == expected

    committed = {c["version"]: c["timestamp"] for c in DeltaTable(str(upstream)).history()}
    at = dt.datetime.fromtimestamp(committed[2] / 1000, dt.timezone.utc)
    by_time = parse_request({"stream": "silver", "select_by": "commit_time", "start": at.isoformat(),
                             "end": (at + dt.timedelta(milliseconds=1)).isoformat()}, catalog, run_id="t2")
    summary = run_backfill(spark, catalog, by_time, roots)
    assert summary.ok and summary.versions is not None and summary.versions["first"] == 2
    assert summary.versions["last"] == 2
    expected += added(upstream, 2, 2)
    assert silver_ids(roots) == expected
