"""How far behind a stream is, from its source and its checkpoint alone: plain files, delta-rs and a Kafka client,
no JVM, cheap enough for a sensor to run every minute.

Between two availableNow runs no query is running, so Spark has no progress to report, and Spark does not commit
offsets to Kafka, so consumer-group lag tools (Burrow) cannot see it. The backlog is therefore computed the way the
next run will see it:

- files: the landing-zone files that the checkpoint's source log does not hold and that are inside the stream's
  ``maxFileAge`` horizon (see :mod:`sluice.source_files`); their count, bytes and the oldest one's time;
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
import json
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from sluice.catalog import AlertSpec, StreamSpec
from sluice.checkpoint import CheckpointError, CheckpointReader
from sluice.constants import SourceType
from sluice.errors import SluiceError
from sluice.paths import Roots, require_local
from sluice.source_files import SourceState, unread_files


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


@dataclass
class Backlog:
    """What the stream's source holds that its checkpoint has not processed. A measure the source type cannot
    tell is None: files for Kafka, records for files."""

    files: int | None = None
    bytes: int | None = None
    records: int | None = None
    versions: int | None = None
    oldest_unread_at: float | None = None
    partitions: dict[str, int] = field(default_factory=dict)
    new_partitions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def units(self) -> int | None:
        """The count the trend rules follow: records where known, else files, else versions."""
        for value in (self.records, self.files, self.versions):
            if value is not None:
                return value
        return None

    @property
    def empty(self) -> bool:
        return not any((self.files, self.records, self.versions, self.bytes))


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
        data["seconds_since_last_commit"] = _rounded(self.seconds_since_last_commit)
        data["lag_seconds"] = _rounded(self.lag_seconds)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LagObservation:
        names = {name for name in cls.__dataclass_fields__ if name != "backlog"}
        backlog_names = set(Backlog.__dataclass_fields__)
        return cls(backlog=Backlog(**{k: v for k, v in data["backlog"].items() if k in backlog_names}),
                   **{k: v for k, v in data.items() if k in names})


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
        return cls(LagObservation.from_dict(data), LagStatus(data["status"]), list(data.get("reasons", [])))

    def describe(self) -> str:
        return f"stream '{self.stream}' is {self.status.value}" + (f": {'; '.join(self.reasons)}" if self.reasons
                                                                     else "")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def iso_utc(seconds: float, *, timespec: str = "auto") -> str:
    """Seconds since the epoch as an ISO 8601 UTC time."""
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec=timespec)


# --- files ---------------------------------------------------------------------------------------------------


def file_backlog(stream: StreamSpec, roots: Roots, reader: CheckpointReader) -> Backlog:
    """Files (and their bytes) the next run will read, and when the oldest of them was written."""
    unread = unread_files(stream, roots, SourceState.of(stream, reader))
    backlog = Backlog(files=len(unread.files), bytes=sum(f.size for f in unread.files),
                      oldest_unread_at=min((f.modified for f in unread.files), default=None))
    if unread.behind_horizon:
        backlog.notes.append(f"{unread.behind_horizon} file(s) are older than the stream's maxFileAge horizon and "
                             "will never be read by it; backfill them (mode append) if they belong in the table")
    return backlog


# --- Kafka ---------------------------------------------------------------------------------------------------

Watermarks = Mapping[tuple[str, int], tuple[int, int]]


def kafka_backlog(processed: Mapping[str, Mapping[str, int]] | None, watermarks: Watermarks, *,
                  starting_offsets: str | Mapping[str, Mapping[str, int]] = "latest") -> Backlog:
    """Offsets behind per partition: the broker's end offset minus the checkpoint's, for every partition the
    broker has. ``processed`` is the Kafka source's offset JSON of the last committed batch (``{topic: {partition:
    next offset}}``, as in ``offsets/N``); ``watermarks`` maps (topic, partition) to the (earliest, end) offsets.

    Without a committed batch the first run starts at ``startingOffsets`` (Spark's default for a stream: latest,
    so nothing is behind; ``earliest``; or per-partition JSON where -2 is earliest and -1 latest). With one, a
    partition the checkpoint does not know is new, and Spark reads it from its earliest offset. A checkpoint offset
    below the earliest one means retention deleted data the stream never read; it counts from the earliest offset
    and is noted.
    """
    backlog = Backlog(records=0)
    total = 0
    for (topic, partition), (earliest, end) in sorted(watermarks.items()):
        key = f"{topic}:{partition}"
        if processed is None:
            offset = _starting_offset(starting_offsets, topic, partition, earliest, end)
        elif str(partition) in processed.get(topic, {}):
            offset = int(processed[topic][str(partition)])
        else:
            offset = earliest
            backlog.new_partitions.append(key)
        if offset < earliest:
            backlog.notes.append(f"{key}: offsets {offset}..{earliest - 1} were deleted by retention before the "
                                 "stream read them")
            offset = earliest
        backlog.partitions[key] = max(end - offset, 0)
        total += backlog.partitions[key]
    backlog.records = total
    return backlog


def _starting_offset(starting: str | Mapping[str, Mapping[str, int]], topic: str, partition: int, earliest: int,
                     end: int) -> int:
    if isinstance(starting, str):
        if starting not in ("earliest", "latest"):
            raise SluiceError(f"startingOffsets {starting!r}: expected earliest, latest or per-partition offsets")
        return earliest if starting == "earliest" else end
    offset = int(starting.get(topic, {}).get(str(partition), -1))
    return earliest if offset == -2 else end if offset == -1 else offset


def kafka_watermarks(config: Mapping[str, Any], *, topics: Sequence[str] = (), pattern: str | None = None,
                     timeout: float = 10.0) -> dict[tuple[str, int], tuple[int, int]]:
    """(earliest, end) offsets of every partition of the topics, or of the topics matching ``pattern``, from the
    broker (confluent-kafka). ``config`` is librdkafka configuration: ``bootstrap.servers`` and any security
    settings, from an Airflow connection."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"group.id": "sluice-lag-probe", "enable.auto.commit": False, **config})
    try:
        metadata = consumer.list_topics(timeout=timeout)
        wanted = [name for name in metadata.topics if (name in topics) or (pattern and re.fullmatch(pattern, name))]
        missing = [name for name in topics if name not in metadata.topics]
        if missing:
            raise SluiceError(f"Kafka topic(s) {', '.join(missing)} do not exist on {config.get('bootstrap.servers')}")
        marks = {}
        for name in wanted:
            for partition in metadata.topics[name].partitions:
                marks[(name, partition)] = consumer.get_watermark_offsets(TopicPartition(name, partition),
                                                                          timeout=timeout)
        return marks
    finally:
        consumer.close()


