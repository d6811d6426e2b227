"""The versions a range backfill of a Delta source reads: a version range or a time range of the upstream table,
resolved and checked before anything is read.

The plan is plain Python over the table's JSON commits, no JVM: a bad range fails in seconds, and a dry run's
counts cost nothing. Every refusal names the param it is about (:class:`~sluice.operations.backfill.BackfillError`):
a version past the table's latest, a version whose commit the log no longer holds (log retention), a version whose
data files were vacuumed, a version the read cannot take (an update or delete under ``read: appends``, a version
committed while the table did not record its changes under ``read: changes``), a version whose files carry deletion
vectors or a table that maps its columns (the range is read by ``sluice_delta``, on both engines), and a range with
nothing to read.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from sluice.errors import BackfillError
from sluice.storage.delta import CHANGE_FEED_PROPERTY, commit_actions, open_table
from sluice.storage.store import folder


@dataclass(frozen=True)
class VersionCount:
    """One version of the range: when it was committed, and what it adds (a change file has no statistics: its
    records are None)."""

    version: int
    committed_at: str | None
    files: int
    bytes: int
    records: int | None
    changes: bool = False


@dataclass
class VersionRange:
    """The versions ``first`` to ``last`` (both included) of a table, with their counts, for a dry run and for the
    backfill's reader (``startingVersion`` ``first``, ending at ``last``)."""

    table: str
    first: int
    last: int
    versions: list[VersionCount] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def files(self) -> int:
        return sum(version.files for version in self.versions)

    @property
    def bytes(self) -> int:
        return sum(version.bytes for version in self.versions)

    @property
    def records(self) -> int | None:
        """Rows the range adds; None when a version's count is unknown (its changes are in change files)."""
        counts = [version.records for version in self.versions]
        return None if any(count is None for count in counts) else sum(count or 0 for count in counts)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "files": self.files, "bytes": self.bytes, "records": self.records}


