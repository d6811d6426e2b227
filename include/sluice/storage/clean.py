"""The landing zone's lifecycle (``source.clean``): archive or delete the files a stream has read, once they are old
enough, so that a landing zone (and the listing every run makes of it) stays the size of its recent data.

A file is touched only when all of these hold, each read from the stream's own checkpoint and the listing:

- a **committed** batch read it: its source-log entry's batch is at or below the last commit (a planned batch that
  never committed is read again by the next run, so its files stay);
- it is the **same file** the batch read: its modification time is the one the source log recorded (a file written
  again under the same name since is left alone: Spark will not read it, and it is not Sluice's to delete);
- it is older than ``after`` (by its modification time);
- no **unfinished backfill** of the stream has it in its frozen plan (a retry of that backfill reads exactly those
  files). A backfill marks its own folder done when it succeeds.

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


@dataclass
class CleanReport:
    """What one clean did: files archived or deleted, and those it left (read but younger than ``after``; named by
    an unfinished backfill; changed since they were read)."""

    archived: int = 0
    deleted: int = 0
    waiting: int = 0
    held: int = 0
    changed: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"archived": self.archived, "deleted": self.deleted, "waiting": self.waiting, "held": self.held,
                "changed": self.changed}


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
    state = SourceState.of(stream, CheckpointReader(stream.checkpoint_path(roots)))
    if state.last_commit < 0:
        return report
    older_than = (time.time() if now is None else now) - clean.after_seconds
    held = backfill_held(stream, roots)
    source = stream.source_path(roots).rstrip("/")
    base = folder(source)
    local_root = os.path.abspath(source.removeprefix("file://")) if is_local(source) else None
    archive: Folder | None = (folder(join(roots.landing, clean.archive_to))
                              if clean.action is CleanAction.ARCHIVE else None)
    for found in list_source_files(stream, roots):
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
        if archive is not None:
            base.move(relative, archive)
            report.archived += 1
        else:
            base.delete(relative)
            report.deleted += 1
        if after_each is not None:
            after_each()
    return report
