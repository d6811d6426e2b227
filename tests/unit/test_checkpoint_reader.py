from __future__ import annotations

from pathlib import Path

import pytest

from sluice.storage.checkpoint import CheckpointError, CheckpointReader


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_listings_ignore_crc_and_temporary_files(tmp_path: Path) -> None:
    for batch in (0, 1, 2):
        write(tmp_path / "offsets" / str(batch), 'v1\n{"batchWatermarkMs":0}\n' + f'{{"logOffset":{batch}}}')
        write(tmp_path / "offsets" / f".{batch}.crc", "x")
    write(tmp_path / "offsets" / ".3.0b1c.tmp", "partial")
    write(tmp_path / "sources" / "0" / "9.compact", "v1\n")
    write(tmp_path / "sources" / "0" / "10", "v1\n")
    reader = CheckpointReader(tmp_path)
    assert reader.offset_ids() == [0, 1, 2]
    assert reader.commit_ids() == []
    assert reader.file_source_log() == [9, 10]
    entry = reader.read_offsets(2)
    assert entry.sources == [{"logOffset": 2}] and entry.metadata == {"batchWatermarkMs": 0}


def test_source_without_data_is_a_dash(tmp_path: Path) -> None:
    write(tmp_path / "offsets" / "0", 'v1\n{}\n-\n{"logOffset":0}')
    assert CheckpointReader(tmp_path).read_offsets(0).sources == [None, {"logOffset": 0}]


@pytest.mark.parametrize("text", ["", "v1", 'v1\n{"batchWatermarkMs":', 'v1\n{}\n{"logOff', "garbage\n{}"])
def test_torn_offsets_are_refused(tmp_path: Path, text: str) -> None:
    write(tmp_path / "offsets" / "4", text)
    with pytest.raises(CheckpointError, match="offsets/4"):
        CheckpointReader(tmp_path).read_offsets(4)


def test_state_size(tmp_path: Path) -> None:
    write(tmp_path / "state" / "0" / "0" / "1.delta", "x" * 100)
    write(tmp_path / "state" / "0" / "1" / "1.delta", "y" * 23)
    reader = CheckpointReader(tmp_path)
    assert reader.has_state() and reader.state_bytes() == 123


def test_pruning_the_source_log_drops_only_committed_gone_entries_behind_the_horizon(tmp_path: Path) -> None:
    # Batches 0-9 compacted into 9.compact, batch 10 after it: (batch, time, file) per entry.
    entries = [(batch, 1_000 * batch, f"/landing/f{batch}.json") for batch in range(10)]
    lines = [f'{{"path":"file://{path}","timestamp":{stamp},"batchId":{batch}}}' for batch, stamp, path in entries]
    log = tmp_path / "sources" / "0"
    write(log / "9.compact", "\n".join(["v1", *lines]))
    write(log / ".9.compact.crc", "stale after a rewrite")
    write(log / "10", 'v1\n{"path":"file:///landing/f10.json","timestamp":10000,"batchId":10}')
    reader = CheckpointReader(tmp_path)
    still_there = {"/landing/f2.json"}

    dropped = reader.prune_file_source_log(through_batch=7, before_ms=6_000, gone=lambda p: p not in still_there)

    assert dropped == 5, "batches 0, 1, 3, 4, 5: committed, behind the horizon and gone"
    assert (log / "9.compact").read_text() == "\n".join(["v1", lines[2], *lines[6:]]), \
        "the kept lines verbatim, in their order, in Spark's layout (no trailing newline)"
    assert not (log / ".9.compact.crc").exists(), "a stale checksum would fail Spark's next read"
    assert sorted(reader.file_source_files()) == [f"/landing/f{batch}.json" for batch in (10, 2, 6, 7, 8, 9)]
    assert reader.prune_file_source_log(through_batch=7, before_ms=6_000, gone=lambda p: True) == 1, "f2 now"
    assert reader.prune_file_source_log(through_batch=7, before_ms=6_000, gone=lambda p: True) == 0
    assert (log / "10").read_text().startswith("v1\n"), "only the newest compact file is rewritten"
