"""Compaction of an Iceberg table without a JVM: its small data files rewritten into fewer, partition by partition, and
committed as one ``replace`` snapshot (the same rows in new files).

pyiceberg 0.12 has no ``rewrite_data_files``. The rewrite is the one a backfill's replace already does: each small
file's rows read by pyiceberg's Arrow reader, written again by Sluice's writer in the table's partition spec
(:func:`sluice.storage.iceberg_files.write_data_files`). The commit is pyiceberg's own overwrite producer, whose
snapshot says ``replace`` instead of ``overwrite``: pyiceberg offers no ``replace`` producer, and its summary
update refuses the operation (``update_snapshot_summaries`` takes append, overwrite and delete), so the summary is
computed as an overwrite's (the totals: the same records, fewer files) and then named ``replace``. That operation is
what Iceberg readers skip: Sluice's Iceberg source (:func:`sluice.storage.iceberg_snapshots.check_readable`) and
Spark's Iceberg source pass over a ``replace`` silently, where an ``overwrite`` would stop them.

The rewrite is two steps, :func:`rewrite_small_files` (the new files written, nothing committed) and
:func:`commit_rewrite` (one snapshot): a process killed between them leaves the table as it was, and the files it
wrote are orphans that :func:`sluice.storage.iceberg.remove_orphan_files` deletes once older than the retention.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.errors import SluiceError

if TYPE_CHECKING:
    from sluice.storage.iceberg import IcebergTableFormat

# Iceberg's table property for the size of the files a writer makes: the compaction's target, as Delta's OPTIMIZE
# takes delta.targetFileSize. pyiceberg's default when unset: 512 MiB.
TARGET_FILE_SIZE = "write.target-file-size-bytes"


@dataclass
class Rewrite:
    """A compaction planned and written, not yet committed: the small files it removes and the files it wrote."""

    removed: list[Any] = field(default_factory=list)
    added: list[Any] = field(default_factory=list)
    rows: int = 0
    # The snapshot the files were read from: the commit refuses a table that has moved on since.
    snapshot_id: int | None = None


def target_file_size(table: IcebergTableFormat) -> int:
    """The table's target file size in bytes (``write.target-file-size-bytes``, else pyiceberg's default)."""
    from pyiceberg.table import TableProperties

    configured = table.table().properties.get(TARGET_FILE_SIZE)
    try:
        return int(configured) if configured else TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT
    except ValueError:
        raise SluiceError(f"{table.name}: {TARGET_FILE_SIZE} is {configured!r}, not a number of bytes") from None


def small_file_groups(table: IcebergTableFormat, target_bytes: int) -> list[list[Any]]:
    """The scan tasks of the current snapshot's small data files (smaller than ``target_bytes``), grouped by
    partition and bin-packed into groups of at most ``target_bytes``: each group of two files or more becomes one
    rewrite. Files of an older partition spec and files with delete files are left alone (a rewrite would have to
    carry their deletes)."""
    iceberg = table.table()
    if iceberg.current_snapshot() is None:
        return []
    spec_id = iceberg.spec().spec_id
    by_partition: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for task in iceberg.scan().plan_files():
        data_file = task.file
        if data_file.spec_id != spec_id or task.delete_files or data_file.file_size_in_bytes >= target_bytes:
            continue
        by_partition[tuple(data_file.partition)].append(task)
    groups: list[list[Any]] = []
    for tasks in by_partition.values():
        bins: list[list[Any]] = []
        sizes: list[int] = []
        # First fit, largest first: few bins, none over the target.
        for task in sorted(tasks, key=lambda task: -task.file.file_size_in_bytes):
            size = task.file.file_size_in_bytes
            fits = next((index for index, used in enumerate(sizes) if used + size <= target_bytes), None)
            if fits is None:
                bins.append([task])
                sizes.append(size)
            else:
                bins[fits].append(task)
                sizes[fits] += size
        groups += [group for group in bins if len(group) > 1]
    return groups


def rewrite_small_files(table: IcebergTableFormat, *, target_bytes: int | None = None,
                        dry_run: bool = False) -> Rewrite:
    """Write the rows of each group of small files (:func:`small_file_groups`) as new data files of the same
    partition, by Sluice's writer; nothing is committed (:func:`commit_rewrite`). Under ``dry_run`` nothing is
    written either: the rewrite lists the files it would remove."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    from sluice.storage.iceberg_files import write_data_files

    iceberg = table.table()
    target = target_bytes if target_bytes is not None else target_file_size(table)
    current = iceberg.current_snapshot()
    rewrite = Rewrite(snapshot_id=None if current is None else current.snapshot_id)
    schema = iceberg.metadata.schema()
    for group in small_file_groups(table, target):
        rewrite.removed += [task.file for task in group]
        rewrite.rows += sum(int(task.file.record_count) for task in group)
        if dry_run:
            continue
        rows = ArrowScan(table_metadata=iceberg.metadata, io=iceberg.io, projected_schema=schema,
                         row_filter=AlwaysTrue()).to_table(tasks=group)
        if rows.num_rows != sum(int(task.file.record_count) for task in group):
            raise SluiceError(f"{table.name}: the small files read {rows.num_rows} rows, their manifests say "
                              f"{sum(int(task.file.record_count) for task in group)}; nothing was committed")
        rewrite.added += write_data_files(iceberg.metadata, iceberg.io, rows)
    return rewrite


