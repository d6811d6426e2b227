"""The landing zone's lifecycle (``source.clean``): archive or delete the files a stream has read, once they are old
enough, so that a landing zone (and the listing every run makes of it) stays the size of its recent data.

A file is touched only when all of these hold, each read from the stream's own checkpoint and the listing (or,
for a notified landing zone, a look at the file by its name):

- a **committed** batch read it: its source-log entry's batch is at or below the last commit (a planned batch that
  never committed is read again by the next run, so its files stay);
- it is the **same file** the batch read: its modification time is the one the source log recorded (a file written
  again under the same name since is left alone: Spark will not read it, and it is not Sluice's to delete);
- it is older than ``after`` (by its modification time);
- no **unfinished backfill** of the stream has it in its frozen plan (a retry of that backfill reads exactly those
  files). A backfill marks its own folder done when it succeeds.

A landing zone told of its files by notifications (``source.notifications``) is not listed: the candidates are the
files the source log names, of the committed batches after the last one whose files are all done (a mark beside the
checkpoint), and each is looked up by its name before it is touched (:func:`_clean_by_source_log`).

The clean runs on the driver after each successful run of the stream, under the stream's lock (so no backfill runs
meanwhile: backfills take the same lock). Each file is one move (a rename on a disk and on a store that has them)
or one delete: a kill part-way leaves some files cleaned and the rest where they were, and the next clean finishes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from sluice.constants import CleanAction
from sluice.limits import SOURCE_LOG_MAX_BYTES
from sluice.model.stream import StreamSpec
from sluice.paths import Roots, join
from sluice.storage.checkpoint import CheckpointReader
from sluice.storage.landing import SourceState, list_source_files
from sluice.storage.store import Folder, folder, is_local

#: The folder under the checkpoint root that holds each backfill's own checkpoint and frozen plan.
BACKFILL_ROOT = "_backfill"
#: The file a backfill writes into its own folder once it succeeded: its plan no longer holds files back.
BACKFILL_DONE = "done"
#: Under a notified stream's checkpoint: the batch through which every file read is cleaned, changed or gone.
CLEANED = "sluice/cleaned.json"


@dataclass
class CleanReport:
    """What one clean did: files archived or deleted, and those it left (read but younger than ``after``; named by
    an unfinished backfill; changed since they were read)."""

    archived: int = 0
    deleted: int = 0
    waiting: int = 0
    held: int = 0
    changed: int = 0
    # Entries of the file source log dropped because Spark drops them anyway (:func:`_prune_source_log`).
    log_pruned: int = 0
    # Folders of a landing zone on a disk left empty, removed (:func:`_remove_empty_folders`).
    folders_removed: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"archived": self.archived, "deleted": self.deleted, "waiting": self.waiting, "held": self.held,
                "changed": self.changed, "log_pruned": self.log_pruned, "folders_removed": self.folders_removed}


def backfill_held(stream: StreamSpec, roots: Roots) -> set[str]:
    """The files of every frozen backfill plan of the stream that is not marked done."""
    backfills = folder(join(roots.checkpoints, f"{BACKFILL_ROOT}/{stream.name}"))
    held: set[str] = set()
    if not backfills.is_dir():
        return held
    for entry in backfills.entries():
        own = backfills.child(entry.name)
        if own.exists(BACKFILL_DONE) or not own.exists("plan.json"):
            continue
        plan = json.loads(own.read_bounded_text("plan.json", SOURCE_LOG_MAX_BYTES))
        held.update(str(found["path"]) for found in plan.get("files", []))
    return held


def clean_landing(stream: StreamSpec, roots: Roots, *, now: float | None = None,
                  after_each: Callable[[], None] | None = None) -> CleanReport | None:
    """Archive or delete the stream's landing files that committed batches read and ``after`` has passed over; None
    for a stream without ``source.clean``. Run it with the stream's lock held. ``after_each`` is called after each
    file is cleaned (the kill tests stop a clean part-way there)."""
    clean = getattr(stream.source, "clean", None)
    if clean is None:
        return None
    report = CleanReport()
    reader = CheckpointReader(stream.checkpoint_path(roots))
    state = SourceState.of(stream, reader)
    if state.last_commit < 0:
        return report
    older_than = (time.time() if now is None else now) - clean.after_seconds
    held = backfill_held(stream, roots)
    source = stream.source_path(roots).rstrip("/")
    base = folder(source)
    local_root = os.path.abspath(source.removeprefix("file://")) if is_local(source) else None
    archive: Folder | None = (folder(join(roots.landing, clean.archive_to))
                              if clean.action is CleanAction.ARCHIVE else None)
    if getattr(stream.source, "notifications", None) is not None:
        report, done_through = _clean_by_source_log(stream, roots, state, older_than=older_than, held=held,
                                                    archive=archive, after_each=after_each)
        report.log_pruned = _prune_source_log(reader, state, done_through, gone=lambda path: True)
        return report
    left: set[str] = set()  # the listed files still there after this clean
    for found in list_source_files(stream, roots):
        left.add(found.path)
        entry = state.entry(found.path)
        if entry is None or entry.batch_id > state.last_commit:
            continue  # unread, or read by a batch that has not committed
        if abs(entry.timestamp_ms - found.modified * 1000) >= 1000:
            report.changed += 1
            continue
        if found.modified >= older_than:
            report.waiting += 1
            continue
        if found.path in held:
            report.held += 1
            continue
        relative = os.path.relpath(found.path, local_root) if local_root else found.path[len(source) + 1:]
        _take(base, relative, archive, report, after_each)
        left.discard(found.path)
    report.log_pruned = _prune_source_log(reader, state, state.last_commit, gone=lambda path: path not in left)
    if local_root is not None:
        report.folders_removed = _remove_empty_folders(local_root, older_than)
    return report


def _remove_empty_folders(root: str, older_than: float) -> int:
    """Remove the folders under ``root`` (never ``root`` itself) that are empty and have not changed since
    ``older_than``, deepest first; how many. A landing zone on a disk is usually laid out by day or hour, and the
    clean empties those folders one after another: left there, every run lists them all, and past Spark's
    ``parallelPartitionDiscovery.threshold`` (32 paths) that listing becomes a Spark job of its own (0.2 s of a
    one-file run after five weeks of day folders, measured). A folder that changed within ``after`` may be one a
    producer has just made and is about to write into, so it stays; ``rmdir`` itself removes only an empty
    folder. Hidden folders (``_temporary``, ``.staging``: Spark does not list them either) are a producer's own.
    Object stores have no folders to remove."""
    changed: dict[str, float] = {}  # each folder's time as found: removing a child changes its parent's
    for path, folders, _ in os.walk(root):
        folders[:] = [name for name in folders if not name.startswith(("_", "."))]
        changed[path] = os.stat(path).st_mtime
    removed = 0
    for folder_path in sorted(changed, key=len, reverse=True):  # a folder after everything under it
        if folder_path == root or changed[folder_path] >= older_than:
            continue
        try:
            os.rmdir(folder_path)  # refused unless empty: a folder whose own folders stay stays too
        except OSError:  # written into meanwhile, or removed by someone else
            continue
        removed += 1
    return removed


#: A pruned entry is this much older than Spark's horizon at least: a margin for how each side rounds a duration.
PRUNE_MARGIN_MS = 3_600_000
#: The source log is rewritten once this many of its entries can go (a few hundred bytes each), not at every run.
PRUNE_AT_LEAST = 100


def _prune_source_log(reader: CheckpointReader, state: SourceState, through_batch: int, *,
                      gone: Callable[[str], bool]) -> int:
    """Keep a cleaned stream's file source log the size of Spark's ``maxFileAge`` horizon (7 days by default), not
    of its whole history: Spark reads every entry at each query start, and Sluice at each clean and lag probe (a run
    after 10,000 one-file runs spent measurably more there, docs/performance/benchmarks.md). An entry goes when Spark
    itself forgets it when a query starts (older than the newest entry less ``maxFileAge``, with
    :data:`PRUNE_MARGIN_MS` to spare), its batch committed at or before ``through_batch`` (whose files this clean
    and the earlier ones are done with), and its file ``gone`` from the landing zone (cleaned). Spark then reads no
    file it would not have read with the entry there, and a file it read is never read again: it is gone, and had
    it come back under its name, Spark, behind the horizon, would not read it either way (see
    :meth:`~sluice.storage.checkpoint.CheckpointReader.prune_file_source_log`). Nothing goes without a horizon
    (``latestFirst`` with a per-trigger limit reads files of any age)."""
    if state.horizon is None or state.file_name_only:
        return 0
    before_ms = int(state.horizon * 1000) - PRUNE_MARGIN_MS
    candidates = sum(1 for path, entry in state.recorded.items()
                     if entry.batch_id <= through_batch and entry.timestamp_ms < before_ms and gone(path))
    if candidates < PRUNE_AT_LEAST:
        return 0
    return reader.prune_file_source_log(through_batch=through_batch, before_ms=before_ms, gone=gone)


def _take(base: Folder, relative: str, archive: Folder | None, report: CleanReport,
          after_each: Callable[[], None] | None) -> None:
    """Archive (move) or delete one file, and count it."""
    if archive is not None:
        base.move(relative, archive)
        report.archived += 1
    else:
        base.delete(relative)
        report.deleted += 1
    if after_each is not None:
        after_each()


def _clean_by_source_log(stream: StreamSpec, roots: Roots, state: SourceState, *, older_than: float, held: set[str],
                         archive: Folder | None, after_each: Callable[[], None] | None) -> tuple[CleanReport, int]:
    """The clean of a landing zone told of its files by notifications, which lists nothing: its candidates are the
    files the source log names, of the committed batches after the one through which all is done (kept in
    :data:`CLEANED`), so that a clean's requests follow the files it cleans, not the files ever read. Whether a file
    is old enough is read from the time the source log recorded; each one old enough is looked up by its name (one
    request: is it still the file the batch read?) before it is moved or deleted. A file that is gone counts as
    done (an earlier clean that was killed before it moved the mark), one changed since is left alone, once. Also
    returns the batch through which all is done."""
    report = CleanReport()
    source = stream.source_path(roots).rstrip("/")
    base = folder(source)
    marks = folder(stream.checkpoint_path(roots)).child(*CLEANED.split("/")[:-1])
    mark_name = CLEANED.rsplit("/", 1)[-1]
    through = int(json.loads(marks.read_text(mark_name))["through_batch"]) if marks.exists(mark_name) else -1
    files = CheckpointReader(stream.checkpoint_path(roots)).file_source_files()
    candidates = sorted((entry.batch_id, path, entry.timestamp_ms) for path, entry in files.items()
                        if through < entry.batch_id <= state.last_commit and path.startswith(source + "/"))
    blocked: int | None = None  # the first batch with a file left for a later clean
    for batch_id, path, recorded_ms in candidates:
        if recorded_ms / 1000 >= older_than:
            report.waiting += 1
        elif path in held:
            report.held += 1
        else:
            relative = path[len(source) + 1:]
            found = base.stat(relative)
            if found is None:
                continue  # cleaned by an earlier clean, or removed by hand
            if abs(recorded_ms - found.modified * 1000) >= 1000:
                report.changed += 1
                continue
            _take(base, relative, archive, report, after_each)
            continue
        blocked = batch_id if blocked is None else min(blocked, batch_id)
    done_through = state.last_commit if blocked is None else blocked - 1
    if done_through > through:
        marks.write_bytes(mark_name, json.dumps({"through_batch": done_through}).encode("utf-8"))
    return report, max(done_through, through)
