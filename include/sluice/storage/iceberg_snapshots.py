"""What an Iceberg streaming source reads: the snapshots of a table's history after an offset, and the data files
each one adds. Pure pyiceberg (no pyspark), shared by the Spark reader (:mod:`sluice_spark.rs.iceberg_source`) and
the lag probe (:class:`sluice.kinds.iceberg.IcebergSourceKind`).

An offset is ``{"snapshot": id, "sequence": n}``: every snapshot of the table's history up to snapshot ``id``
(sequence number ``n``) has been read; ``{"snapshot": -1, "sequence": 0}`` is before the first. The history is the
current snapshot's ancestry, oldest first: a snapshot rolled back is no longer in it, and neither is one expired.

An append snapshot's rows are the data files it adds. A ``replace`` (a compaction: the same rows in new files) adds
nothing to read. An ``overwrite`` or a ``delete`` removes or rewrites rows an append-only reader has already passed
on: it stops the read, naming the table and the snapshot, unless the source is told to skip that kind
(:data:`SKIP_OPTIONS`, Spark's Iceberg source's own option names).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluice.errors import SluiceError

# The reader options that skip a kind of snapshot instead of stopping at it, by snapshot operation.
SKIP_OPTIONS = {"overwrite": "streaming-skip-overwrite-snapshots", "delete": "streaming-skip-delete-snapshots"}
# The snapshot summary's counts of what it adds (Iceberg's standard summary fields).
ADDED_FILES, ADDED_BYTES, ADDED_RECORDS = "added-data-files", "added-files-size", "added-records"
BEFORE_FIRST = {"snapshot": -1, "sequence": 0}
# The catalog properties a data file's reader needs none of: the catalog's own address and credentials.
_CATALOG_ONLY = frozenset({"uri", "credential", "token", "warehouse", "type"})


class IcebergSourceError(SluiceError):
    """A snapshot an append-only Iceberg source cannot read, or an offset the table's history no longer has."""


@dataclass(frozen=True)
class PlannedSnapshot:
    """One snapshot of the history: its id, sequence number, operation and what its summary says it adds."""

    snapshot_id: int
    sequence: int
    operation: str
    timestamp_ms: int
    files: int
    bytes: int
    records: int

    @property
    def offset(self) -> dict[str, int]:
        return {"snapshot": self.snapshot_id, "sequence": self.sequence}


def _count(summary: Mapping[str, str], key: str) -> int:
    try:
        return int(summary.get(key, 0))
    except ValueError:
        return 0


def planned(snapshot: Any) -> PlannedSnapshot:
    """A snapshot of the history, with what a reader reads of it: a ``replace`` (a compaction) adds no row to read,
    whatever files its summary says it adds, so it counts for nothing in a read limit or a lag."""
    summary = dict(snapshot.summary.additional_properties) if snapshot.summary is not None else {}
    operation = snapshot.summary.operation.value if snapshot.summary is not None else "append"
    if operation == "replace":
        summary = {}
    return PlannedSnapshot(snapshot.snapshot_id, int(snapshot.sequence_number or 0), operation,
                           snapshot.timestamp_ms, _count(summary, ADDED_FILES), _count(summary, ADDED_BYTES),
                           _count(summary, ADDED_RECORDS))


def history_after(table: Any, offset: Mapping[str, Any] | None, *, identifier: str) -> list[PlannedSnapshot]:
    """The snapshots of the table's history after ``offset``, oldest first. An offset whose snapshot the history
    no longer holds (expired, or rolled back) is refused: what follows it cannot be told."""
    from pyiceberg.table.snapshots import ancestors_of

    after = int((offset or BEFORE_FIRST).get("snapshot", -1))
    newer: list[PlannedSnapshot] = []
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        if snapshot.snapshot_id == after:
            return newer[::-1]
        newer.append(planned(snapshot))
    if after == -1:
        return newer[::-1]
    raise IcebergSourceError(
        f"Iceberg table {identifier}: snapshot {after}, which the checkpoint read up to, is no longer in the table's "
        "history (expired, or rolled back past); restart the stream with a new checkpoint")


def check_readable(snapshot: PlannedSnapshot, options: Mapping[str, str], *, identifier: str) -> bool:
    """Whether the source reads the snapshot's added files: an append yes, a compaction no; an overwrite or a
    delete is skipped when its option says so, and refused otherwise."""
    if snapshot.operation == "append":
        return True
    if snapshot.operation == "replace":
        return False
    option = SKIP_OPTIONS.get(snapshot.operation)
    if option is not None and str(options.get(option, "false")).lower() == "true":
        return False
    raise IcebergSourceError(
        f"Iceberg table {identifier}: snapshot {snapshot.snapshot_id} is an {snapshot.operation}, which removes or "
        f"rewrites rows; this source reads appends only. Set the source option {option} to true to skip such "
        "snapshots, or restart the stream after it with a new checkpoint")


def added_data_files(table: Any, snapshot_id: int) -> list[Any]:
    """The data files (pyiceberg ``DataFile``) that snapshot ``snapshot_id`` adds, from its own manifests."""
    from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus

    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    files = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content is not ManifestContent.DATA or manifest.added_snapshot_id != snapshot_id:
            continue
        files += [entry.data_file for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
                  if entry.status is ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot_id
                  and entry.data_file.content is DataFileContent.DATA]
    return files


def file_io_properties(table: Any) -> dict[str, str]:
    """The table's FileIO properties without the catalog's address and credentials: what an executor needs to read
    a data file, and no more."""
    return {key: value for key, value in dict(table.io.properties).items() if key not in _CATALOG_ONLY}
