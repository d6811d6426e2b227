from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.storage.checkpoint import CheckpointError, ensure_query_id, read_query_id


def test_new_checkpoint_gets_a_pinned_id(tmp_path: Path) -> None:
    checkpoint = tmp_path / "cp"
    assert read_query_id(checkpoint) is None
    query_id = ensure_query_id(checkpoint)
    assert json.loads((checkpoint / "metadata").read_text())["id"] == query_id
    assert ensure_query_id(checkpoint) == query_id
    assert [p.name for p in checkpoint.iterdir()] == ["metadata"]


def test_existing_spark_metadata_is_kept(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text('{"id":"0b4c3b61-7f9b-4f6e-9d0a-1f1f6ad7e8a1"}')
    assert ensure_query_id(tmp_path) == "0b4c3b61-7f9b-4f6e-9d0a-1f1f6ad7e8a1"


def test_offsets_without_metadata_is_refused(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("v1\n{}\n")
    with pytest.raises(CheckpointError, match="has offsets but no metadata"):
        ensure_query_id(tmp_path)
    assert not (tmp_path / "metadata").exists()


def test_corrupt_metadata_is_refused(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text('{"id": ')
    with pytest.raises(CheckpointError, match="is corrupt"):
        ensure_query_id(tmp_path)
