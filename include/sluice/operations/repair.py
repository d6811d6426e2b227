"""Explicit checkpoint repair. Never automatic: each action is asked for by name, refuses to run while the stream
is locked, backs up what it changes next to the checkpoint first, and says what it did.

    python -m sluice repair history --stream events_bronze          # read-only: which batch wrote which version
    python -m sluice repair backup --stream events_bronze
    python -m sluice repair quarantine-offsets --stream events_bronze
    python -m sluice repair repin-query-id --stream events_bronze
    python -m sluice repair reset --stream events_bronze --version 12

Paths come from the catalog and the ``SLUICE_*`` roots, as for a run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

from sluice.constants import (
    CommitInfo,
    RunStatus,
    TableRole,
)
from sluice.errors import SluiceError
from sluice.model.stream import StreamSpec
from sluice.paths import Roots
from sluice.storage import runlog
from sluice.storage.checkpoint import CheckpointError, CheckpointReader, batch_id, log_file_batch, read_query_id
from sluice.storage.lock import LOCK_FILE, LockHeld
from sluice.storage.object_lock import lock_for
from sluice.storage.store import Folder, folder

log = logging.getLogger(__name__)

ACTIONS = ("history", "backup", "quarantine-offsets", "repin-query-id", "reset")
READ_ONLY_ACTIONS = frozenset({"history"})
# Files of a state store version: HDFS-backed ``N.delta`` / ``N.snapshot``, RocksDB ``N.zip`` / ``N.changelog``
# (``N_<id>.zip`` in checkpoint format v2), and their ``.crc`` files.
_STATE_FILE = re.compile(r"^\.?(\d+)(?:_[^.]*)?\.(?:delta|snapshot|zip|changelog)(?:\.crc)?$")


class RepairError(SluiceError):
    """A repair action was refused; nothing was changed."""


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{time.time_ns() % 1_000_000:06d}"


def _checkpoint(stream: StreamSpec, roots: Roots) -> Folder:
    """The stream's checkpoint, on a disk or an object store (a store moves a file by copy, then delete)."""
    return folder(stream.checkpoint_path(roots))


@contextlib.contextmanager
def _exclusive(checkpoint: Folder, stream: str) -> Iterator[None]:
    """Hold the stream's lock for the whole action, so that no run starts while the checkpoint changes."""
    try:
        with lock_for(checkpoint.uri, stream, f"repair-{uuid.uuid4()}"):
            yield
    except LockHeld as exc:
        raise RepairError(f"{exc}; repair a checkpoint only while no run uses it") from None


def _sink_batch(stream: StreamSpec, roots: Roots, query_id: str | None) -> int | None:
    """The newest batch of ``query_id`` that any of the stream's tables holds."""
    from sluice.storage.delta import recorded_batch

    if query_id is None:
        return None
    versions = []
    for table in stream.tables(roots, tombstones=True):
        version = recorded_batch(table.path, query_id)
        if version is not None:
            versions.append(version)
    return max(versions, default=None)


def backup(stream: StreamSpec, roots: Roots) -> dict[str, Any]:
    """Copy the whole checkpoint to ``<checkpoint>.backup-<time>`` beside it."""
    checkpoint = _checkpoint(stream, roots)
    if not checkpoint.is_dir():
        raise RepairError(f"stream '{stream.name}' has no checkpoint at {checkpoint}")
    with _exclusive(checkpoint, stream.name):
        return {"action": "backup", "stream": stream.name, "backup": _copy(checkpoint)}


def _beside(checkpoint: Folder, kind: str) -> Folder:
    """``<checkpoint>.<kind>-<time>``, beside the checkpoint."""
    return checkpoint.sibling(f"{checkpoint.uri.rstrip('/').rpartition('/')[2]}.{kind}-{_stamp()}")


def _copy(checkpoint: Folder) -> str:
    target = _beside(checkpoint, "backup")
    checkpoint.copy_tree(target, skip=lambda name: name == LOCK_FILE or name.startswith(f"{LOCK_FILE}."))
    return target.uri


