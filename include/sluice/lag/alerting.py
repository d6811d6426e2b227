"""The alert policy of the lag monitor: when a status change is worth a message, and what the message says.

No repeats: while a stream's status stays the same (or improves without reaching OK) nothing is sent, unless a
reminder interval is set. A worse status is an escalation (WARN -> CRITICAL -> STOPPED); the return to OK is a
resolve message. The last alert of each stream and channel (log, webhook, email) is kept in the lag store, and is
saved only after the message went out on that channel, so a failed delivery is tried again on the next tick and
the channels that worked do not repeat it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from sluice.catalog import Catalog
from sluice.constants import AlertChannel
from sluice.lag.observe import LagReport, LagStatus, check, error_report
from sluice.lag.store import AlertState, LagStore
from sluice.model.stream import StreamSpec
from sluice.paths import Roots
from sluice.times import iso_utc


class AlertKind(str, Enum):
    FIRING = "FIRING"
    ESCALATED = "ESCALATED"
    REMINDER = "REMINDER"
    RESOLVED = "RESOLVED"


@dataclass(frozen=True)
class Alert:
    """One message about one stream."""

    kind: AlertKind
    report: LagReport
    previous: LagStatus | None
    since: float

    @property
    def stream(self) -> str:
        return self.report.stream

    @property
    def status(self) -> LagStatus:
        return self.report.status

    @property
    def title(self) -> str:
        if self.kind is AlertKind.RESOLVED:
            return f"[Sluice] RESOLVED: stream {self.stream} is back to OK (was {_value(self.previous)})"
        change = f" (was {self.previous.value})" if self.kind is AlertKind.ESCALATED and self.previous else ""
        return f"[Sluice] {self.status.value}: stream {self.stream}{change}"

    def text(self) -> str:
        observation = self.report.observation
        backlog = observation.backlog
        lines = [self.title]
        lines += [f"- {reason}" for reason in self.report.reasons]
        measures = [f"{value} {name}" for name, value in (("files", backlog.files), ("bytes", backlog.bytes),
                                                          ("records", backlog.records)) if value is not None]
        lines.append("backlog: " + (", ".join(measures) or "none measured")
                     + (f"; oldest unread {_duration(observation.lag_seconds)} old" if observation.lag_seconds
                        else ""))
        if observation.last_commit_at is not None:
            lines.append(f"last commit: batch {observation.last_batch_id} at {_iso(observation.last_commit_at)} "
                         f"({_duration(observation.seconds_since_last_commit)} ago)")
        else:
            lines.append("last commit: none yet")
        if observation.newest_event_time:
            lines.append(f"newest processed event: {observation.newest_event_time}")
        if self.kind is AlertKind.RESOLVED:
            lines.append(f"out of OK for {_duration(observation.observed_at - self.since)}")
        return "\n".join(lines)

    def payload(self) -> dict[str, Any]:
        """A JSON body that Slack and Teams incoming webhooks take (``text``), with the details beside it."""
        return {"text": self.text(), "sluice": {"kind": self.kind.value, "stream": self.stream,
                                                "status": self.status.value, "previous": _value(self.previous),
                                                "since": _iso(self.since), "report": self.report.to_dict()}}


def _value(status: LagStatus | None) -> str:
    return status.value if status else "unknown"


def _iso(seconds: float) -> str:
    return iso_utc(seconds, timespec="seconds")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def decide(previous: AlertState | None, report: LagReport, *, channel: str = AlertChannel.LOG,
           repeat_after_seconds: float | None = None, ok_streak: int = 1,
           resolve_after: int = 1) -> tuple[Alert | None, AlertState | None]:
    """The alert a channel should send for a new report, and the state to keep once it is sent (None: keep the
    old). A better status that is not OK sends nothing, but is kept, so that a return to the worse one escalates
    again. A resolve waits until ``ok_streak`` (OK observations in a row, this one included) reaches
    ``resolve_after``."""
    now = report.observation.observed_at
    status = report.status
    was = previous.status if previous else LagStatus.OK
    if was is LagStatus.OK:
        if status is LagStatus.OK:
            return None, None
        return Alert(AlertKind.FIRING, report, was, now), AlertState(report.stream, channel, status, now, now)
    assert previous is not None
    if status is LagStatus.OK:
        if ok_streak < resolve_after:
            return None, None
        return (Alert(AlertKind.RESOLVED, report, was, previous.since),
                AlertState(report.stream, channel, LagStatus.OK, now, now))
    if status.rank > was.rank:
        return (Alert(AlertKind.ESCALATED, report, was, previous.since),
                AlertState(report.stream, channel, status, previous.since, now))
    if repeat_after_seconds is not None and now - previous.notified_at >= repeat_after_seconds:
        return (Alert(AlertKind.REMINDER, report, was, previous.since),
                AlertState(report.stream, channel, status, previous.since, now))
    if status is not was:
        return None, AlertState(report.stream, channel, status, previous.since, previous.notified_at)
    return None, None


def monitor_tick(streams: Catalog | Sequence[StreamSpec], roots: Roots, store: LagStore, *,
                 now: float | None = None) -> list[LagReport]:
    """Observe every stream and record the observations. A stream whose lag cannot be measured gets an ERROR
    report, and the others are still observed."""
    now = now if now is not None else time.time()
    reports = []
    for stream in streams:
        try:
            history = store.observations(stream.name, limit=stream.alerts.stall_observations)
            report = check(stream, roots, history=history, now=now)
        except Exception as exc:  # one broken stream must not silence the monitor for the others
            report = error_report(stream, exc, now=now)
        store.record(report)
        reports.append(report)
    return reports
