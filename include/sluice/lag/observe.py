"""How far behind a stream is, from its source and its checkpoint alone: plain files, delta-rs or pyiceberg and a
Kafka client, no JVM, cheap enough for a sensor to run every minute.

Between two availableNow runs no query is running, so Spark has no progress to report, and Spark does not commit
offsets to Kafka, so consumer-group lag tools (Burrow) cannot see it. The backlog is therefore computed the way the
next run will see it:

- files: the landing-zone files that the checkpoint's source log does not hold and that are inside the stream's
  ``maxFileAge`` horizon (see :mod:`sluice.storage.landing`); their count, bytes and the oldest one's time;
- Kafka: each partition's end offset from the broker minus the offset of the last committed batch, with partitions
  that are new since the checkpoint counted from their earliest offset;
- Delta: the table versions after the last one processed, with the bytes and records they add.

The status follows Burrow's evaluation rules, applied to checkpoints (worst first):

- STOPPED: there is a backlog and no commit for longer than ``alerts.stale_after_seconds``;
- CRITICAL / WARN: a backlog measure (records, files, bytes, seconds) at or above its catalog threshold;
- STALLED: over the last ``alerts.stall_observations`` observations the backlog only grew, and nothing committed;
- OK.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from sluice.constants import FileFormat, SchemaEvolution, SinkMode, SourceType
from sluice.kinds import Backlog, sink_table_format, source_kind
from sluice.kinds.delta import DeltaSink
from sluice.model.stream import AlertSpec, StreamSpec
from sluice.paths import Roots
from sluice.storage.checkpoint import CheckpointError, CheckpointReader
from sluice.times import iso_utc

log = logging.getLogger(__name__)


class LagStatus(str, Enum):
    """A stream's lag status; members are in order of severity."""

    OK = "OK"
    WARN = "WARN"
    STALLED = "STALLED"
    CRITICAL = "CRITICAL"
    STOPPED = "STOPPED"
    # The lag could not be measured (an unreadable checkpoint, a bad option, an unreachable broker).
    ERROR = "ERROR"

    @property
    def rank(self) -> int:
        return list(LagStatus).index(self)

    @classmethod
    def read(cls, value: object) -> LagStatus | None:
        """The status a stored value names; None for anything else (a row of the lag history is data)."""
        return next((status for status in cls if status.value == value), None)


@dataclass
class LagObservation:
    """One measurement of one stream: the backlog, the last commit, and the newest processed event time."""

    stream: str
    source_type: str
    observed_at: float
    backlog: Backlog
    last_batch_id: int | None = None
    last_commit_at: float | None = None
    newest_event_time: str | None = None

    @property
    def seconds_since_last_commit(self) -> float | None:
        return None if self.last_commit_at is None else max(self.observed_at - self.last_commit_at, 0.0)

    @property
    def lag_seconds(self) -> float | None:
        """The age of the oldest unread data; 0 without a backlog; None where the source cannot tell."""
        if self.backlog.empty:
            return 0.0
        if self.backlog.oldest_unread_at is None:
            return None
        return max(self.observed_at - self.backlog.oldest_unread_at, 0.0)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["backlog"]["arrivals"]  # the watcher's, not the report's: a landing zone's every unread path
        data["seconds_since_last_commit"] = _rounded(self.seconds_since_last_commit)
        data["lag_seconds"] = _rounded(self.lag_seconds)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LagObservation:
        """An observation as :meth:`to_dict` wrote it; :class:`ValueError` naming the first field of another type
        (the lag history is a file that others can write: a row must not become markup or a crash)."""
        backlog = _typed(data, "backlog", dict)
        values = {name: _typed(data, name, kind, optional=name not in _REQUIRED) for name, kind in _FIELDS.items()}
        counts = {name: _typed(backlog, name, kind, optional=True, where="backlog.")
                  for name, kind in _BACKLOG_FIELDS.items()}
        partitions = _typed(backlog, "partitions", dict, optional=True, where="backlog.") or {}
        if not all(isinstance(key, str) and _is(value, int) for key, value in partitions.items()):
            raise ValueError("backlog.partitions: expected partition names and integer counts")
        return cls(backlog=Backlog(**counts, partitions=dict(partitions), new_partitions=_strings(
            backlog, "new_partitions", where="backlog."), notes=_strings(backlog, "notes", where="backlog.")), **values)