def quarantine_offsets(stream: StreamSpec, roots: Roots) -> dict[str, Any]:
    """Move the latest ``offsets/N`` aside when batch N was never committed anywhere, so that Spark plans it again."""
    checkpoint = _checkpoint(stream, roots)
    with _exclusive(checkpoint, stream.name):
        return _quarantine_offsets(stream, roots, checkpoint)


def _quarantine_offsets(stream: StreamSpec, roots: Roots, checkpoint: Folder) -> dict[str, Any]:
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
    quarantine = _beside(checkpoint, "quarantine")
    moved = []
    for name in (str(latest), f".{latest}.crc"):
        if checkpoint.child("offsets").exists(name):
            checkpoint.move(f"offsets/{name}", quarantine)
            moved.append(name)
    return {"action": "quarantine-offsets", "stream": stream.name, "batch_id": latest, "moved": moved,
            "quarantine": quarantine.child("offsets").uri, "backup": saved}


def repin_query_id(stream: StreamSpec, roots: Roots) -> dict[str, Any]:
    """Write the query id recorded in the stream's Delta table into the checkpoint's ``metadata``.

    Only for a checkpoint that lost its metadata and nothing else: its offsets must reach the sink's newest batch
    of that query. Re-pinning a lost or foreign checkpoint would make the sink skip new batches as replays.
    """
    checkpoint = _checkpoint(stream, roots)
    with _exclusive(checkpoint, stream.name):
        return _repin_query_id(stream, roots, checkpoint)


def _repin_query_id(stream: StreamSpec, roots: Roots, checkpoint: Folder) -> dict[str, Any]:
    from sluice.storage.delta import stream_query_ids

    recorded = next((found for table in stream.tables(roots) if (found := stream_query_ids(table.path, stream.name))),
                    [])
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
                              "previous": current, "changed": True, "backup": _copy(checkpoint)}
    checkpoint.write_bytes("metadata", (json.dumps({"id": recorded[0]}) + "\n").encode("utf-8"))  # whole or not at all
    return result


def history(stream: StreamSpec, roots: Roots, *, limit: int = 50) -> dict[str, Any]:
    """Read-only: the sink's newest versions with the query and batch that wrote each, to pick a reset version."""
    from sluice.storage.delta import table_history

    try:
        query_id = read_query_id(stream.checkpoint_path(roots))
    except CheckpointError:
        query_id = None
    reader = CheckpointReader(stream.checkpoint_path(roots))
    commits = reader.commit_ids()
    return {"action": "history", "stream": stream.name, "table": stream.sink_path(roots),
            "checkpoint_query_id": query_id, "checkpoint_batches": [commits[0], commits[-1]] if commits else None,
            "versions": table_history(stream.sink_path(roots), limit=limit)}


# Delta versions are signed 64-bit numbers in the log; a larger one is a typo that delta-rs would overflow on.
MAX_DELTA_VERSION = 2**63 - 1


def reset_to_version(stream: StreamSpec, roots: Roots, version: int) -> dict[str, Any]:
    """Make the stream resume after Delta version ``version`` of its sink table.

    The newest batch of the checkpoint's query that the table holds at ``version`` is batch B. The checkpoint is
    cut back to batch B (later offsets, commits, file-source log entries and state versions are moved aside),
    then the sink table is restored to ``version`` and the dead-letter table (and a cdc sink's tombstones: deletes
    of batches that will be read again, or never, must not outlive them) to the version before its first batch
    after B, each in one commit that also resets the query's Delta transaction version to B. The next run
    reads again everything after batch B, and the tables end exactly as if it had never been read.

    The checkpoint is cut first: a crash between the steps leaves SINK_AHEAD_OF_CHECKPOINT, which stops runs,
    and the same reset can simply be run again.
    """
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_DELTA_VERSION:
        raise RepairError(f"version: expected a Delta version number from 0 to {MAX_DELTA_VERSION}, got {version!r}")
    if stream.sink.table is None:
        raise RepairError(f"stream '{stream.name}' writes to {stream.sink.destination}: reset rolls back Delta sinks "
                          "only (an Iceberg table is rolled back to a snapshot: see the Iceberg guide)")
    checkpoint = _checkpoint(stream, roots)
    with _exclusive(checkpoint, stream.name):
        return _reset(stream, roots, checkpoint, version)


