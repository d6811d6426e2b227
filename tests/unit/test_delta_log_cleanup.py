"""Expired commit files are deleted with the log checkpoint that a batch's commit writes, not after every commit."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from sluice.storage.delta import ensured_table
from sluice.storage.tableformat import DeltaTableFormat


def _commits(log: Path) -> list[int]:
    return sorted(int(name.name.split(".")[0]) for name in log.glob("*.json"))


def test_a_batch_commit_cleans_the_expired_log_when_it_checkpoints(tmp_path: Path) -> None:
    path = str(tmp_path / "table")
    ensured_table(path, pa.schema([pa.field("id", pa.int64())]), (), name="table")  # a checkpoint every 10 versions
    DeltaTable(path).alter.set_table_properties({"delta.logRetentionDuration": "interval 1 seconds"})

    def commit(batch: int) -> None:
        assert DeltaTableFormat(path).commit_batch(pa.table({"id": [batch]}), query_id="q", batch_id=batch,
                                                   metadata={})

    log = tmp_path / "table" / "_delta_log"
    for batch in range(12):  # versions 2 to 13; the checkpoint of version 9
        commit(batch)
    time.sleep(1.5)
    for batch in range(12, 17):  # versions 14 to 18: no checkpoint, nothing deleted although expired
        commit(batch)
    assert _commits(log)[0] == 0
    commit(17)  # version 19: its checkpoint, and the commit files before the checkpoint of version 9 deleted
    assert (log / f"{19:020d}.checkpoint.parquet").exists()
    assert _commits(log)[0] == 9
    assert DeltaTable(path).transaction_version("q") == 17