@dataclass
class LagReport:
    """An observation with its status and the reasons for it."""

    observation: LagObservation
    status: LagStatus
    reasons: list[str] = field(default_factory=list)

    @property
    def stream(self) -> str:
        return self.observation.stream

    def to_dict(self) -> dict[str, Any]:
        return {"stream": self.stream, "status": self.status.value, "reasons": list(self.reasons),
                **{k: v for k, v in self.observation.to_dict().items() if k != "stream"}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LagReport:
        """A report as :meth:`to_dict` wrote it; :class:`ValueError` naming the first bad field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"expected a JSON object, found {type(data).__name__}")
        status = LagStatus.read(data.get("status"))
        if status is None:
            raise ValueError(f"status: {str(data.get('status'))[:40]!r} is no lag status")
        return cls(LagObservation.from_dict(data), status, _strings(data, "reasons"))

    def describe(self) -> str:
        return f"stream '{self.stream}' is {self.status.value}" + (f": {'; '.join(self.reasons)}" if self.reasons
                                                                     else "")


# The types of a recorded observation's fields: a number is an int or a float, never a bool (JSON's true is not 1).
_FIELDS: dict[str, type | tuple[type, ...]] = {"stream": str, "source_type": str, "observed_at": (int, float),
                                                "last_batch_id": int, "last_commit_at": (int, float),
                                                "newest_event_time": str}
_REQUIRED = {"stream", "source_type", "observed_at"}
_BACKLOG_FIELDS: dict[str, type | tuple[type, ...]] = {"files": int, "bytes": int, "records": int, "versions": int,
                                                        "oldest_unread_at": (int, float)}


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool) and (
        not isinstance(value, float) or math.isfinite(value))


def _typed(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...], *, optional: bool = False,
           where: str = "") -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if not _is(value, kind):
        raise ValueError(f"{where}{name}: expected {getattr(kind, '__name__', 'a number')}, found "
                         f"{type(value).__name__}")
    return value


def _strings(data: Mapping[str, Any], name: str, *, where: str = "") -> list[str]:
    values = data.get(name) or []
    if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
        raise ValueError(f"{where}{name}: expected a list of strings")
    return list(values)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


# --- one stream ------------------------------------------------------------------------------------------------


def newest_event_time(stream: StreamSpec, roots: Roots, reader: CheckpointReader) -> str | None:
    """The event time of the newest processed data: the stream's watermark where it has one, else the largest
    event time in the sink's file statistics (the catalog's ``backfill.event_time_column``)."""
    commits = reader.commit_ids()
    if commits:
        try:
            watermark = int(reader.read_offsets(commits[-1]).metadata.get("batchWatermarkMs", 0))
        except CheckpointError:
            watermark = 0
        if watermark > 0:
            return iso_utc(watermark / 1000)
    column = stream.backfill.event_time_column
    table = None if column is None else sink_table_format(stream, roots)
    if column is None or table is None:  # a Kafka sink has no table to read statistics from
        return None
    newest = table.newest_value(column)
    return None if newest is None else newest.isoformat()


def unread_bytes(stream: StreamSpec, roots: Roots) -> int | None:
    """The bytes the stream's next run will read, as its lag probe measures them; None when the source cannot tell
    (a Kafka topic's records have no size before they are read), without asking it."""
    kind = source_kind(stream.source)
    if not kind.measures_bytes:
        return None
    return kind.backlog(stream, roots, CheckpointReader(stream.checkpoint_path(roots))).bytes


def text_append(stream: StreamSpec) -> bool:
    """A stream whose work its unread bytes measure: text files (JSON, CSV) appended to a Delta table without a
    join, and without adding columns (Parquet's and a Delta source's bytes are compressed and may grow many times in
    memory; a merge reads its table, a join its other side; ``add_new_columns`` types its new columns with Spark jobs
    over each batch). The shape of the small-run paths, which only the rs engine has."""
    source, sink = stream.source, stream.sink
    return (source.type is SourceType.FILES and source.format in (FileFormat.JSON, FileFormat.CSV)
            and source.schema_evolution is not SchemaEvolution.ADD_NEW_COLUMNS and stream.patterns.join is None
            and isinstance(sink, DeltaSink) and sink.mode is SinkMode.APPEND)


def auto_takes_rs(stream: StreamSpec) -> bool:
    """Whether ``engine: auto`` means rs for the stream even where delta-spark's jars load: a stream that runs on
    arrival (``arrival``) and has the small-run shape (:func:`text_append`). Its runs are small and their latency is
    the point: a one-file arrival run took 10.7 s cold and 4.5 s warm from landing to commit on rs, 24.2 s and
    9.3 s on the JVM's writer (bench/bench_arrival.py, docs/guides/scheduling.md), whose first commit in a fresh
    JVM costs most of that. Every other stream keeps the JVM's writer where it loads."""
    return stream.arrival is not None and text_append(stream)


def text_append_backlog(stream: StreamSpec, roots: Roots) -> int | None:
    """The unread bytes of a stream whose work they measure (:func:`text_append`). None for any other stream, for a
    landing zone told of its files by notifications (its backlog counts queued messages, whose bytes no one knows
    before a drain), and when the probe fails (logged). The paths that suit small runs only (the driver's write
    path, the driver's light JIT) are chosen by it."""
    if not text_append(stream) or getattr(stream.source, "notifications", None) is not None:
        return None
    try:
        return unread_bytes(stream, roots)
    except Exception as exc:  # the probe only picks a path, and every path is correct
        log.warning("stream %s: cannot measure the unread input (%s); it takes the paths of a large run",
                    stream.name, exc)
        return None


def observe(stream: StreamSpec, roots: Roots, *, now: float | None = None) -> LagObservation:
    """Measure one stream now."""
    reader = CheckpointReader(stream.checkpoint_path(roots))
    backlog = source_kind(stream.source).backlog(stream, roots, reader)
    commits = reader.commit_ids()
    return LagObservation(
        stream=stream.name,
        source_type=stream.source.type.value,
        observed_at=now if now is not None else time.time(),
        backlog=backlog,
        last_batch_id=commits[-1] if commits else None,
        last_commit_at=reader.commit_time(commits[-1]) if commits else None,
        newest_event_time=newest_event_time(stream, roots, reader),
    )


def evaluate(observation: LagObservation, alerts: AlertSpec,
             history: Sequence[LagObservation] = ()) -> LagReport:
    """The status of an observation, given the stream's thresholds and its earlier observations (oldest first)."""
    report = LagReport(observation, LagStatus.OK)

    def raise_to(status: LagStatus, reason: str) -> None:
        report.reasons.append(f"{status.value}: {reason}")
        if status.rank > report.status.rank:
            report.status = status

    backlog = observation.backlog
    measures = (("records", backlog.records), ("files", backlog.files), ("bytes", backlog.bytes),
                ("seconds", _rounded(observation.lag_seconds)))
    for measure, value in measures:
        if value is None:
            continue
        critical, warn = getattr(alerts, f"critical_{measure}"), getattr(alerts, f"warn_{measure}")
        if critical is not None and value >= critical:
            raise_to(LagStatus.CRITICAL, f"{value:,.0f} {measure} behind (critical at {critical:,})")
        elif warn is not None and value >= warn:
            raise_to(LagStatus.WARN, f"{value:,.0f} {measure} behind (warn at {warn:,})")

    window = [*history[-(alerts.stall_observations - 1):], observation]
    growth = _growth(window) if len(window) == alerts.stall_observations else None
    if growth is not None:
        raise_to(LagStatus.STALLED, f"the backlog grew from {growth[0]} to {growth[1]} over {len(window)} "
                 f"observations ({_span(window)}) while no batch committed")

    stale_after = alerts.stale_after_seconds
    since_commit, lag = observation.seconds_since_last_commit, observation.lag_seconds
    if (stale_after is not None and not backlog.empty and (since_commit is None or since_commit > stale_after)
            and (lag is None or lag > stale_after)):
        last = "no batch ever committed" if since_commit is None else f"no commit for {since_commit:.0f}s"
        raise_to(LagStatus.STOPPED, f"{last} (stopped after {stale_after}s) while data waits; check that the "
                 "stream's DAG is unpaused and its runs succeed")
    return report


def _growth(window: Sequence[LagObservation]) -> tuple[int, int] | None:
    """(first, last) backlog of a window in which the backlog never shrank, grew overall, and nothing committed."""
    units = [seen.backlog.units for seen in window]
    if len({seen.last_batch_id for seen in window}) != 1:
        return None
    counts = [value for value in units if value is not None]
    if len(counts) != len(units) or counts[-1] <= counts[0]:
        return None
    if any(later < earlier for earlier, later in itertools.pairwise(counts)):
        return None
    return counts[0], counts[-1]


def _span(window: Sequence[LagObservation]) -> str:
    return f"{window[-1].observed_at - window[0].observed_at:.0f}s"


def check(stream: StreamSpec, roots: Roots, *, history: Sequence[LagObservation] = (),
          now: float | None = None) -> LagReport:
    """Observe and evaluate one stream."""
    return evaluate(observe(stream, roots, now=now), stream.alerts, history)


def error_report(stream: StreamSpec, error: Exception, *, now: float | None = None) -> LagReport:
    """The report of a stream whose lag could not be measured: an ERROR, so that it is alerted on, not hidden."""
    observation = LagObservation(stream.name, stream.source.type.value, now if now is not None else time.time(),
                                 Backlog(notes=[f"{type(error).__name__}: {error}"]))
    return LagReport(observation, LagStatus.ERROR, [f"ERROR: the lag could not be measured: {error}"])