def _reset(stream: StreamSpec, roots: Roots, checkpoint: Folder, version: int) -> dict[str, Any]:
    from sluice.storage.delta import table_version, txn_timeline

    sink = stream.sink_path(roots)
    current = table_version(sink)
    if current is None:
        raise RepairError(f"stream '{stream.name}' has no Delta table at {sink}; there is nothing to reset")
    if not 0 <= version <= current:
        raise RepairError(f"version: {version} is not a version of {sink}, which has versions 0 to {current}")
    try:
        query_id = read_query_id(checkpoint)
    except CheckpointError as exc:
        raise RepairError(f"{exc}. Re-pin the query id first (repin-query-id)") from None
    if query_id is None:
        raise RepairError(f"the checkpoint at {checkpoint} has no query id; a reset needs the query that wrote the "
                          "table. Restore the checkpoint from a backup, or re-pin its query id (repin-query-id)")
    timeline = txn_timeline(sink, query_id)
    batch = next(txn for at, txn in reversed(timeline) if at <= version)
    reader = CheckpointReader(checkpoint)
    committed = reader.commit_ids()
    last = committed[-1] if committed else -1
    if batch > last:
        reachable = max(at for at, txn in timeline if txn <= last)
        raise RepairError(
            f"version: Delta version {version} holds batch {batch} of query {query_id}, but the checkpoint's newest "
            f"committed batch is {last}, so it cannot resume after version {version}. Reset to version {reachable} "
            "or earlier (the checkpoint reaches it), or restore a newer checkpoint backup"
        )
    log_offsets = _log_offsets(reader, batch)
    saved = _copy(checkpoint)
    aside = _beside(checkpoint, "reset")
    moved = _cut_checkpoint(checkpoint, batch, log_offsets, aside)
    restored: dict[str, Any] = {}
    for table in stream.tables(roots, tombstones=True):
        # The sink goes back to the version asked for; every other table (dead letters, fan-out, a cdc sink's
        # tombstones) to its newest version that holds no batch after B.
        target = version if table.role is TableRole.SINK else max(
            (at for at, txn in txn_timeline(table.path, query_id) if txn <= batch), default=None)
        restored[table.name] = _restore(table.path, target, query_id, batch, stream.name, version)
    return {"action": "reset", "stream": stream.name, "version": version, "query_id": query_id,
            "resumes_after_batch": batch, "moved": moved, "moved_to": aside.uri, "backup": saved,
            "tables": restored}


def _log_offsets(reader: CheckpointReader, batch: int) -> dict[int, int]:
    """For each file source of the checkpoint, the log offset that batch ``batch`` reached; refuses when the
    checkpoint no longer holds what resuming after ``batch`` needs."""
    if batch < 0:
        return {}
    for log_name in ("offsets", "commits"):
        if not reader.folder.child(log_name).exists(str(batch)):
            raise RepairError(
                f"version: the checkpoint no longer holds {log_name}/{batch} (Spark keeps the last "
                "spark.sql.streaming.minBatchesToRetain batches); reset to a later version, or restore a backup"
            )
    try:
        entry = reader.read_offsets(batch)
    except CheckpointError as exc:
        raise RepairError(f"{exc}; restore the checkpoint from a backup") from None
    reached: dict[int, int] = {}
    for source, offset in enumerate(entry.sources):
        if not (isinstance(offset, dict) and isinstance(offset.get("logOffset"), int)):
            continue  # not a file source: its position is the offsets file itself
        log_offset = offset["logOffset"]
        present = set(reader.file_source_log(source))
        names = {entry.name for entry in reader.folder.child("sources", str(source)).entries()}
        compacts = [i for i in present if f"{i}.compact" in names and i <= log_offset]
        needed = range(max(compacts, default=-1) + 1, log_offset + 1)
        missing = [i for i in needed if i not in present]
        if missing:
            raise RepairError(
                f"version: the file source log sources/{source} no longer holds entries {missing[:10]} that batch "
                f"{batch} reached (Spark deletes entries behind a compaction); reset to a version whose batch ends at "
                "a compaction, or restore a backup"
            )
        reached[source] = log_offset
    return reached


