"""The snapshots a range backfill of an Iceberg source reads: a range of the upstream table's snapshots by sequence
number, or the snapshots committed in a time range, resolved and checked before anything is read.

An Iceberg table's sequence numbers are its Delta versions: one per snapshot, increasing along its history (the
Streams page's and the seam's commit ``version``). The range is taken from the current snapshot's ancestry (a
snapshot rolled back is not in it), and reads what a live run would: the rows each **append** adds, a ``replace``
(a compaction) nothing, an ``overwrite`` or a ``delete`` refused unless the source skips that kind
(:mod:`sluice.storage.iceberg_snapshots`). Plain pyiceberg over the table's metadata, no JVM: the backfill's reader
(``sluice_iceberg``) then reads from the snapshot before the first to the last.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone

from sluice.errors import BackfillError
from sluice.operations.delta_range import VersionCount, VersionRange
from sluice.storage.iceberg import IcebergTableFormat
from sluice.storage.iceberg_snapshots import IcebergSourceError, check_readable, history_after


def plan_snapshot_range(table: IcebergTableFormat, *, start_version: int | None = None,
                        end_version: int | None = None, start: datetime | None = None, end: datetime | None = None,
                        options: Mapping[str, str] | None = None) -> VersionRange:
    """The snapshots of ``table`` a backfill reads, by sequence number: ``start_version`` to ``end_version`` (both
    included; the end defaults to the current snapshot's), or those committed in ``[start, end)`` (UTC-aware).
    ``options`` are the source's (its skip options)."""
    if not table.exists():
        raise BackfillError("stream", f"{table.name} does not exist yet: there is nothing to backfill")
    history = history_after(table.table(), None, identifier=table.identifier)
    if not history:
        raise BackfillError("stream", f"{table.name} has no snapshot yet: there is nothing to backfill")
    if start is not None or end is not None:
        if start_version is not None or end_version is not None:
            raise BackfillError("start_version", "give a version range (start_version, end_version) or a time "
                                                 "range (start, end), not both")
        if start is None or end is None:
            raise BackfillError("start" if start is None else "end", "a time range needs both start and end")
        if end <= start:
            raise BackfillError("end", f"{end.isoformat()} is not after start {start.isoformat()}")
        low, high = start.timestamp() * 1000, end.timestamp() * 1000
        inside = [snapshot for snapshot in history if low <= snapshot.timestamp_ms < high]
        if not inside:
            raise BackfillError("start", f"no snapshot of {table.name} was committed from {start.isoformat()} to "
                                         f"{end.isoformat()}: there is nothing to backfill")
        bound = "start"
    else:
        latest = history[-1].sequence
        if start_version is None:
            raise BackfillError("start_version", "an Iceberg source is backfilled by a range of its snapshots' "
                                                 "sequence numbers (start_version, end_version) or a time range "
                                                 "(start, end); give one")
        last = latest if end_version is None else end_version
        for name, value in (("start_version", start_version), ("end_version", last)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BackfillError(name, f"expected a snapshot's sequence number (an integer from 0), got {value!r}")
        if last > latest:
            raise BackfillError("end_version", f"{table.name} has no snapshot of sequence number {last}; its "
                                               f"current one is {latest}")
        if last < start_version:
            raise BackfillError("end_version", f"{last} is before start_version {start_version}")
        if start_version < history[0].sequence:
            raise BackfillError("start_version", f"the history of {table.name} starts at sequence number "
                                                 f"{history[0].sequence} (older snapshots expired)")
        inside = [snapshot for snapshot in history if start_version <= snapshot.sequence <= last]
        bound = "start_version"
    plan = VersionRange(table=table.identifier, first=inside[0].sequence, last=inside[-1].sequence)
    for snapshot in inside:
        try:
            readable = check_readable(snapshot, options or {}, identifier=table.identifier)
        except IcebergSourceError as error:
            raise BackfillError(bound, str(error)) from None
        if readable:
            committed = datetime.fromtimestamp(snapshot.timestamp_ms / 1000, timezone.utc).isoformat()
            plan.versions.append(VersionCount(snapshot.sequence, committed, snapshot.files, snapshot.bytes,
                                              snapshot.records))
    if not plan.versions:
        raise BackfillError(bound, f"snapshots {plan.first} to {plan.last} of {table.name} append no rows "
                                   "(compactions, skipped overwrites): there is nothing to backfill")
    return plan
