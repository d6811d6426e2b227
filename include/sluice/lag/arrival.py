"""When new data has arrived for a stream, and when it is time to start a run for it: the logic of the arrival
watcher (:class:`sluice_airflow.triggers.StreamArrivalTrigger`), without Airflow and without a clock of its own.

What is unread comes from the source kind's lag probe (:attr:`~sluice.kinds.base.Backlog.arrivals`: a file's
path, a partition's end offset, a table's version), so the watcher needs no JVM and no state of its own: what a
committed batch read leaves the backlog, and a member of it that the watcher has not announced yet is new data.
A triggerer that restarts has announced nothing, so it starts a run for a backlog it finds (a run reads nothing
twice: the checkpoint decides what a run reads, never the watcher).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sluice.model.stream import ArrivalSpec, StreamSpec
from sluice.paths import Roots


def unread(stream: StreamSpec, roots: Roots, *, queue_credentials: Mapping[str, str] | None = None
           ) -> frozenset[str]:
    """The stream's unread data by identity, as its source kind's lag probe sees it (no JVM); for a stream with
    ``source.notifications``, as its notification queue and journal tell it, without a listing
    (:func:`sluice.storage.notified.watch_unread`; ``queue_credentials``: its queue connection's, read on the
    triggerer)."""
    from sluice.kinds import source_kind
    from sluice.storage.checkpoint import CheckpointReader

    if getattr(stream.source, "notifications", None) is not None:
        from sluice.storage.notified import watch_unread

        return watch_unread(stream, roots, credentials=queue_credentials)
    reader = CheckpointReader(stream.checkpoint_path(roots))
    return source_kind(stream.source).backlog(stream, roots, reader).arrivals


def local_folder(stream: StreamSpec, roots: Roots) -> Path | None:
    """The local landing folder whose changes the watcher may await instead of sleeping until its next look (the
    OS tells of a file when it lands): a files source on a local path, without ``source.notifications`` (whose
    queue says what landed). None for any other source; the folder may not exist yet."""
    from sluice.constants import SourceType
    from sluice.storage.store import is_local

    if stream.source.type is not SourceType.FILES or getattr(stream.source, "notifications", None) is not None:
        return None
    place = stream.source_path(roots)
    if not is_local(place):
        return None
    return Path(place.removeprefix("file://"))


@dataclass(frozen=True)
class Arrival:
    """New data a run should start for: how many unread items the last run start did not cover, and how long the
    first of them waited for this start (what the debounce cost)."""

    new: int
    waited_seconds: float
    examples: tuple[str, ...]


@dataclass
class ArrivalWatch:
    """The debounce of one stream's watcher. :meth:`look` takes what is unread at ``now`` (seconds on a monotonic
    clock) and says when a run should start: once nothing newer came for ``settle`` seconds (a burst is one run),
    or ``max_wait`` seconds after the first new item at the latest (a steady trickle still runs), and never within
    ``min_interval`` of the previous start."""

    spec: ArrivalSpec
    announced: frozenset[str] = frozenset()
    _seen: frozenset[str] = frozenset()
    _first_new_at: float | None = None
    _last_change_at: float | None = None
    _started_at: float | None = None

    def look(self, unread_now: frozenset[str], now: float) -> Arrival | None:
        # What a committed batch read has left the backlog and cannot come back (a path is read once, offsets and
        # versions only grow): forget it, so the announced set stays the size of the backlog.
        self.announced &= unread_now
        new = unread_now - self.announced
        if not new:
            self._first_new_at = self._last_change_at = None
            self._seen = unread_now
            return None
        if self._first_new_at is None or self._last_change_at is None:
            self._first_new_at = self._last_change_at = now
        elif unread_now - self._seen:
            self._last_change_at = now
        self._seen = unread_now
        if not self._due(now):
            return None
        arrival = Arrival(new=len(new), waited_seconds=now - self._first_new_at, examples=tuple(sorted(new)[:5]))
        self.announced = unread_now
        self._first_new_at = self._last_change_at = None
        self._started_at = now
        return arrival

    def _due(self, now: float) -> bool:
        assert self._first_new_at is not None and self._last_change_at is not None
        if self._started_at is not None and now - self._started_at < self.spec.min_interval_seconds:
            return False
        return (now - self._last_change_at >= self.spec.settle_seconds
                or now - self._first_new_at >= self.spec.max_wait_seconds)

    def next_look_in(self, now: float) -> float:
        """Seconds until the next look: the poll interval, or sooner when new data's settle time ends first (so a
        run starts on time, not up to a poll late)."""
        wait = float(self.spec.poll_seconds)
        if self._first_new_at is not None and self._last_change_at is not None:
            due = min(self._last_change_at + self.spec.settle_seconds, self._first_new_at + self.spec.max_wait_seconds)
            if self._started_at is not None:
                due = max(due, self._started_at + self.spec.min_interval_seconds)
            wait = min(wait, max(due - now, 0.0))
        return wait