def _cut_checkpoint(checkpoint: Folder, batch: int, log_offsets: dict[int, int], aside: Folder) -> list[str]:
    """Move every log and state file after ``batch`` into ``aside``; a reset to before the first batch moves the
    file-source logs and the state whole."""
    moved: list[str] = []

    def move(relative: str) -> None:
        checkpoint.move(relative, aside)
        moved.append(relative)

    for log_name in ("offsets", "commits"):
        for entry in checkpoint.child(log_name).entries():
            logged = log_file_batch(entry.name, with_checksums=True)
            if not entry.is_dir and logged is not None and logged > batch:
                move(f"{log_name}/{entry.name}")
    for source in checkpoint.child("sources").entries():
        if not source.is_dir:
            continue
        if batch < 0:
            move(f"sources/{source.name}")
        elif (index := batch_id(source.name)) is not None and index in log_offsets:
            for entry in checkpoint.child("sources", source.name).entries():
                logged = log_file_batch(entry.name, with_checksums=True)
                if not entry.is_dir and logged is not None and logged > log_offsets[index]:
                    move(f"sources/{source.name}/{entry.name}")
    state = checkpoint.child("state")
    if state.is_dir() and batch < 0:
        move("state")
    elif state.is_dir():
        # Batch N loads state version N and commits version N + 1.
        for relative, entry in sorted(state.walk()):
            match = _STATE_FILE.match(entry.name)
            if match and int(match.group(1)) > batch + 1:
                move(f"state/{relative}")
    return moved


def _restore(path: str, target: int | None, query_id: str, batch: int, stream: str, version: int) -> dict[str, Any]:
    """Restore one table to ``target`` in one commit that also sets the query's transaction version to ``batch``,
    so that the sink takes the replayed batches as new. ``target`` None: the table has no batch after ``batch``."""
    from deltalake import CommitProperties, Transaction
    from deltalake.exceptions import TableNotFoundError

    from sluice.storage.delta import open_table

    try:
        table = open_table(path)
    except TableNotFoundError:
        return {"table": path, "restored": False}
    before = table.version()
    if target is None or target >= before:
        return {"table": path, "restored": False, "version": before}
    table.restore(target, commit_properties=CommitProperties(
        custom_metadata={CommitInfo.ACTION: "reset", CommitInfo.RESET_QUERY: query_id,
                         CommitInfo.RESET_BATCH: batch, CommitInfo.RESET_VERSION: version,
                         CommitInfo.RESET_STREAM: stream},
        app_transactions=[Transaction(query_id, batch)],
    ))
    return {"table": path, "restored": True, "from_version": before, "restored_to": target,
            "version": open_table(path).version()}


def run_action(action: str, stream: StreamSpec, roots: Roots, *, version: int | None = None) -> dict[str, Any]:
    if action == "reset":
        if version is None:
            raise RepairError("version: reset needs the Delta version of the sink table to resume after")
        return reset_to_version(stream, roots, version)
    handlers = {"history": history, "backup": backup, "quarantine-offsets": quarantine_offsets,
                "repin-query-id": repin_query_id}
    if action not in handlers:
        raise RepairError(f"unknown repair action {action!r}; expected one of {', '.join(ACTIONS)}")
    return handlers[action](stream, roots)


def run_and_log(action: str, stream: StreamSpec, roots: Roots, *, run_id: str,
                version: int | None = None) -> dict[str, Any]:
    """:func:`run_action`, and for an action that changes something (not ``history``) a row in the run log
    (kind ``repair``: the action and its result, or why it was refused)."""
    started = time.time()
    try:
        result = run_action(action, stream, roots, version=version)
    except SluiceError as exc:
        if action not in READ_ONLY_ACTIONS:
            runlog.log_operation(roots.lake, stream=stream.name, run_id=run_id, kind="repair", started=started,
                                 status=RunStatus.FAILED, error=str(exc), note={"action": action, "version": version})
        raise
    if action not in READ_ONLY_ACTIONS:
        runlog.log_operation(roots.lake, stream=stream.name, run_id=run_id, kind="repair", started=started,
                             status=RunStatus.SUCCEEDED, error=None,
                             note={"action": action, "version": version, **result})
    return result
