"""Delta maintenance of every table Sluice writes, on delta-rs, without Spark: compaction, vacuum, a log checkpoint
and the cleanup of expired commit files.

A stream that runs every five minutes adds a few small files and a commit to each of its tables per run. Left
alone, a table read after months of runs lists thousands of files and replays thousands of commits. Per table:

1. **compact**: bin-pack small files into files of the table's ``delta.targetFileSize`` (delta-rs's 100 MiB when
   unset), partition by partition. The commit adds and removes files with ``dataChange: false``: a Delta-source
   stream reading the table (either engine) sees nothing new, and the table's rows are unchanged.
2. **vacuum**: delete the data files that the current version does not reference and that are older than the
   retention: the files a commit removed, and the files of a write that crashed before its commit. (A full vacuum,
   which lists the table's folder: a Delta checkpoint forgets expired removals, so a vacuum that only followed
   them would leak the files of a vacuum it skipped.) The retention is the table's
   ``delta.deletedFileRetentionDuration`` (7 days when unset); asking for less is refused, because a reader or a
   stream still on an older version would lose its files. It is skipped while a catalog stream that
   reads the table (a Delta source) has versions to read that are older than the retention: the files of those
   versions are the ones a vacuum would delete.
3. **checkpoint and clean the log**: write a Delta checkpoint of the current version, so a reader replays a few
   commits instead of all of them, and delete commit files older than ``delta.logRetentionDuration`` (30 days)
   that a checkpoint covers. Skipped under the same rule for readers, with the log's retention: Sluice's Delta
   source reads versions from their commit files. (delta-rs also cleans expired commit files after the commits
   that write a log checkpoint, a stream's included, unless the table sets ``delta.enableExpiredLogCleanup`` to
   false: a Delta-source stream must not fall further behind than ``delta.logRetentionDuration``.)

An Iceberg sink's small data files are compacted (one ``replace`` snapshot, which an Iceberg-source stream passes
over), its snapshots expired and its orphan data files removed under the same retention, never from the snapshot that
holds the checkpoint's last batch on, nor from the one a downstream Iceberg-source stream has read up to
(:func:`maintain_iceberg_table`).

Every table of a stream (its sink, dead-letter and fan-out tables) is maintained while holding the stream's lock,
so no run commits meanwhile; a running stream is waited for. The run log's own tables take no lock: their writers
merge with retries. Each stream's maintenance is a row of the run log (kind ``maintenance``).

    python -m sluice maintain [--stream NAME ...] [--vacuum-retention-hours N] [--dry-run]
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.constants import CommitInfo, RunStatus
from sluice.errors import SluiceError
from sluice.paths import Roots, join
from sluice.storage import runlog
from sluice.storage.object_lock import waiting_lock
from sluice.times import iso_utc

if TYPE_CHECKING:
    from sluice.catalog import Catalog
    from sluice.kinds.iceberg import IcebergSink
    from sluice.model.stream import SourceSpec, StreamSpec
    from sluice.storage.iceberg import IcebergTableFormat

log = logging.getLogger(__name__)

# Delta's defaults for the two retentions, when a table does not set them.
DEFAULT_DELETED_FILE_RETENTION_HOURS = 168
DEFAULT_LOG_RETENTION_HOURS = 30 * 24
# The longest retention anyone may ask for: ten years.
MAX_RETENTION_HOURS = 24 * 3650
DEFAULT_LOCK_WAIT_SECONDS = 600
_INTERVAL_UNITS = {"microsecond": 1e-6 / 3600, "millisecond": 1e-3 / 3600, "second": 1 / 3600, "minute": 1 / 60,
                   "hour": 1, "day": 24, "week": 168}


class MaintenanceError(SluiceError):
    """A maintenance request was refused; nothing was changed."""


@dataclass
class TableReport:
    """What maintenance did to one table."""

    table: str
    role: str
    version_before: int | None = None
    version_after: int | None = None
    files_before: int = 0
    files_after: int = 0
    compacted_files_removed: int = 0
    compacted_files_added: int = 0
    vacuumed_files: int = 0
    vacuum_retention_hours: float | None = None
    checkpoint_version: int | None = None
    log_cleaned: bool = False
    snapshots_expired: int = 0
    skipped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Reader:
    """A catalog stream that reads a table as its Delta source: the first version it has not read yet."""

    stream: str
    next_version: int


@dataclass(frozen=True)
class IcebergReader:
    """A catalog stream that reads an Iceberg table as its source: the snapshot its checkpoint has read the table up
    to (-1: none yet; it reads the table's whole history)."""

    stream: str
    snapshot_id: int


def retention_hours(configured: str | None, default: float) -> float:
    """A Delta retention property (``interval 7 days``, ``168 hours``) in hours; ``default`` when unset."""
    if not configured:
        return default
    words = configured.strip().lower().removeprefix("interval").split()
    if len(words) != 2:
        raise MaintenanceError(f"cannot read the Delta retention {configured!r}; expected 'interval <n> <unit>'")
    unit = words[1].removesuffix("s")
    if unit not in _INTERVAL_UNITS:
        raise MaintenanceError(f"cannot read the Delta retention {configured!r}: unknown unit {words[1]!r}")
    try:
        return float(words[0]) * _INTERVAL_UNITS[unit]
    except ValueError:
        raise MaintenanceError(f"cannot read the Delta retention {configured!r}: {words[0]!r} is not a number") \
            from None


def check_retention(requested: float | None, configured: float, *, table: str) -> float:
    """The vacuum retention to use: the table's ``configured`` one unless more is ``requested``; less is refused."""
    if requested is None:
        return configured
    if not 0 <= requested <= MAX_RETENTION_HOURS:
        raise MaintenanceError(f"vacuum_retention_hours: expected 0 to {MAX_RETENTION_HOURS}, got {requested}")
    if requested < configured:
        raise MaintenanceError(
            f"vacuum_retention_hours: {requested:g} hours is under the retention of {table} "
            f"(delta.deletedFileRetentionDuration: {configured:g} hours). A vacuum that short would delete files "
            "that a reader or a stream on an older version still needs; nothing was changed. Lower the table's "
            "delta.deletedFileRetentionDuration first if that is really what you want")
    return requested


def _reading_streams(catalog: Catalog, roots: Roots, table: str, reads: Callable[[SourceSpec], bool]
                     ) -> Iterator[tuple[StreamSpec, list[Any]]]:
    """The catalog streams whose source or joined source ``reads`` the table, with the source offsets of their last
    committed batch (none when they have committed none)."""
    from sluice.storage.checkpoint import CheckpointError, CheckpointReader

    for stream in catalog:
        sources = [stream.source, *([stream.patterns.join.source] if stream.patterns.join else [])]
        if not any(reads(source) for source in sources):
            continue
        reader = CheckpointReader(stream.checkpoint_path(roots))
        try:
            commits = reader.commit_ids() if reader.exists else []
            offsets = reader.read_offsets(commits[-1]).sources if commits else []
        except CheckpointError as exc:
            raise MaintenanceError(f"stream '{stream.name}' reads {table}, and its checkpoint cannot be read ({exc}); "
                                   "run its health check first") from exc
        yield stream, offsets


def readers_of(table: str, catalog: Catalog, roots: Roots) -> list[Reader]:
    """The catalog streams that read the Delta table at ``table`` (resolved under the lake root) as their source or
    their joined source, with the first version each has not read. A stream that has not committed a batch yet
    reads from its ``startingVersion`` (0 by default)."""
    from sluice.kinds.delta import delta_next_version

    readers = []
    for stream, offsets in _reading_streams(
            catalog, roots, table, lambda source: source.table is not None and join(roots.lake, source.table) == table):
        # A joined or stateful stream records several sources; the oldest Delta offset among them is the safe one.
        versions = [delta_next_version(offset) for offset in offsets
                    if isinstance(offset, dict) and ("version" in offset or "reservoirVersion" in offset)]
        start = str(stream.source.options.get("startingVersion", "0"))
        if versions:
            readers.append(Reader(stream.name, min(versions)))
        elif start != "latest" and "startingTimestamp" not in stream.source.options:
            readers.append(Reader(stream.name, int(start) if start.isdigit() else 0))
    return readers


def iceberg_readers_of(sink: IcebergSink, catalog: Catalog, roots: Roots) -> list[IcebergReader]:
    """The catalog streams that read the Iceberg table of ``sink`` (the same identifier in the same catalog) as
    their source or their joined source, with the snapshot each has read up to: the offset of its last committed
    batch (a batch planned and not committed is read again from there)."""
    from sluice.kinds.iceberg import IcebergSource

    readers: list[IcebergReader] = []
    for stream, offsets in _reading_streams(
            catalog, roots, sink.identifier, lambda source: isinstance(source, IcebergSource)
            and source.identifier == sink.identifier and source.catalog == sink.catalog):
        read = [int(offset["snapshot"]) for offset in offsets if isinstance(offset, dict) and "snapshot" in offset]
        # A joined stream records an offset per source; each is kept (another table's id matches no snapshot here).
        readers += [IcebergReader(stream.name, snapshot) for snapshot in read or [-1]]
    return readers


def _behind(readers: Sequence[Reader], commit_times: dict[int, float], cutoff: float) -> list[str]:
    """The readers with an unread version committed before ``cutoff``: the files or commits of those versions are
    what a vacuum or a log cleanup with that cutoff may delete."""
    return [reader.stream for reader in readers
            if reader.next_version in commit_times and commit_times[reader.next_version] < cutoff]


def maintain_table(path: str, role: str, *, readers: Sequence[Reader] = (), vacuum_retention: float | None = None,
                   dry_run: bool = False, run_id: str | None = None, stream: str | None = None) -> TableReport:
    """Compact, vacuum, checkpoint and clean one Delta table (see the module's description). A missing table is
    reported as skipped."""
    from deltalake import CommitProperties, PostCommitHookProperties
    from deltalake.exceptions import TableNotFoundError

    from sluice.storage.delta import open_table

    report = TableReport(table=path, role=role)
    try:
        table = open_table(path)
    except TableNotFoundError:
        report.skipped.append("no table yet")
        return report
    configuration = table.metadata().configuration
    vacuum_hours = check_retention(vacuum_retention, retention_hours(
        configuration.get("delta.deletedFileRetentionDuration"), DEFAULT_DELETED_FILE_RETENTION_HOURS), table=path)
    log_hours = retention_hours(configuration.get("delta.logRetentionDuration"), DEFAULT_LOG_RETENTION_HOURS)
    report.version_before = table.version()
    report.files_before = len(table.file_uris())
    report.vacuum_retention_hours = vacuum_hours
    commit = CommitProperties(custom_metadata={CommitInfo.MAINTENANCE: run_id or "", **(
        {CommitInfo.STREAM: stream} if stream else {})})
    if dry_run:
        report.skipped.append("dry run: nothing changed")
        report.vacuumed_files = len(table.vacuum(retention_hours=math.ceil(vacuum_hours), dry_run=True, full=True))
        report.version_after, report.files_after = report.version_before, report.files_before
        return report

    # The log is cleaned below, under the rule for readers, not by delta-rs's hook after each of these commits.
    hooks = PostCommitHookProperties(cleanup_expired_logs=False)
    metrics = table.optimize.compact(commit_properties=commit, post_commithook_properties=hooks)
    report.compacted_files_removed = int(metrics.get("numFilesRemoved", 0))
    report.compacted_files_added = int(metrics.get("numFilesAdded", 0))
    table.update_incremental()

    now = time.time()
    commit_times = {int(entry["version"]): int(entry["timestamp"]) / 1000 for entry in table.history()} \
        if readers else {}
    behind = _behind(readers, commit_times, now - vacuum_hours * 3600)
    if behind:
        report.skipped.append(f"vacuum: {', '.join(behind)} still has versions to read older than the retention "
                              f"({vacuum_hours:g} hours); run it first")
    else:
        report.vacuumed_files = len(table.vacuum(retention_hours=math.ceil(vacuum_hours), dry_run=False, full=True,
                                                 commit_properties=commit, post_commithook_properties=hooks))
    table.update_incremental()
    table.create_checkpoint()
    report.checkpoint_version = table.version()
    behind = _behind(readers, commit_times, now - log_hours * 3600)
    if behind:
        report.skipped.append(f"log cleanup: {', '.join(behind)} still has versions to read older than the log "
                              f"retention ({log_hours:g} hours)")
    else:
        table.cleanup_metadata()
        report.log_cleaned = True
    report.version_after = table.version()
    report.files_after = len(table.file_uris())
    return report


def maintain_iceberg_table(table: IcebergTableFormat, role: str, *, checkpoint: str,
                           vacuum_retention: float | None = None, dry_run: bool = False,
                           now: float | None = None, run_id: str | None = None, stream: str | None = None,
                           readers: Sequence[IcebergReader] = ()) -> TableReport:
    """Compact an Iceberg table's small data files, expire its old snapshots and remove its orphan data files, under
    the retention a Delta vacuum keeps (the table's ``history.expire.max-snapshot-age-ms``, else 7 days; less is
    refused), and never a snapshot from the one that holds the checkpoint's last recorded batch on
    (:func:`sluice.storage.iceberg.expire_snapshots`), nor from the one a downstream Iceberg-source stream has read
    up to (``readers``) on: that stream's next run reads the snapshots after it. The compaction rewrites, per
    partition, the files under the table's ``write.target-file-size-bytes`` into files of that size, in one
    ``replace`` snapshot (:mod:`sluice.storage.iceberg_compaction`). A missing table is reported as skipped."""
    from sluice.storage.checkpoint import CheckpointReader, read_query_id
    from sluice.storage.iceberg import MAX_SNAPSHOT_AGE, expire_snapshots, remove_orphan_files
    from sluice.storage.iceberg_compaction import commit_rewrite, rewrite_small_files

    report = TableReport(table=table.name, role=role)
    if not table.exists():
        report.skipped.append("no table yet")
        return report
    iceberg = table.table()
    configured = iceberg.properties.get(MAX_SNAPSHOT_AGE)
    hours = check_retention(vacuum_retention, int(configured) / 3_600_000 if configured else
                            DEFAULT_DELETED_FILE_RETENTION_HOURS, table=table.name)
    commits = CheckpointReader(checkpoint).commit_ids()
    cutoff = (now or time.time()) - hours * 3600
    report.vacuum_retention_hours = hours
    report.version_before = len(iceberg.metadata.snapshots)
    report.files_before = iceberg.inspect.data_files().num_rows
    if dry_run:
        report.skipped.append("dry run: nothing changed")
    rewrite = rewrite_small_files(table, dry_run=dry_run)
    report.compacted_files_removed, report.compacted_files_added = len(rewrite.removed), len(rewrite.added)
    if not dry_run:
        commit_rewrite(table, rewrite, {CommitInfo.MAINTENANCE: run_id or "", **(
            {CommitInfo.STREAM: stream} if stream else {})})
    # A reader holds back the snapshots from the one it has read up to on that the retention alone would expire.
    current = iceberg.current_snapshot()
    taken = {snapshot.snapshot_id: snapshot.timestamp_ms / 1000 for snapshot in iceberg.snapshots()
             if current is None or snapshot.snapshot_id != current.snapshot_id}
    behind = [reader.stream for reader in readers
              if any(taken.get(reader.snapshot_id, -math.inf) <= at < cutoff for at in taken.values())
              and (reader.snapshot_id == -1 or reader.snapshot_id in taken)]
    if behind:
        report.skipped.append(f"expiry: {', '.join(dict.fromkeys(behind))} still has snapshots to read older than "
                              f"the retention ({hours:g} hours); they are kept until it has run")
    report.snapshots_expired = len(expire_snapshots(table, older_than=cutoff, query_id=read_query_id(checkpoint),
                                                    last_batch=commits[-1] if commits else None,
                                                    read_up_to=[reader.snapshot_id for reader in readers],
                                                    dry_run=dry_run))
    report.vacuumed_files = len(remove_orphan_files(table, older_than=cutoff, dry_run=dry_run))
    iceberg = table.table()
    report.version_after = len(iceberg.metadata.snapshots)
    report.files_after = iceberg.inspect.data_files().num_rows
    return report


def maintain_stream(stream: StreamSpec, catalog: Catalog, roots: Roots, *, run_id: str,
                    vacuum_retention_hours: float | None = None, dry_run: bool = False,
                    lock_wait_seconds: float = DEFAULT_LOCK_WAIT_SECONDS, now: float | None = None
                    ) -> list[TableReport]:
    """Maintain every table of ``stream`` while holding its lock, and log it in the run log: an Iceberg sink
    and its Iceberg fan-out tables through :func:`maintain_iceberg_table` (``now`` ages its snapshots), its Delta
    tables through
    :func:`maintain_table`."""
    from sluice.kinds import sink_kind, sink_table_format
    from sluice.kinds.iceberg import IcebergSink
    from sluice.storage.iceberg import IcebergTableFormat

    started = time.time()
    reports: list[TableReport] = []
    try:
        with waiting_lock(stream.checkpoint_path(roots), stream.name, f"maintenance/{run_id}", lock_wait_seconds):
            sink = sink_table_format(stream, roots) if stream.sink.table is None else None
            if isinstance(sink, IcebergTableFormat):
                assert isinstance(stream.sink, IcebergSink)
                owned = [("sink", sink, stream.sink)] + [
                    (f"fan_out[{index}]", table, stream.sink.fan_out_sink(stream.patterns.fan_out[index]))
                    for index, table in sink_kind(stream.sink).fan_out_formats(stream, roots)]
                for role, iceberg, spec in owned:
                    assert isinstance(iceberg, IcebergTableFormat)
                    reports.append(maintain_iceberg_table(iceberg, role, checkpoint=stream.checkpoint_path(roots),
                                                          vacuum_retention=vacuum_retention_hours, dry_run=dry_run,
                                                          now=now, run_id=run_id, stream=stream.name,
                                                          readers=iceberg_readers_of(spec, catalog, roots)))
            for table in stream.tables(roots):
                readers = readers_of(table.path, catalog, roots)
                reports.append(maintain_table(table.path, str(table.role), readers=readers,
                                              vacuum_retention=vacuum_retention_hours, dry_run=dry_run,
                                              run_id=run_id, stream=stream.name))
    except Exception as exc:
        if not dry_run:
            runlog.log_operation(roots.lake, stream=stream.name, run_id=run_id, kind="maintenance", started=started,
                                 status=RunStatus.FAILED, error=str(exc),
                                 note={"tables": [report.to_dict() for report in reports]})
        raise
    if not dry_run:
        runlog.log_operation(roots.lake, stream=stream.name, run_id=run_id, kind="maintenance", started=started,
                             status=RunStatus.SUCCEEDED, error=None,
                             note={"tables": [report.to_dict() for report in reports]})
    return reports


def maintain_run_log(roots: Roots, *, run_id: str, vacuum_retention_hours: float | None = None,
                     dry_run: bool = False) -> list[TableReport]:
    """Maintain the run log's tables. Runs merge into them with retries, so no lock is taken: a run that commits
    during the compaction retries on its version, and a compaction that loses is left to the next maintenance."""
    from deltalake.exceptions import CommitFailedError

    reports = []
    for name in (runlog.RUNS_TABLE, runlog.BATCHES_TABLE):
        try:
            reports.append(maintain_table(join(roots.lake, name), "run_log", run_id=run_id,
                                          vacuum_retention=vacuum_retention_hours, dry_run=dry_run))
        except CommitFailedError as exc:
            report = TableReport(table=join(roots.lake, name), role="run_log")
            report.skipped.append(f"a run committed meanwhile; left to the next maintenance ({exc})")
            reports.append(report)
    return reports


def maintain(catalog: Catalog, roots: Roots, streams: Sequence[str] = (), *,
             vacuum_retention_hours: float | None = None, dry_run: bool = False,
             run_id: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Maintain the named streams' tables (every stream's when none is named) and the run log's: the report of each
    table, by stream (``_sluice`` for the run log)."""
    run_id = run_id or f"maintenance-{iso_utc(time.time())}-{uuid.uuid4().hex[:8]}"
    selected = catalog.select(list(streams)) if streams else list(catalog)
    done: dict[str, list[dict[str, Any]]] = {}
    for stream in selected:
        reports = maintain_stream(stream, catalog, roots, run_id=run_id, vacuum_retention_hours=vacuum_retention_hours,
                                  dry_run=dry_run)
        done[stream.name] = [report.to_dict() for report in reports]
    if not streams:
        done["_sluice"] = [report.to_dict() for report in maintain_run_log(
            roots, run_id=run_id, vacuum_retention_hours=vacuum_retention_hours, dry_run=dry_run)]
    return done
