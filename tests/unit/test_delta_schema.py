"""How a stream's existing Delta table meets the schema the stream writes (``ensure_table``), with delta-rs alone."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from sluice.storage.delta import (
    DeltaSchemaMismatch,
    added_columns,
    brought_up_to_date,
    ensure_table,
    ensured_table,
)
from sluice.storage.tableformat import DeltaTableFormat

STREAM = pa.schema([("id", pa.string()), ("amount", pa.float64())])


def fields(path: Path) -> dict[str, tuple[str, bool]]:
    return {field["name"]: (field["type"], field["nullable"])
            for field in json.loads(DeltaTable(str(path)).schema().to_json())["fields"]}


def test_a_table_gains_the_columns_the_stream_now_writes_as_nullable_ones(tmp_path: Path) -> None:
    assert ensure_table(str(tmp_path), STREAM, (), name="t") is True
    write_deltalake(str(tmp_path), pa.table({"id": ["a"], "amount": [1.0]}, schema=STREAM), mode="append")
    wider = pa.schema([*STREAM, pa.field("_rescued_data", pa.string(), nullable=False)])
    assert ensure_table(str(tmp_path), wider, (), name="t") is False
    assert fields(tmp_path)["_rescued_data"] == ("string", True), "older rows read it as NULL"
    assert DeltaTable(str(tmp_path)).to_pyarrow_table().column("_rescued_data").to_pylist() == [None]


def test_sluice_s_own_columns_stay_when_the_stream_stops_writing_them(tmp_path: Path) -> None:
    marked = pa.field("coupon", pa.string(), metadata={"sluice.addedBy": "q:1"})
    ensure_table(str(tmp_path), pa.schema([*STREAM, ("_rescued_data", pa.string()), marked]), (), name="t")
    assert added_columns(str(tmp_path)) == {"coupon": "STRING"}
    assert ensure_table(str(tmp_path), STREAM, (), name="t") is False  # back under schema_evolution: none


@pytest.mark.parametrize(("table", "message"), [
    (pa.schema([*STREAM, ("other", pa.string())]), "Evolve the table or point the stream at a new table"),
    (pa.schema([("id", pa.string()), ("amount", pa.int64())]), "Evolve the table or point the stream at a new table"),
])
def test_a_foreign_column_or_another_type_is_refused(tmp_path: Path, table: pa.Schema, message: str) -> None:
    ensure_table(str(tmp_path), table, (), name="t")
    with pytest.raises(DeltaSchemaMismatch, match=message):
        ensure_table(str(tmp_path), STREAM, (), name="t")


def test_another_partitioning_is_refused_before_any_column_is_added(tmp_path: Path) -> None:
    ensure_table(str(tmp_path), STREAM, ["id"], name="t")
    version = DeltaTable(str(tmp_path)).version()
    with pytest.raises(DeltaSchemaMismatch, match="is partitioned by"):
        ensure_table(str(tmp_path), pa.schema([*STREAM, ("_rescued_data", pa.string())]), [], name="t")
    assert DeltaTable(str(tmp_path)).version() == version


def test_a_column_renamed_by_its_case_alone_is_refused(tmp_path: Path) -> None:
    ensure_table(str(tmp_path), STREAM, (), name="t")
    with pytest.raises(DeltaSchemaMismatch, match=r"Amount \(the table has amount\).*case-insensitive"):
        ensure_table(str(tmp_path), pa.schema([("id", pa.string()), ("Amount", pa.float64())]), (), name="t")


def test_the_table_a_run_ensured_is_current_and_serves_its_later_commits(tmp_path: Path) -> None:
    """A run loads each table once, when it creates or checks it, and brings that one up to date where a fresh state
    is needed: the exactly-once check of a later commit sees what another writer committed meanwhile."""
    path = str(tmp_path)
    created, was_created = ensured_table(path, STREAM, (), name="t")
    assert was_created and created.version() == 0
    table, was_created = ensured_table(path, pa.schema([*STREAM, ("_rescued_data", pa.string())]), (), name="t")
    assert not was_created and table.version() == 1, "the table as the column's addition left it"
    assert "_rescued_data" in table.schema().to_arrow().names
    rows = pa.table({"id": ["a"], "amount": [1.0], "_rescued_data": [None]},
                    schema=pa.schema([*STREAM, ("_rescued_data", pa.string())]))
    elsewhere = DeltaTableFormat(path)  # another writer, after the run loaded its table
    assert elsewhere.commit_batch(rows, query_id="q", batch_id=3, metadata={}) is True
    assert table.version() == 1, "the run's loaded table is stale"
    replay = DeltaTableFormat(path, loaded=table)
    assert replay.holds_batch("q", 3), "brought up to date before the check"
    assert replay.commit_batch(rows, query_id="q", batch_id=3, metadata={}) is False
    assert table.version() == 1
    current = brought_up_to_date(path, table)
    assert current.version() == DeltaTable(path).version() == 2
    assert brought_up_to_date(path, current) is current, "no commit since: the same table"
