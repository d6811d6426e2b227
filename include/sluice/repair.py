"""Explicit checkpoint repair. Never automatic: each action is asked for by name, refuses to run while the stream
is locked, backs up what it changes next to the checkpoint first, and says what it did.

    python -m sluice.repair backup --stream events_bronze
    python -m sluice.repair quarantine-offsets --stream events_bronze
    python -m sluice.repair repin-query-id --stream events_bronze

Paths come from the catalog and the ``SLUICE_*`` roots, as for a run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sluice.catalog import StreamSpec, load_catalog
from sluice.checkpoint import CheckpointError, CheckpointReader, read_query_id
from sluice.errors import SluiceError
from sluice.lock import LOCK_FILE, LockHeld, StreamLock
from sluice.paths import Roots

ACTIONS = ("backup", "quarantine-offsets", "repin-query-id")


class RepairError(SluiceError):
    """A repair action was refused; nothing was changed."""


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{time.time_ns() % 1_000_000:06d}"


@contextlib.contextmanager
def _exclusive(checkpoint: Path, stream: str) -> Iterator[None]:
    """Hold the stream's lock for the whole action, so that no run starts while the checkpoint changes."""
    try:
        with StreamLock(checkpoint, stream, f"repair-{uuid.uuid4()}"):
            yield
    except LockHeld as exc:
        raise RepairError(f"{exc}; repair a checkpoint only while no run uses it") from None


def _sink_batch(stream: StreamSpec, roots: Roots, query_id: str | None) -> int | None:
    """The newest batch of ``query_id`` that either of the stream's tables holds."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    if query_id is None:
        return None
    versions = []
    for path in (stream.sink_path(roots), stream.dead_letter_table_path(roots)):
        with contextlib.suppress(TableNotFoundError):
            version = DeltaTable(path).transaction_version(query_id)
            if version is not None:
                versions.append(version)
    return max(versions, default=None)


def backup(stream: StreamSpec, roots: Roots) -> dict[str, Any]:
    """Copy the whole checkpoint to ``<checkpoint>.backup-<time>`` beside it."""
    checkpoint = Path(stream.checkpoint_path(roots))
    if not checkpoint.is_dir():
        raise RepairError(f"stream '{stream.name}' has no checkpoint at {checkpoint}")
    with _exclusive(checkpoint, stream.name):
        return {"action": "backup", "stream": stream.name, "backup": str(_copy(checkpoint))}


def _copy(checkpoint: Path) -> Path:
    target = checkpoint.with_name(f"{checkpoint.name}.backup-{_stamp()}")
    shutil.copytree(checkpoint, target, ignore=shutil.ignore_patterns(LOCK_FILE, f"{LOCK_FILE}.*"))
    return target


def quarantine_offsets(stream: StreamSpec, roots: Roots) -> dict[str, Any]:
    """Move the latest ``offsets/N`` aside when batch N was never committed anywhere, so that Spark plans it again."""
    checkpoint = Path(stream.checkpoint_path(roots))
    with _exclusive(checkpoint, stream.name):
        return _quarantine_offsets(stream, roots, checkpoint)


def _quarantine_offsets(stream: StreamSpec, roots: Roots, checkpoint: Path) -> dict[str, Any]:
    reader = CheckpointReader(checkpoint)
    offsets, commits = reader.offset_ids(), reader.commit_ids()
    if not offsets:
        raise RepairError(f"stream '{stream.name}' has no offsets to quarantine")
    latest = offsets[-1]
    if commits and commits[-1] >= latest:
        raise RepairError(f"offsets/{latest} belongs to a committed batch; quarantining it would lose its position. "
                          "Restore the checkpoint from a backup instead")
    try:
        query_id = read_query_id(checkpoint)
    except CheckpointError:
        query_id = None
    in_sink = _sink_batch(stream, roots, query_id)
    if in_sink is not None and in_sink >= latest:
        # Spark would plan batch N again with more files than the sink committed for it, and the sink would skip it.
        raise RepairError(f"batch {latest} is already committed to the Delta tables; quarantining its offsets would "
                          f"lose the files that arrived since. Restore offsets/{latest} from a backup instead")
    saved = _copy(checkpoint)
    quarantine = checkpoint.with_name(f"{checkpoint.name}.quarantine-{_stamp()}") / "offsets"
    quarantine.mkdir(parents=True)
    moved = []
    for name in (str(latest), f".{latest}.crc"):
        source = checkpoint / "offsets" / name
        if source.exists():
            os.replace(source, quarantine / name)
            moved.append(name)
    return {"action": "quarantine-offsets", "stream": stream.name, "batch_id": latest, "moved": moved,
            "quarantine": str(quarantine), "backup": str(saved)}


def repin_query_id(stream: StreamSpec, roots: Roots) -> dict[str, Any]:
    """Write the query id recorded in the stream's Delta table into the checkpoint's ``metadata``.

    Only for a checkpoint that lost its metadata and nothing else: its offsets must reach the sink's newest batch
    of that query. Re-pinning a lost or foreign checkpoint would make the sink skip new batches as replays.
    """
    checkpoint = Path(stream.checkpoint_path(roots))
    with _exclusive(checkpoint, stream.name):
        return _repin_query_id(stream, roots, checkpoint)


def _repin_query_id(stream: StreamSpec, roots: Roots, checkpoint: Path) -> dict[str, Any]:
    from sluice.delta import stream_query_ids

    recorded = stream_query_ids(stream.sink_path(roots), stream.name) or stream_query_ids(
        stream.dead_letter_table_path(roots), stream.name
    )
    if not recorded:
        raise RepairError(f"the Delta tables of stream '{stream.name}' record no query id to re-pin")
    try:
        current = read_query_id(checkpoint)
    except CheckpointError:
        current = None
    if current == recorded[0]:
        return {"action": "repin-query-id", "stream": stream.name, "query_id": current, "changed": False}
    offsets = CheckpointReader(checkpoint).offset_ids()
    in_sink = _sink_batch(stream, roots, recorded[0])
    if not offsets or (in_sink is not None and in_sink > offsets[-1]):
        raise RepairError(
            f"the checkpoint's offsets ({offsets[-1] if offsets else 'none'}) do not reach batch {in_sink} that query "
            f"{recorded[0]} committed: this is not a checkpoint that only lost its metadata, and re-pinning would make "
            "the sink skip new data as replays. Restore the checkpoint from a backup instead")
    result: dict[str, Any] = {"action": "repin-query-id", "stream": stream.name, "query_id": recorded[0],
                              "previous": current, "changed": True, "backup": str(_copy(checkpoint))}
    temporary = checkpoint / f".metadata.{_stamp()}.tmp"
    temporary.write_text(json.dumps({"id": recorded[0]}) + "\n", encoding="utf-8")
    os.replace(temporary, checkpoint / "metadata")
    return result


def run_action(action: str, stream: StreamSpec, roots: Roots) -> dict[str, Any]:
    handlers = {"backup": backup, "quarantine-offsets": quarantine_offsets, "repin-query-id": repin_query_id}
    if action not in handlers:
        raise RepairError(f"unknown repair action {action!r}; expected one of {', '.join(ACTIONS)}")
    return handlers[action](stream, roots)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice.repair", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--catalog", help="default: SLUICE_CATALOG or the bundled catalog")
    args = parser.parse_args(argv)
    try:
        stream = load_catalog(args.catalog).get(args.stream)
        result = run_action(args.action, stream, Roots.from_env())
    except SluiceError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
