"""The lag history: every observation of every stream, with its status, and what each stream's alert last said.

A small SQLite file, by default ``<checkpoint root>/_sluice/lag.sqlite`` or ``SLUICE_LAG_DB``, with SQLite's
rollback journal (WAL needs shared memory, which a shared volume does not give). Observations older than the
retention (default 31 days, ``SLUICE_LAG_RETENTION_DAYS``) are deleted as new ones are recorded. The STALLED rule
reads the last observations back; the status view and the monitor show the trend.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import printable
from sluice.lag.observe import LagObservation, LagReport, LagStatus, check
from sluice.model.stream import StreamSpec
from sluice.paths import Roots
from sluice.storage.store import is_local

log = logging.getLogger(__name__)
# The Streams page charts 30 days.
DEFAULT_RETENTION_DAYS = 31.0
_SCHEMA = """
CREATE TABLE IF NOT EXISTS observations (
    stream TEXT NOT NULL,
    observed_at REAL NOT NULL,
    status TEXT NOT NULL,
    files INTEGER,
    bytes INTEGER,
    records INTEGER,
    lag_seconds REAL,
    last_batch_id INTEGER,
    report TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS observations_by_stream ON observations (stream, observed_at);
CREATE INDEX IF NOT EXISTS observations_by_time ON observations (observed_at);
CREATE TABLE IF NOT EXISTS alert_channel_state (
    stream TEXT NOT NULL,
    channel TEXT NOT NULL,
    status TEXT NOT NULL,
    since REAL NOT NULL,
    notified_at REAL NOT NULL,
    PRIMARY KEY (stream, channel)
);
"""


@dataclass(frozen=True)
class AlertState:
    """What a channel's last alert of a stream said: the status it reported, since when the stream has been out of
    OK, and when the alert was sent."""

    stream: str
    channel: str
    status: LagStatus
    since: float
    notified_at: float


def default_path(roots: Roots) -> str:
    """``SLUICE_LAG_DB``, else ``_sluice/lag.sqlite`` under a local checkpoint root. SQLite needs a local file: with
    a checkpoint root on an object store, the history is ``$AIRFLOW_HOME/sluice/lag.sqlite`` (set SLUICE_LAG_DB to
    share one between workers)."""
    if os.environ.get("SLUICE_LAG_DB"):
        return os.environ["SLUICE_LAG_DB"]
    if is_local(roots.checkpoints):
        return os.path.join(roots.checkpoints.removeprefix("file://"), "_sluice", "lag.sqlite")
    home = os.environ.get("AIRFLOW_HOME") or os.path.join(os.path.expanduser("~"), "airflow")
    return os.path.join(home, "sluice", "lag.sqlite")


class LagStore:
    """Reads and writes the lag history; each call is one short transaction."""

    def __init__(self, path: str | os.PathLike[str], *, retention_days: float | None = None) -> None:
        self.path = Path(path)
        self.retention_days = retention_days if retention_days is not None else float(
            os.environ.get("SLUICE_LAG_RETENTION_DAYS", DEFAULT_RETENTION_DAYS))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(_SCHEMA)

    @classmethod
    def for_roots(cls, roots: Roots) -> LagStore:
        return cls(default_path(roots))

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30)
        try:
            with db:
                yield db
        finally:
            db.close()

    def record(self, report: LagReport) -> None:
        """Keep one observation, and drop what is older than the retention."""
        observation = report.observation
        with self._connect() as db:
            db.execute(
                "INSERT INTO observations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (report.stream, observation.observed_at, report.status.value, observation.backlog.files,
                 observation.backlog.bytes, observation.backlog.records, observation.lag_seconds,
                 observation.last_batch_id, json.dumps(report.to_dict(), default=str)),
            )
            db.execute("DELETE FROM observations WHERE observed_at < ?",
                       (observation.observed_at - self.retention_days * 86400,))

    def history(self, stream: str, *, limit: int = 50) -> list[LagReport]:
        """The stream's last observations, oldest first."""
        with self._connect() as db:
            rows = db.execute("SELECT rowid, report FROM observations WHERE stream = ? ORDER BY observed_at DESC "
                              "LIMIT ?", (stream, limit)).fetchall()
        reports = []
        for rowid, text in reversed(rows):
            try:
                reports.append(_report(stream, text))
            except (TypeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
                # One bad row must not take the stream's status, and the page of every stream, with it.
                log.warning("lag history %s: row %s of stream %s skipped: %s", self.path, rowid, printable(stream),
                            printable(str(exc))[:200])
        return reports

    def observations(self, stream: str, *, limit: int = 50) -> list[LagObservation]:
        return [report.observation for report in self.history(stream, limit=limit)]

    def ok_streak(self, stream: str, *, limit: int = 100) -> int:
        """How many of the stream's latest observations in a row are OK."""
        with self._connect() as db:
            rows = db.execute("SELECT status FROM observations WHERE stream = ? ORDER BY observed_at DESC LIMIT ?",
                              (stream, limit)).fetchall()
        return next((index for index, (status,) in enumerate(rows) if status != LagStatus.OK.value), len(rows))

    def count(self, stream: str | None = None) -> int:
        with self._connect() as db:
            query, args = ("SELECT COUNT(*) FROM observations WHERE stream = ?", (stream,)) if stream else (
                "SELECT COUNT(*) FROM observations", ())
            return int(db.execute(query, args).fetchone()[0])

    def alert_state(self, stream: str, channel: str) -> AlertState | None:
        with self._connect() as db:
            row = db.execute("SELECT stream, channel, status, since, notified_at FROM alert_channel_state "
                             "WHERE stream = ? AND channel = ?", (stream, channel)).fetchone()
        if row is None:
            return None
        stream_name, channel_name, stored_status, since, notified_at = row
        status = LagStatus.read(stored_status)
        if status is None or not all(isinstance(value, (int, float)) and math.isfinite(value)
                                     for value in (since, notified_at)):
            log.warning("lag history %s: the alert state of stream %s on %s is not one Sluice writes; it is ignored",
                        self.path, printable(stream), printable(channel))
            return None
        return AlertState(stream_name, channel_name, status, float(since), float(notified_at))

    def save_alert_state(self, state: AlertState) -> None:
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO alert_channel_state VALUES (?, ?, ?, ?, ?)",
                       (state.stream, state.channel, state.status.value, state.since, state.notified_at))


def _report(stream: str, text: object) -> LagReport:
    """A row's report, checked field by field (:meth:`LagReport.from_dict`), and of the stream it is filed under."""
    if not isinstance(text, str):
        raise TypeError(f"report: expected JSON text, found {type(text).__name__}")
    report = LagReport.from_dict(json.loads(text))
    if report.stream != stream:
        raise ValueError(f"stream: the report is of {report.stream!r}")
    return report


def recorded_history(roots: Roots, stream: str, *, limit: int) -> list[LagReport]:
    """A stream's last recorded reports, oldest first; none when there is no lag history yet (nothing is created)."""
    path = default_path(roots)
    return LagStore(path).history(stream, limit=limit) if os.path.exists(path) else []


def check_against_history(stream: StreamSpec, roots: Roots, *, now: float | None = None) -> LagReport:
    """A stream's lag report, with STALLED judged against the recorded history; records nothing (sensors)."""
    history = recorded_history(roots, stream.name, limit=stream.alerts.stall_observations)
    return check(stream, roots, history=[seen.observation for seen in history], now=now)
