"""Backfills of a cdc stream on both engines and both types, against the oracle of tests/spark/test_cdc.py: the
range's changes go through the cdc writer again, so ``replace`` brings back rows the table lost, ``append`` applies
an archive the live stream never reads (late changes and deletes among them), and each backfill run twice gives
the same table."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from sluice.catalog import parse_catalog
from sluice.constants import CDC_END_COLUMN, CDC_START_COLUMN
from sluice.operations.backfill import parse_request
from sluice_spark.backfill import run_backfill
from sluice_spark.runner import run_streams
from tests.helpers import needs_jvm_jars, roots_in, table_rows
from tests.spark.test_cdc import Change, feed, split, type1, type2

pytestmark = [pytest.mark.spark, needs_jvm_jars]

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 22, 8, 0, tzinfo=UTC)
ARCHIVED = NOW - dt.timedelta(days=2)


def definition(engine: str, scd_type: int) -> dict[str, Any]:
    return {"name": "customers", "schedule": "@hourly", "backfill": {"max_range_days": 3},
            "source": {"type": "files", "format": "json", "path": "customers", "options": {"maxFileAge": "1h"},
                       "schema": {"id": "bigint not null", "name": "string", "tier": "string", "seq": "bigint not null",
                                  "op": "string"}},
            "sink": {"path": "silver/customers", "mode": "cdc", "engine": engine, "keys": ["id"],
                     "sequence_by": "seq",
                     "cdc": {"scd_type": scd_type, "delete_when": "op = 'd'", "except_columns": ["op"]}}}


def land(folder: Path, name: str, changes: list[Change], at: dt.datetime) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("".join(json.dumps({"id": c[0], "name": c[1], "tier": c[2], "seq": c[3], "op": c[4]}) + "\n"
                            for c in changes), encoding="utf-8")
    os.utime(path, (at.timestamp(), at.timestamp()))


def table(path: str, scd_type: int) -> list[tuple[Any, ...]]:
    names = ["id", "name", "tier", "seq", *((CDC_START_COLUMN, CDC_END_COLUMN) if scd_type == 2 else ())]
    return sorted(table_rows(path, names), key=lambda row: (row[0], row[4] if scd_type == 2 else 0))


@pytest.mark.parametrize(("engine", "scd_type"), [("rs", 1), ("jvm", 1), ("rs", 2), ("jvm", 2)])
def test_a_cdc_backfill_reapplies_the_range_and_twice_is_the_same(spark: Any, tmp_path: Path, engine: str,
                                                                  scd_type: int) -> None:
    roots = roots_in(tmp_path)
    landing = Path(roots.landing) / "customers"
    catalog = parse_catalog({"version": 1, "streams": [definition(engine, scd_type)]})
    parts = split(feed(seed=60 + scd_type), 4)
    for hour, part in enumerate(parts[:3]):
        land(landing, f"changes-{hour}.json", part, NOW + dt.timedelta(hours=hour))
    assert run_streams(spark, catalog, ["customers"], roots).ok
    sink = catalog.get("customers").sink_path(roots)
    oracle = type1 if scd_type == 1 else type2
    live = [change for part in parts[:3] for change in part]
    assert table(sink, scd_type) == oracle(live)

    def backfill(run_id: str, mode: str, start: dt.datetime) -> Any:
        request = parse_request({"stream": "customers", "start": start.isoformat(),
                                 "end": (NOW + dt.timedelta(hours=3)).isoformat(), "select_by": "file_time",
                                 "mode": mode}, catalog, run_id=run_id)
        summary = run_backfill(spark, catalog, request, roots)
        assert summary.ok, summary.error
        return summary

    # The table loses the rows (every version, for type 2) of a few keys; a replace of the range brings them back.
    DeltaTable(sink).delete("id < 4")
    assert table(sink, scd_type) != oracle(live)
    first = backfill("replace-1", "replace", NOW - dt.timedelta(hours=1))
    assert first.files == 3 and first.rows_replaced == 0 and first.batches == 1
    assert table(sink, scd_type) == oracle(live)
    backfill("replace-2", "replace", NOW - dt.timedelta(hours=1))
    assert table(sink, scd_type) == oracle(live), "the same replace again gives the same table"

    # An archive the live stream never reads (behind its maxFileAge horizon): late upserts and deletes of its keys.
    land(landing, "archive.json", parts[3], ARCHIVED)
    assert run_streams(spark, catalog, ["customers"], roots).streams[0].batches == 0
    appended = backfill("archive-1", "append", ARCHIVED - dt.timedelta(hours=1))
    assert appended.files >= 1 and appended.rows_written == len(parts[3])
    every = [change for part in parts for change in part]
    assert table(sink, scd_type) == oracle(every)
    backfill("archive-2", "append", ARCHIVED - dt.timedelta(hours=1))
    assert table(sink, scd_type) == oracle(every), "the same append again gives the same table"