def processed_source_offset(reader: CheckpointReader, source: int = 0) -> Any:
    """The source's offset in ``offsets/<last committed batch>``: where the next run starts. None when nothing
    was committed."""
    commits = reader.commit_ids()
    if not commits:
        return None
    entry = reader.read_offsets(commits[-1])
    return entry.sources[source] if source < len(entry.sources) else None


# --- Delta ---------------------------------------------------------------------------------------------------


def delta_next_version(offset: Mapping[str, Any] | None) -> int:
    """The first table version a Delta source has not finished, from its checkpoint offset: delta-spark's
    ``{"reservoirVersion": v, "index": i, ...}`` (index -1: nothing of v read yet) or Sluice's ``{"version": v}``
    (v read)."""
    if not offset:
        return 0
    if "reservoirVersion" in offset:
        version = int(offset["reservoirVersion"])
        return version if int(offset.get("index", -1)) < 0 else version + 1
    if "version" in offset:
        return int(offset["version"]) + 1
    raise SluiceError(f"not a Delta source offset: {json.dumps(offset)[:200]}")


def delta_backlog(table_path: str, next_version: int) -> Backlog:
    """Versions of a Delta table from ``next_version`` on, with the bytes and records their data files add and the
    time of the oldest of them, read from the table's JSON commit files."""
    from deltalake import DeltaTable

    path = require_local(table_path, what="Delta source table")
    latest = DeltaTable(path).version()
    backlog = Backlog(versions=max(latest - next_version + 1, 0), bytes=0, records=0)
    for version in range(next_version, latest + 1):
        commit = os.path.join(path, "_delta_log", f"{version:020d}.json")
        try:
            with open(commit, encoding="utf-8") as handle:
                actions = [json.loads(line) for line in handle if line.strip()]
        except FileNotFoundError:
            backlog.notes.append(f"version {version}'s commit file was cleaned up; bytes and records are partial")
            continue
        for action in actions:
            add = action.get("add")
            if add and add.get("dataChange", True):
                backlog.bytes = (backlog.bytes or 0) + int(add.get("size", 0))
                stats = json.loads(add["stats"]) if add.get("stats") else {}
                backlog.records = (backlog.records or 0) + int(stats.get("numRecords", 0))
            info = action.get("commitInfo")
            if info and "timestamp" in info and backlog.oldest_unread_at is None:
                backlog.oldest_unread_at = int(info["timestamp"]) / 1000
    return backlog


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
    if column is None or not stream.sink.path:  # a Kafka sink has no table to read statistics from
        return None
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        actions = pa.table(DeltaTable(stream.sink_path(roots)).get_add_actions(flatten=True))
    except TableNotFoundError:
        return None
    if f"max.{column}" not in actions.column_names or actions.num_rows == 0:
        return None
    newest = pc.max(actions.column(f"max.{column}")).as_py()
    return None if newest is None else newest.isoformat()