def plan_version_range(table: str, *, start_version: int | None = None, end_version: int | None = None,
                       start: datetime | None = None, end: datetime | None = None,
                       changes: bool = False) -> VersionRange:
    """The versions of ``table`` a backfill reads: ``start_version`` to ``end_version`` (both included; the end
    defaults to the latest), or those committed in ``[start, end)`` (UTC-aware). ``changes``: the backfill reads the
    table's change data feed (a ``read: changes`` stream), else the rows each version appends."""
    by_time = start is not None or end is not None
    if by_time and (start_version is not None or end_version is not None):
        raise BackfillError("start_version", "give a version range (start_version, end_version) or a time range "
                                             "(start, end), not both")
    upstream = open_table(table)
    latest = upstream.version()
    mapping = upstream.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mapping != "none":
        raise BackfillError("stream", f"{table} maps its columns (delta.columnMapping.mode = {mapping}); a range "
                                      "backfill reads the versions' files by column name (sluice_delta, the one "
                                      "Delta streaming source with an ending version), which such a table does not "
                                      "allow")
    if by_time:
        first, last = _versions_between(table, start, end)
        bound = "start"
    else:
        if start_version is None:
            raise BackfillError("start_version", "a Delta source is backfilled by a version range (start_version, "
                                                 "end_version) or a time range (start, end); give one")
        last = latest if end_version is None else end_version
        for name, value in (("start_version", start_version), ("end_version", last)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BackfillError(name, f"expected a table version (an integer from 0), got {value!r}")
        if last > latest:
            raise BackfillError("end_version", f"{table} has no version {last}; its latest is {latest}")
        if last < start_version:
            raise BackfillError("end_version", f"{last} is before start_version {start_version}")
        first, bound = start_version, "start_version"
    plan = VersionRange(table=table, first=first, last=last)
    records_changes = changes and first > 0 and _records_changes_at(table, first - 1)
    for version in range(first, last + 1):
        counted, records_changes = _count(table, version, bound, changes=changes, records_changes=records_changes)
        if counted is not None:
            plan.versions.append(counted)
    if not plan.versions:
        raise BackfillError(bound, f"versions {first} to {last} of {table} add no rows (table properties, "
                                   "compactions): there is nothing to backfill")
    return plan


def _versions_between(table: str, start: datetime | None, end: datetime | None) -> tuple[int, int]:
    """The first and the last version committed in ``[start, end)``."""
    if start is None or end is None:
        raise BackfillError("start" if start is None else "end", "a time range needs both start and end")
    if end <= start:
        raise BackfillError("end", f"{end.isoformat()} is not after start {start.isoformat()}")
    low, high = start.timestamp() * 1000, end.timestamp() * 1000
    inside = sorted(int(commit["version"]) for commit in open_table(table).history()
                    if low <= int(commit["timestamp"]) < high)
    if not inside:
        raise BackfillError("start", f"no version of {table} was committed from {start.isoformat()} to "
                                     f"{end.isoformat()}: there is nothing to backfill")
    return inside[0], inside[-1]


def _count(table: str, version: int, bound: str, *, changes: bool,
           records_changes: bool) -> tuple[VersionCount | None, bool]:
    """One version's counts, once it is known to be readable (its commit and its files still there, a kind of
    change the read can take); None for a version that changes no data. Also whether the table records its changes
    after this version."""
    try:
        actions = commit_actions(table, version)
    except FileNotFoundError:
        raise BackfillError(bound, f"version {version} of {table} is gone from its log (log retention); the "
                                   f"earliest version the log holds is {_earliest(table)}") from None
    adds = [action["add"] for action in actions if action.get("add", {}).get("dataChange", True) and "add" in action]
    change_files = [action["cdc"] for action in actions if "cdc" in action]
    removes = any(action.get("remove", {}).get("dataChange", False) for action in actions)
    committed_at = next((int(action["commitInfo"]["timestamp"]) for action in actions
                         if "timestamp" in action.get("commitInfo", {})), None)
    for action in actions:
        if "metaData" in action:
            configuration = action["metaData"].get("configuration") or {}
            records_changes = str(configuration.get(CHANGE_FEED_PROPERTY, "false")).lower() == "true"
    if not (adds or change_files or removes):
        return None, records_changes
    if removes and not changes:
        raise BackfillError(bound, f"version {version} of {table} updates or deletes rows, which a backfill of "
                                   "appends cannot apply; end the range before it, or start it after")
    if changes and not records_changes:
        raise BackfillError(bound, f"version {version} of {table} was committed while the table did not record its "
                                   f"changes ({CHANGE_FEED_PROPERTY}); start the range after it")
    read = change_files if change_files else adds
    if any(item.get("deletionVector") for item in read):
        raise BackfillError(bound, f"version {version} of {table} adds a file with a deletion vector, which a range "
                                   "backfill's reader (sluice_delta) cannot apply; start the range after it")
    gone = [item["path"] for item in read if not _exists(table, item["path"])]
    if gone:
        raise BackfillError(bound, f"version {version} of {table} was vacuumed: {len(gone)} of its data file(s) are "
                                   f"gone, e.g. {gone[0]}; start the range after the versions VACUUM removed")
    records = None if change_files else sum(int(json.loads(add["stats"]).get("numRecords", 0)) if add.get("stats")
                                            else 0 for add in adds)
    when = (datetime.fromtimestamp(committed_at / 1000, timezone.utc).isoformat() if committed_at is not None
            else None)
    return VersionCount(version, when, len(read), sum(int(item.get("size", 0)) for item in read), records,
                        changes=bool(change_files) or removes), records_changes


def _exists(table: str, path: str) -> bool:
    """Whether a data file of the table (its path relative to the table, or absolute) is still there."""
    import os
    from urllib.parse import unquote

    relative = unquote(path)
    where = relative if "://" in relative or os.path.isabs(relative) else f"{table.rstrip('/')}/{relative}"
    parent, _, name = where.rpartition("/")
    return folder(parent).exists(name)


def _earliest(table: str) -> int | None:
    """The first version whose commit the table's log still holds."""
    names = [entry.name for entry in folder(table).child("_delta_log").entries()]
    versions = [int(name[:20]) for name in names if len(name) == 25 and name.endswith(".json") and name[:20].isdigit()]
    return min(versions) if versions else None


def _records_changes_at(table: str, version: int) -> bool:
    try:
        configuration = open_table(table, version=version).metadata().configuration
    except Exception:  # the log no longer reaches that far back: the versions of the range say
        return False
    return str(configuration.get(CHANGE_FEED_PROPERTY, "false")).lower() == "true"