def commit_rewrite(table: IcebergTableFormat, rewrite: Rewrite, properties: dict[str, str]) -> int | None:
    """Commit a rewrite as one ``replace`` snapshot carrying ``properties``: its files removed, the new ones added.
    The id of the snapshot; None (and no snapshot) when it rewrites nothing. A table that has moved on since the
    rewrite read it is refused, the new files deleted: its small files may be gone."""
    from pyiceberg.table.snapshots import Operation

    from sluice.storage.iceberg_files import delete_files

    if not rewrite.removed:
        return None
    iceberg = table.table()
    current = iceberg.current_snapshot()
    if current is None or current.snapshot_id != rewrite.snapshot_id:
        delete_files(iceberg.io, rewrite.added)
        raise SluiceError(f"{table.name} has a new snapshot since its compaction read it; nothing was committed, "
                          "run maintenance again")
    added = sum(int(data_file.record_count) for data_file in rewrite.added)
    if added != rewrite.rows:
        delete_files(iceberg.io, rewrite.added)
        raise SluiceError(f"{table.name}: the compaction wrote {added} rows for {rewrite.rows}; nothing was "
                          "committed")
    with iceberg.transaction() as transaction, \
            _replace_files()(operation=Operation.OVERWRITE, transaction=transaction, io=iceberg.io,
                             snapshot_properties=properties) as replace:
        for data_file in rewrite.removed:
            replace.delete_data_file(data_file)
        for data_file in rewrite.added:
            replace.append_data_file(data_file)
        snapshot_id = int(replace.snapshot_id)
    return snapshot_id


def _replace_files() -> Any:
    """pyiceberg's overwrite producer whose snapshot is a ``replace`` (defined on first use: pyiceberg is imported
    only where a table is)."""
    global _ReplaceFiles
    if _ReplaceFiles is None:
        from pyiceberg.table.snapshots import Operation, Summary
        from pyiceberg.table.update.snapshot import _OverwriteFiles

        class ReplaceFiles(_OverwriteFiles):
            """Files removed and added, the rows unchanged: a ``replace`` snapshot, its totals an overwrite's."""

            def _summary(self, snapshot_properties: Any = None) -> Summary:
                summary = super()._summary(snapshot_properties or {})
                return Summary(Operation.REPLACE, **summary.additional_properties)

        _ReplaceFiles = ReplaceFiles
    return _ReplaceFiles


_ReplaceFiles: Any = None
