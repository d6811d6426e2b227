"""Repair of a cdc stream: a reset rolls the tombstones back with the table, and the health gate checks them.

A cdc table's deletes are remembered in ``_sluice_tombstones``, committed after the table with the same batch
transaction. A reset that rolled back only the table would leave the deletes of the batches it undoes remembered
(and the replay's skipped): an upsert older than such a delete would never come back."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import parse_catalog
from sluice.constants import FaultCode, Severity
from sluice.operations.health import check_stream
from sluice.operations.repair import run_action
from sluice.storage.checkpoint import read_query_id
from sluice.storage.delta import read_table, recorded_batch, txn_timeline
from sluice_spark.runner import run_streams
from sluice_spark.write.cdc import tombstones_path
from tests.helpers import roots_in
from tests.spark.test_cdc import type1
from tests.spark.test_cdc_backfill import NOW, definition, land, table

pytestmark = pytest.mark.spark


def test_a_reset_rolls_the_tombstones_back_with_the_table(spark: Any, tmp_path: Path) -> None:
    """Batch 0 upserts two keys, batch 1 deletes one of them. The file of batch 1 was wrong: it is taken away, the
    stream is reset to after batch 0, and a file with an older upsert of the key lands. The key is back, as the
    oracle over the two right files says; the tombstones table, left ahead, would have kept it deleted."""
    roots = roots_in(tmp_path)
    landing = Path(roots.landing) / "customers"
    stream = {**definition("rs", 1), "trigger": {"max_files_per_trigger": 1}}
    catalog = parse_catalog({"version": 1, "streams": [stream]})
    spec = catalog.get("customers")
    first = [(1, "a", "free", 5, "u"), (2, "b", "free", 5, "u")]
    land(landing, "changes-0.json", first, NOW)
    land(landing, "changes-1.json", [(1, None, None, 10, "d")], NOW + dt.timedelta(hours=1))
    assert run_streams(spark, catalog, ["customers"], roots).streams[0].batches == 2
    sink, stones = spec.sink_path(roots), tombstones_path(spec.sink_path(roots))
    assert table(sink, 1) == [(2, "b", "free", 5)]
    query_id = read_query_id(spec.checkpoint_path(roots))
    assert query_id is not None and recorded_batch(stones, query_id) == 1
    assert check_stream(spec, roots).status is Severity.OK

    (landing / "changes-1.json").unlink()
    after_batch_0 = max(at for at, batch in txn_timeline(sink, query_id) if batch == 0)
    result = run_action("reset", spec, roots, version=after_batch_0)
    assert result["resumes_after_batch"] == 0 and result["tables"]["tombstones"]["restored"]
    assert read_table(stones).num_rows == 0 and recorded_batch(stones, query_id) == 0
    report = check_stream(spec, roots)
    assert FaultCode.SINK_AHEAD_OF_CHECKPOINT not in report.codes, report.describe()

    later = [(1, "c", "pro", 7, "u")]
    land(landing, "changes-2.json", later, NOW + dt.timedelta(hours=2))
    assert run_streams(spark, catalog, ["customers"], roots).ok
    assert table(sink, 1) == type1(first + later) == [(1, "c", "pro", 7), (2, "b", "free", 5)]


def test_the_gate_stops_a_run_whose_tombstones_are_ahead_of_the_checkpoint(spark: Any, tmp_path: Path) -> None:
    """A checkpoint cut back by hand to batch 0 (as from an old backup): the gate fails with
    SINK_AHEAD_OF_CHECKPOINT for the tombstones table too, and points at the reset that rolls them back with the
    table."""
    roots = roots_in(tmp_path)
    landing = Path(roots.landing) / "customers"
    stream = {**definition("rs", 1), "trigger": {"max_files_per_trigger": 1}}
    catalog = parse_catalog({"version": 1, "streams": [stream]})
    spec = catalog.get("customers")
    land(landing, "changes-0.json", [(1, "a", "free", 5, "u")], NOW)
    land(landing, "changes-1.json", [(1, None, None, 10, "d")], NOW + dt.timedelta(hours=1))
    assert run_streams(spark, catalog, ["customers"], roots).streams[0].batches == 2
    checkpoint = Path(spec.checkpoint_path(roots))
    for folder in (checkpoint / "offsets", checkpoint / "commits", checkpoint / "sources" / "0"):
        for name in ("1", ".1.crc"):
            (folder / name).unlink(missing_ok=True)
    report = check_stream(spec, roots)
    ahead = [finding for finding in report.findings if finding.code is FaultCode.SINK_AHEAD_OF_CHECKPOINT]
    assert {finding.evidence["table"] for finding in ahead} >= {tombstones_path(spec.sink_path(roots))}
    assert report.status is Severity.FAIL and all("repair reset" in finding.message for finding in ahead)