def delta_source_backlog(stream: StreamSpec, roots: Roots, reader: CheckpointReader) -> Backlog:
    """The versions of a Delta-source stream's table that its next run reads."""
    from deltalake.exceptions import TableNotFoundError

    offset = processed_source_offset(reader)
    if offset is None:
        options = stream.source.options
        if options.get("startingVersion") == "latest" or "startingTimestamp" in options:
            return Backlog(versions=0, bytes=0, records=0, notes=["the first run starts at the table's latest "
                                                                  "version or a timestamp"])
        next_version = int(options.get("startingVersion", "0"))
    else:
        next_version = delta_next_version(offset)
    try:
        return delta_backlog(stream.source_path(roots), next_version)
    except TableNotFoundError:
        return Backlog(versions=0, bytes=0, records=0, notes=[f"the source table {stream.source.path} does not "
                                                               "exist yet"])


def kafka_source_backlog(stream: StreamSpec, roots: Roots, reader: CheckpointReader) -> Backlog:
    """The offsets a Kafka-source stream's next run reads: the checkpoint's offsets of the last committed batch
    against the brokers' watermarks, read with the stream's Airflow connection (its brokers and security)."""
    from sluice.kafka import DEFAULT_CONNECTION, client_config, connection_fields

    options = stream.source.options
    config = client_config(connection_fields(stream.source.connection or DEFAULT_CONNECTION))
    assigned: dict[str, list[int]] | None = json.loads(options["assign"]) if "assign" in options else None
    topics = list(assigned) if assigned is not None else [
        topic.strip() for topic in options.get("subscribe", "").split(",") if topic.strip()]
    marks = kafka_watermarks(config, topics=topics, pattern=options.get("subscribePattern"))
    if assigned is not None:
        marks = {key: mark for key, mark in marks.items() if key[1] in assigned.get(key[0], [])}
    starting = options.get("startingOffsets", "latest")
    return kafka_backlog(processed_source_offset(reader), marks,
                         starting_offsets=json.loads(starting) if starting.startswith("{") else starting)


BacklogProbe = Callable[[StreamSpec, Roots, CheckpointReader], Backlog]
# Source types whose backlog Sluice can measure.
PROBES: dict[SourceType, BacklogProbe] = {SourceType.FILES: file_backlog, SourceType.DELTA: delta_source_backlog,
                                          SourceType.KAFKA: kafka_source_backlog}


def observe(stream: StreamSpec, roots: Roots, *, now: float | None = None) -> LagObservation:
    """Measure one stream now."""
    reader = CheckpointReader(require_local(stream.checkpoint_path(roots), what=f"stream '{stream.name}': checkpoint"))
    probe = PROBES.get(stream.source.type)
    backlog = probe(stream, roots, reader) if probe else Backlog(
        notes=[f"a {stream.source.type.value} source has no backlog to measure"])
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
