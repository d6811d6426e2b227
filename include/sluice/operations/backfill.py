"""Backfills that understand streams: a request validated field by field, and the plan of what it reads and writes.

A backfill replays a slice of a stream's source into the stream's own Delta tables, with its own checkpoint, and
never touches the live stream's checkpoint. Planning is plain Python and delta-rs, no JVM, so that a bad request
fails in seconds and a dry run's file list costs nothing.

Which files a backfill may read:

- A file the live stream has recorded in its file-source log is the backfill's to re-read.
- A file the live stream has not recorded yet, but will read on its next run, is left to it: a backfill that read
  it too would write its rows twice. So is a file of a batch the live stream planned but never committed (its next
  run replays the batch). Both are reported as pending.
- A file the live stream will never read (its modification time is behind the stream's ``maxFileAge`` horizon,
  as with an archive restored with its old times) is the backfill's too.

Then ``select_by`` picks the slice: ``file_time`` takes the files modified in ``[start, end)`` and all their rows;
``event_time`` takes the rows whose event time is in ``[start, end)`` from every file modified at or after
``start`` minus the catalog's clock skew.

``replace`` swaps, in one commit per table, the target rows of the range *that came from the files read* for the
rows read again: ``<range> AND _source_file IN (<files>)``. Rows of files that were not read are never touched.
``append`` adds only files the tables do not hold yet, so running it twice adds nothing.

A Delta source is backfilled by a range of the upstream table's versions instead: ``start_version`` to
``end_version`` (both included), or ``select_by: commit_time`` with ``start`` and ``end``, the versions committed in
``[start, end)``. Only ``append``: the rows those versions added go through the stream's definition again (the plan
is :func:`sluice.operations.delta_range.plan_version_range`). ``replace`` is refused: the stream's table does not
record which upstream version a row came from, so no predicate could take exactly those rows out.

A Kafka source is backfilled by offsets: ``offsets`` (``{"<partition>": [first, last]}`` per partition, both
included), or ``select_by: timestamp`` with ``start`` and ``end``, resolved to offsets with Kafka's
offsets-for-times (:mod:`sluice.operations.kafka_range`). Each row keeps its record's coordinates
(``_source_file`` is ``kafka://<topic>/<partition>/<offset>``), so ``replace`` swaps out exactly the rows of those
offsets, and ``append`` reads only the offsets neither table holds yet.

A cdc stream (``sink.mode: cdc``) is backfilled through its own cdc writer, with the backfill's transaction ids on
the table and on its tombstones: its rows are changes, applied by key in ``sequence_by`` order, and a change no newer
than the key's row or remembered delete changes nothing, so re-applying a range is idempotent. ``append`` applies
the files of the range the tables hold nothing of; ``replace`` re-applies every file of the range. No cdc row is
swapped out by a predicate: a key's row (type 1) or versions (type 2) are the sum of changes from many files, and
the re-applied changes rebuild them (the dead letters of the files read are swapped, as for any stream).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from sluice.arguments import option_args
from sluice.catalog import Catalog
from sluice.constants import SOURCE_FILE_COLUMN, BackfillMode, SinkMode, SourceType
from sluice.errors import BackfillError, SluiceError, printable
from sluice.kinds import sink_kind, source_kind
from sluice.limits import BACKFILL_MAX_RANGE_DAYS
from sluice.model.predicates import DATAFUSION, RowFilter, render
from sluice.model.stream import StreamSpec
from sluice.paths import Roots
from sluice.storage.checkpoint import CheckpointReader, local_file_path
from sluice.storage.delta import query
from sluice.storage.landing import SourceFile, SourceState, list_landing_zone

# The manual backfill DAG (sluice_airflow.backfill_dag): the Streams page links to it, the trigger check guards it.
DAG_ID = "backfill"
MODES = tuple(mode.value for mode in BackfillMode)
SELECT_BY = ("event_time", "file_time")
# How a Delta source's range is given: versions of the upstream table, or the times they were committed.
DELTA_SELECT_BY = ("version", "commit_time")
# How a Kafka source's range is given: offsets per partition, or the records' timestamps.
KAFKA_SELECT_BY = ("offset", "timestamp")
PARAMS = ("stream", "start", "end", "timezone", "select_by", "mode", "dry_run", "max_files_per_trigger", "reason",
          "start_version", "end_version", "offsets")
MAX_REASON_LENGTH = 500
# The shapes the trigger form's JSON Schema holds start, end and timezone to (what parse_request reads): an ISO 8601
# date and time, to the minute at least, with an optional offset; an IANA zone name.
DATE_TIME_PATTERN = r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?([Zz]|[+-]\d{2}(:?\d{2})?)?$"
TIME_ZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$"
# More files per micro-batch than this is one batch in all but name, and a number Spark would read as a long.
MAX_FILES_PER_TRIGGER = 100_000
# Characters a Hadoop glob alternation cannot hold, even escaped (commas can be escaped).
_GLOB_UNSAFE = ("{", "}", "[", "]", "*", "?", "\\")
_RUN_KEY = re.compile(r"[^A-Za-z0-9._-]+")
# The times a backfill takes: the calendar's, less a margin that every duration a plan adds or takes (the clock skew,
# the range, a time zone's offset) stays within, so that no arithmetic on them overflows.
EARLIEST = datetime(1, 1, 1, tzinfo=timezone.utc) + timedelta(days=BACKFILL_MAX_RANGE_DAYS + 2)
LATEST = datetime(9999, 12, 31, tzinfo=timezone.utc) - timedelta(days=BACKFILL_MAX_RANGE_DAYS + 2)
DEAD_LETTER_SOURCE_COLUMN = "source_file"


@dataclass(frozen=True)
class BackfillRequest:
    """A validated backfill: the range is UTC-aware and ``start < end``."""

    stream: str
    # None for a range of versions (a Delta source's start_version, end_version).
    start: datetime | None
    end: datetime | None
    mode: BackfillMode = BackfillMode.APPEND
    select_by: str = "event_time"
    dry_run: bool = False
    max_files_per_trigger: int | None = None
    reason: str | None = None
    run_id: str = "manual"
    start_version: int | None = None
    end_version: int | None = None
    # A Kafka source's offsets: {topic: {"<partition>": [first, last]}} (sluice.operations.kafka_range).
    offsets: dict[str, dict[str, list[int]]] | None = None

    @property
    def run_key(self) -> str:
        """The run id as a folder name: the backfill's checkpoint is keyed by stream and run id."""
        return _RUN_KEY.sub("_", self.run_id).strip("._")[:150] or "run"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["start"] = self.start.isoformat() if self.start else None
        data["end"] = self.end.isoformat() if self.end else None
        return data

    @property
    def range_text(self) -> str:
        """The range as the commits and the run log spell it."""
        if self.offsets is not None:
            return "offsets " + json.dumps(self.offsets, sort_keys=True, separators=(",", ":"))
        if self.start is None or self.end is None:
            last = "latest" if self.end_version is None else self.end_version
            return f"versions [{self.start_version}, {last}]"
        return f"[{self.start.isoformat()}, {self.end.isoformat()})"

    def to_args(self) -> list[str]:
        """The backfill runner's command-line arguments for this request."""
        return option_args({"stream": self.stream, "start": self.start.isoformat() if self.start else None,
                            "end": self.end.isoformat() if self.end else None,
                            "start-version": self.start_version, "end-version": self.end_version,
                            "offsets": json.dumps(self.offsets, sort_keys=True) if self.offsets else None,
                            "mode": self.mode, "select-by": self.select_by, "run-id": self.run_id,
                            "dry-run": self.dry_run, "max-files-per-trigger": self.max_files_per_trigger,
                            "reason": self.reason or None})


def parse_zone(value: object) -> Any:
    """The IANA time zone a request's ``timezone`` names (naive times are read in it); None when it names none."""
    import pendulum

    if value in (None, ""):
        return None
    try:
        return pendulum.timezone(str(value))
    except Exception:  # pendulum raises its own InvalidTimezone, or a ZoneInfo error
        raise BackfillError("timezone", f"unknown time zone {value!r}; use an IANA name such as Europe/Berlin or "
                                        "UTC") from None


def _time_range(params: Mapping[str, Any]) -> tuple[datetime, datetime]:
    """A request's ``start`` and ``end``, read in its ``timezone``; refused by name unless end is after start."""
    zone = parse_zone(params.get("timezone"))
    start = _parse_time("start", params.get("start"), zone)
    end = _parse_time("end", params.get("end"), zone)
    if end <= start:
        raise BackfillError("end", f"{end.isoformat()} is not after start {start.isoformat()}")
    return start, end


def _parse_time(name: str, value: object, zone: Any) -> datetime:
    import pendulum

    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and value.strip():
        try:
            parsed = pendulum.parse(value.strip(), exact=True, tz=None)
        except (ValueError, TypeError) as exc:
            raise BackfillError(name, f"{value!r} is not an ISO 8601 date-time ({exc})") from None
        if not isinstance(parsed, datetime):
            raise BackfillError(name, f"{value!r} is a {type(parsed).__name__}, not a date-time; give a time and "
                                      "an offset, e.g. 2026-03-29T00:00:00+01:00")
        moment = parsed
    else:
        raise BackfillError(name, f"expected an ISO 8601 date-time, got {value!r}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        if zone is None:
            raise BackfillError(name, f"{value!r} has no UTC offset; add one (e.g. +01:00 or Z), or set timezone "
                                      "to the IANA zone it is in")
        # pendulum resolves local times across daylight-saving changes: a skipped hour moves forward, a repeated
        # hour takes its first occurrence.
        try:
            moment = pendulum.datetime(moment.year, moment.month, moment.day, moment.hour, moment.minute,
                                       moment.second, moment.microsecond, tz=zone)
        except (ValueError, OverflowError):
            raise _out_of_range(name, value) from None
    try:
        # A plain datetime in UTC: pendulum's subclasses would turn differences into its own Interval type.
        utc = datetime.fromtimestamp(moment.timestamp(), timezone.utc)
    except (ValueError, OverflowError, OSError):  # a year 0 or 10000 once in UTC
        raise _out_of_range(name, value) from None
    if not EARLIEST <= utc <= LATEST:
        raise _out_of_range(name, value)
    return utc


def _out_of_range(name: str, value: object) -> BackfillError:
    return BackfillError(name, f"{value!r} is outside the times a backfill takes, {EARLIEST.isoformat()} to "
                               f"{LATEST.isoformat()}")


def _as_bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {"true", "false"}:
        return value.strip().lower() == "true"
    raise BackfillError(name, f"expected true or false, got {value!r}")


def parse_request(params: Mapping[str, Any], catalog: Catalog, *, run_id: str) -> BackfillRequest:
    """Validate backfill params (from the trigger form or the command line); every refusal names its field.

    No param names a path, a Spark conf or a command: everything else comes from the catalog.
    """
    import pendulum

    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise BackfillError(unknown[0], f"unknown param(s) {', '.join(unknown)}; a backfill takes {', '.join(PARAMS)}")
    name = params.get("stream")
    if not isinstance(name, str) or name not in catalog.streams:
        known = ", ".join(stream.name for stream in catalog)
        raise BackfillError("stream", f"unknown stream {name!r}; known streams: {known}")
    stream = catalog.get(name)
    if stream.source.type in (SourceType.DELTA, SourceType.ICEBERG):
        return _parse_delta_range(params, stream, run_id=run_id)
    if stream.source.type is SourceType.KAFKA:
        return _parse_kafka_range(params, stream, run_id=run_id)
    if params.get("offsets") not in (None, ""):
        raise BackfillError("offsets", f"stream '{name}' reads a {stream.source.type.value} source; offsets are for a "
                                       "Kafka source")
    for version_param in ("start_version", "end_version"):
        if params.get(version_param) not in (None, ""):
            raise BackfillError(version_param, f"stream '{name}' reads a {stream.source.type.value} source; "
                                               "a version range is for a Delta source")
    refusal = source_kind(stream.source).backfill_refusal
    if refusal is not None:
        raise BackfillError("stream", f"stream '{name}' reads a {stream.source.type.value} source; {refusal}")
    _refuse_stream(stream)
    start, end = _time_range(params)
    longest = timedelta(days=stream.backfill.max_range_days)
    if end - start > longest:
        raise BackfillError("end", f"the range is {end - start}, longer than the {stream.backfill.max_range_days} "
                                   f"days stream '{name}' allows (backfill.max_range_days); split it into several "
                                   "backfills")
    clean = getattr(stream.source, "clean", None)
    if clean is not None:
        kept_from = pendulum.now("UTC").replace(microsecond=0) - timedelta(seconds=clean.after_seconds)
        if start < kept_from:
            gone = f"moved to {clean.archive_to!r}" if clean.archive_to else "deleted"
            raise BackfillError("start", f"stream '{name}' cleans its landing zone (source.clean): the files it read "
                                         f"are {gone} {timedelta(seconds=clean.after_seconds)} after they landed, so "
                                         f"a backfill starts at {kept_from.isoformat()} at the earliest")
    raw_mode = params.get("mode") or BackfillMode.APPEND.value
    if raw_mode not in MODES:
        raise BackfillError("mode", f"unknown mode {raw_mode!r}; expected one of {', '.join(MODES)}")
    mode = BackfillMode(raw_mode)
    select_by = params.get("select_by") or "event_time"
    if select_by in DELTA_SELECT_BY or select_by in KAFKA_SELECT_BY:
        raise BackfillError("select_by", f"{select_by} selects a Delta source's versions; stream '{name}' reads "
                                         f"files: expected one of {', '.join(SELECT_BY)}")
    if select_by not in SELECT_BY:
        raise BackfillError("select_by", f"unknown value {select_by!r}; expected one of {', '.join(SELECT_BY)}")
    if select_by == "event_time" and stream.backfill.event_time_column is None:
        raise BackfillError("select_by", f"stream '{name}' declares no backfill.event_time_column; select by "
                                         "file_time, or declare the column in the catalog")
    limit = params.get("max_files_per_trigger")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_FILES_PER_TRIGGER:
            raise BackfillError("max_files_per_trigger", f"expected an integer from 1 to {MAX_FILES_PER_TRIGGER}, "
                                                         f"got {limit!r}")
        if mode is BackfillMode.REPLACE:
            raise BackfillError("max_files_per_trigger", "replace reads the range in one batch, so that it is "
                                                         "swapped in one commit; leave it empty")
    reason = _reason(params.get("reason"))
    return BackfillRequest(stream=name, start=start, end=end, mode=mode, select_by=select_by,
                           dry_run=_as_bool("dry_run", params.get("dry_run", False)),
                           max_files_per_trigger=limit, reason=reason, run_id=run_id)


def _parse_delta_range(params: Mapping[str, Any], stream: StreamSpec, *, run_id: str) -> BackfillRequest:
    """A Delta source's request: a version range or a commit-time range of the upstream table, appended. An Iceberg
    source's the same, its snapshots' sequence numbers for versions (:mod:`sluice.operations.iceberg_range`)."""

    _refuse_stream(stream)
    kind = "Delta" if stream.source.type is SourceType.DELTA else "Iceberg"
    raw_mode = params.get("mode") or BackfillMode.APPEND.value
    if raw_mode not in MODES:
        raise BackfillError("mode", f"unknown mode {raw_mode!r}; expected one of {', '.join(MODES)}")
    if raw_mode != BackfillMode.APPEND.value:
        raise BackfillError("mode", f"stream '{stream.name}' reads a {kind} source, which is backfilled with append "
                                    "only: its table does not record which upstream version a row came from, so "
                                    "replace could not take exactly those rows out")
    versions = {key: params.get(key) for key in ("start_version", "end_version")}
    versions = {key: None if value in (None, "") else value for key, value in versions.items()}
    for key, value in versions.items():
        if isinstance(value, str) and value.strip().isdigit():
            versions[key] = int(value.strip())
        elif value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise BackfillError(key, f"expected a version of the upstream table (an integer from 0), got {value!r}")
    by_time = params.get("start") not in (None, "") or params.get("end") not in (None, "")
    select_by = params.get("select_by") or ("commit_time" if by_time else "version")
    if select_by not in DELTA_SELECT_BY:
        raise BackfillError("select_by", f"stream '{stream.name}' reads a {kind} source: expected one of "
                                         f"{', '.join(DELTA_SELECT_BY)}, got {select_by!r}")
    start = end = None
    if select_by == "version":
        if by_time:
            raise BackfillError("start", "give a version range (start_version, end_version) or a commit time range "
                                         "(select_by commit_time, start, end), not both")
        if versions["start_version"] is None:
            raise BackfillError("start_version", f"stream '{stream.name}' reads a {kind} source: give the first "
                                                 "version to backfill (and end_version, the last; the latest if "
                                                 "empty)")
        end_version = versions["end_version"]
        if end_version is not None and end_version < versions["start_version"]:
            raise BackfillError("end_version", f"{end_version} is before start_version {versions['start_version']}")
    else:
        if versions["start_version"] is not None or versions["end_version"] is not None:
            name = "start_version" if versions["start_version"] is not None else "end_version"
            raise BackfillError(name, "select_by commit_time takes start and end, not versions")
        start, end = _time_range(params)
    if params.get("max_files_per_trigger") not in (None, ""):
        limit = params.get("max_files_per_trigger")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_FILES_PER_TRIGGER:
            raise BackfillError("max_files_per_trigger", f"expected an integer from 1 to {MAX_FILES_PER_TRIGGER}, "
                                                         f"got {limit!r}")
    else:
        limit = None
    reason = _reason(params.get("reason"))
    return BackfillRequest(stream=stream.name, start=start, end=end, mode=BackfillMode.APPEND, select_by=select_by,
                           dry_run=_as_bool("dry_run", params.get("dry_run", False)), max_files_per_trigger=limit,
                           reason=reason, run_id=run_id, start_version=versions["start_version"],
                           end_version=versions["end_version"])


def _parse_kafka_range(params: Mapping[str, Any], stream: StreamSpec, *, run_id: str) -> BackfillRequest:
    """A Kafka source's request: offsets per partition, or a timestamp range of its records; append or replace.
    The offsets' shape is checked here; the brokers and the checkpoint are the plan's
    (:mod:`sluice.operations.kafka_range`)."""
    from sluice.kinds.kafka import subscribed_topics
    from sluice.operations.kafka_range import parse_offsets

    _refuse_stream(stream)
    for key in ("start_version", "end_version"):
        if params.get(key) not in (None, ""):
            raise BackfillError(key, f"stream '{stream.name}' reads a Kafka source: give offsets, or select_by "
                                     "timestamp with start and end")
    raw_mode = params.get("mode") or BackfillMode.APPEND.value
    if raw_mode not in MODES:
        raise BackfillError("mode", f"unknown mode {raw_mode!r}; expected one of {', '.join(MODES)}")
    by_time = params.get("start") not in (None, "") or params.get("end") not in (None, "")
    has_offsets = params.get("offsets") not in (None, "")
    select_by = params.get("select_by") or ("timestamp" if by_time and not has_offsets else "offset")
    if select_by not in KAFKA_SELECT_BY:
        raise BackfillError("select_by", f"stream '{stream.name}' reads a Kafka source: expected one of "
                                         f"{', '.join(KAFKA_SELECT_BY)}, got {select_by!r}")
    start = end = None
    offsets = None
    if select_by == "offset":
        if by_time:
            raise BackfillError("start", "give offsets, or a time range (select_by timestamp, start, end), not both")
        if not has_offsets:
            raise BackfillError("offsets", f"stream '{stream.name}' reads a Kafka source: give the offsets to "
                                           'backfill, e.g. {"0": [10, 50], "1": [0, 20]} (first and last of each '
                                           "partition), or select_by timestamp with start and end")
        options = stream.source.options
        offsets = parse_offsets(params.get("offsets"), subscribed_topics(options), options.get("subscribePattern"))
    else:
        if has_offsets:
            raise BackfillError("offsets", "select_by timestamp takes start and end, not offsets")
        start, end = _time_range(params)
    if params.get("max_files_per_trigger") not in (None, ""):
        raise BackfillError("max_files_per_trigger", "a Kafka source has no files; its batches follow the "
                                                     "catalog's maxOffsetsPerTrigger")
    return BackfillRequest(stream=stream.name, start=start, end=end, mode=BackfillMode(raw_mode),
                           select_by=select_by, dry_run=_as_bool("dry_run", params.get("dry_run", False)),
                           reason=_reason(params.get("reason")), run_id=run_id, offsets=offsets)


def _refuse_stream(stream: StreamSpec) -> None:
    """A stream a backfill cannot write: a sink it cannot backfill, state, upserts or fan-out."""
    refusal = sink_kind(stream.sink).backfill_refusal
    if refusal is not None:
        raise BackfillError("stream", f"stream '{stream.name}' writes to {stream.sink.format.value}; {refusal}")
    # A cdc sink's changes are re-applied by sequence, which is idempotent; a merge's upserts are not replayable so.
    if stream.patterns.stateful or stream.patterns.fan_out or stream.sink.mode not in (SinkMode.APPEND,
                                                                                       SinkMode.CDC):
        raise BackfillError("stream", f"stream '{stream.name}' keeps state in its checkpoint, upserts its table or "
                                      "fans out; a backfill runs with a checkpoint of its own and writes the stream's "
                                      "table only, so it could neither see that state nor keep the tables in step. "
                                      "Rebuild the stream from its source instead")


def _reason(reason: object) -> str | None:
    if reason in ("", None):
        return None
    if not isinstance(reason, str) or len(reason) > MAX_REASON_LENGTH or not reason.isprintable():
        raise BackfillError("reason", f"expected one line of text of at most {MAX_REASON_LENGTH} characters")
    return reason


@dataclass
class BackfillPlan:
    """What a backfill will read and replace. Frozen into the backfill's checkpoint on its first attempt."""

    request: dict[str, Any]
    files: list[SourceFile]
    pending_files: int = 0
    pending_bytes: int = 0
    held_files: int = 0
    # replace only: the rows each table gives up, written out per engine by sluice.model.predicates.
    sink_filter: RowFilter | None = None
    dead_letter_filter: RowFilter | None = None
    rows_to_replace: int = 0
    dead_letter_rows_to_replace: int = 0
    event_time_column: str | None = None
    notes: list[str] = field(default_factory=list)
    # A Delta source's range: sluice.operations.delta_range.VersionRange.to_dict(), with the counts per version.
    versions: dict[str, Any] | None = None
    # A Kafka source's range: sluice.operations.kafka_range.KafkaRange.to_dict(), with the counts per partition.
    offsets: dict[str, Any] | None = None

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self, *, sample: int | None = None) -> dict[str, Any]:
        data = asdict(self)
        for name in ("sink_filter", "dead_letter_filter"):
            row_filter = getattr(self, name)
            data[name] = row_filter.to_dict() if row_filter is not None else None
        data["file_count"], data["file_bytes"] = len(self.files), self.bytes
        if sample is not None:
            data["files"] = [f["path"] for f in data["files"][:sample]]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BackfillPlan:
        if data.get("sink_predicate") or data.get("dead_letter_predicate"):
            raise SluiceError("this backfill's plan was frozen by an older Sluice, as predicate text; start the "
                              "backfill again with a new run (its own checkpoint folder is per run)")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["files"] = [SourceFile(**f) for f in data["files"]]
        for name in ("sink_filter", "dead_letter_filter"):
            known[name] = RowFilter.from_dict(data[name]) if data.get(name) else None
        return cls(**known)


def _utf8(path: str) -> bool:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # the surrogates os.fsdecode makes of bytes that are not UTF-8
        return False
    return True


def _distinct(path: str, column: str, where: RowFilter | None, *, if_present: bool = False) -> set[str]:
    """The column's distinct values (as text) where ``where`` holds; with ``if_present``, none when the table lacks
    the column (a cdc sink may leave ``_source_file`` out with ``except_columns``)."""
    if if_present and column not in _columns(path):
        return set()
    sql = f"SELECT DISTINCT {DATAFUSION.identifier(column)} AS v FROM t"
    rows = query(path, sql + (f" WHERE {render(where, DATAFUSION)}" if where else ""))
    return set() if rows is None else {str(value) for value in rows.column("v").to_pylist() if value is not None}


def _sink_distinct(stream: StreamSpec, roots: Roots, where: RowFilter | None, *, if_present: bool) -> set[str]:
    """The source files the stream's sink holds rows of (where ``where`` holds): its Delta table's, or an Iceberg
    table's through the table-format seam."""
    if stream.sink.table is not None:
        return _distinct(stream.sink_path(roots), SOURCE_FILE_COLUMN, where, if_present=if_present)
    own = sink_kind(stream.sink).table_format(stream.sink, roots)
    return set() if own is None else own.distinct(SOURCE_FILE_COLUMN, where)


def _sink_count(stream: StreamSpec, roots: Roots, where: RowFilter) -> int:
    """The rows of the stream's sink ``where`` selects: its Delta table's, or an Iceberg table's through the
    table-format seam."""
    if stream.sink.table is not None:
        return count_rows(stream.sink_path(roots), where)
    own = sink_kind(stream.sink).table_format(stream.sink, roots)
    return 0 if own is None else own.count(where)


def _sink_columns(stream: StreamSpec, roots: Roots) -> list[str]:
    """The columns of the stream's sink table; none when there is no table yet."""
    if stream.sink.table is not None:
        return _columns(stream.sink_path(roots))
    own = sink_kind(stream.sink).table_format(stream.sink, roots)
    return [] if own is None or not own.exists() else list(own.schema().names)


def _columns(path: str) -> list[str]:
    """A Delta table's columns; none when there is no table yet."""
    from deltalake.exceptions import TableNotFoundError

    from sluice.storage.delta import open_table

    try:
        return [field.name for field in open_table(path).schema().fields]
    except TableNotFoundError:
        return []


def count_rows(path: str, where: RowFilter) -> int:
    """Rows of a Delta table matching a filter, counted by delta-rs; 0 when there is no table."""
    rows = query(path, f"SELECT count(*) AS n FROM t WHERE {render(where, DATAFUSION)}")
    return 0 if rows is None else int(rows.column("n")[0].as_py())


def plan_backfill(request: BackfillRequest, stream: StreamSpec, roots: Roots) -> BackfillPlan:
    """The files to read, the files left to the live stream, and what ``replace`` would swap out; for a Delta
    source, the upstream versions to read, with their counts."""
    if stream.source.type is SourceType.DELTA:
        from sluice.operations.delta_range import plan_version_range

        changes = getattr(stream.source, "read", None) == "changes"
        versions = plan_version_range(stream.source_path(roots), start_version=request.start_version,
                                      end_version=request.end_version, start=request.start, end=request.end,
                                      changes=changes)
        return BackfillPlan(request=request.to_dict(), files=[], versions=versions.to_dict(),
                            notes=list(versions.notes))
    if stream.source.type is SourceType.ICEBERG:
        from sluice.kinds.iceberg import IcebergSource, catalog_properties
        from sluice.operations.iceberg_range import plan_snapshot_range
        from sluice.storage.iceberg import IcebergTableFormat

        source = stream.source
        assert isinstance(source, IcebergSource)
        versions = plan_snapshot_range(IcebergTableFormat(source.identifier, catalog_properties(source.catalog, roots)),
                                       start_version=request.start_version, end_version=request.end_version,
                                       start=request.start, end=request.end, options=source.options)
        return BackfillPlan(request=request.to_dict(), files=[], versions=versions.to_dict(),
                            notes=list(versions.notes))
    if stream.source.type is SourceType.KAFKA:
        return _plan_kafka(request, stream, roots)
    assert request.start is not None and request.end is not None  # a files request has both
    live = SourceState.of(stream, CheckpointReader(stream.checkpoint_path(roots)))
    start, end = request.start.timestamp(), request.end.timestamp()
    if request.select_by == "file_time":
        in_slice = lambda f: start <= f.modified < end  # noqa: E731
    else:
        earliest = start - stream.backfill.clock_skew_seconds
        in_slice = lambda f: f.modified >= earliest  # noqa: E731
    plan = BackfillPlan(request=request.to_dict(), files=[],
                        event_time_column=stream.backfill.event_time_column if request.select_by == "event_time"
                        else None)
    listed, links = list_landing_zone(stream, roots)
    if links:
        raise SluiceError(f"stream '{stream.name}': the landing zone holds {len(links)} symbolic link(s), e.g. "
                          f"{links[0]}; a backfill reads no file through a link. Remove them and plan again")
    for planned in listed:
        if not in_slice(planned):
            continue
        if live.will_read(planned):
            plan.pending_files += 1
            plan.pending_bytes += planned.size
            continue
        plan.files.append(planned)
    undecodable = [f.path for f in plan.files if not _utf8(f.path)]
    if undecodable:
        # Spark, the plan's JSON and the tables' file column all spell a file in UTF-8: such a name has no spelling.
        raise BackfillError("source.path", f"stream '{stream.name}': {len(undecodable)} file(s) of the range have a "
                                           f"name that is not UTF-8, e.g. {printable(undecodable[0])}; rename them, "
                                           "or narrow the range")
    unreadable = [f.path for f in plan.files if any(char in f.path for char in _GLOB_UNSAFE)]
    if unreadable:
        # The job reads its files as one Hadoop glob alternation, and Hadoop cannot escape these inside one.
        raise SluiceError(f"stream '{stream.name}': cannot backfill {len(unreadable)} file(s) whose path contains one "
                          f"of {' '.join(_GLOB_UNSAFE)}, e.g. {unreadable[0]}; rename them, or narrow the range")
    if plan.pending_files:
        plan.notes.append(f"{plan.pending_files} file(s) of the slice are not read yet by the live stream; its "
                          "next run ingests them, so the backfill leaves them alone")
    column = plan.event_time_column
    where = RowFilter(time_column=column, start=request.start, end=request.end) if column else None
    changes = stream.sink.mode is SinkMode.CDC
    if request.mode is BackfillMode.APPEND:
        held = {local_file_path(uri) for uri in _sink_distinct(stream, roots, where, if_present=changes)}
        held |= {local_file_path(uri) for uri in _distinct(stream.dead_letter_table_path(roots),
                                                           DEAD_LETTER_SOURCE_COLUMN, None)}
        kept = [f for f in plan.files if f.path not in held]
        plan.held_files = len(plan.files) - len(kept)
        plan.files = kept
    elif plan.files:
        uris = _stored_uris(stream, roots, plan.files)
        if changes:
            plan.notes.append("a cdc table's changes of the range are re-applied by key in sequence order, not "
                              "swapped: a change no newer than its key's row or remembered delete changes nothing")
        else:
            plan.sink_filter = RowFilter(file_column=SOURCE_FILE_COLUMN, files=tuple(uris), time_column=column,
                                         start=request.start if column else None,
                                         end=request.end if column else None)
            plan.rows_to_replace = _sink_count(stream, roots, plan.sink_filter)
        plan.dead_letter_filter = RowFilter(file_column=DEAD_LETTER_SOURCE_COLUMN, files=tuple(uris))
        plan.dead_letter_rows_to_replace = count_rows(stream.dead_letter_table_path(roots), plan.dead_letter_filter)
    return plan


def _stored_uris(stream: StreamSpec, roots: Roots, files: list[SourceFile]) -> list[str]:
    """How the tables spell each file (as Spark recorded it), or how Spark will spell it."""
    stored = _sink_distinct(stream, roots, None, if_present=True) | _distinct(
        stream.dead_letter_table_path(roots), DEAD_LETTER_SOURCE_COLUMN, None)
    by_path = {local_file_path(uri): uri for uri in stored}
    return sorted({by_path.get(f.path, f.uri) for f in files} | {f.uri for f in files})


def _plan_kafka(request: BackfillRequest, stream: StreamSpec, roots: Roots) -> BackfillPlan:
    """The offsets a Kafka range backfill reads, checked against the brokers and the live stream's checkpoint; what
    ``replace`` swaps out, or the offsets ``append`` leaves out because a table holds them already."""
    from sluice.kinds.kafka import KafkaSource, source_watermarks
    from sluice.operations import kafka_range as kr

    source = stream.source
    assert isinstance(source, KafkaSource)
    config = kr.broker_config(source.connection)
    marks = source_watermarks(source.options, config)
    committed = CheckpointReader(stream.checkpoint_path(roots)).committed_source_offset()
    notes: list[str] = []
    if request.offsets is not None:
        ranges = kr.check_offsets(request.offsets, marks, committed)
    else:
        assert request.start is not None and request.end is not None
        starts = kr.offsets_for_times(config, sorted(marks), request.start)
        ends = kr.offsets_for_times(config, sorted(marks), request.end)
        ranges, notes = kr.time_ranges(starts, ends, marks, committed, start=request.start, end=request.end)
    selection = tuple((part.topic, part.partition, part.first, part.last) for part in ranges)
    sink_filter = RowFilter(file_column=SOURCE_FILE_COLUMN, offsets=selection)
    dead_filter = RowFilter(file_column=DEAD_LETTER_SOURCE_COLUMN, offsets=selection)
    plan = BackfillPlan(request=request.to_dict(), files=[], notes=notes)
    sink_columns = _sink_columns(stream, roots)
    if sink_columns and SOURCE_FILE_COLUMN not in sink_columns:  # no table yet: nothing to tell apart
        raise BackfillError("stream", f"stream '{stream.name}' writes no {SOURCE_FILE_COLUMN} column (its "
                                      "transform drops it), so its table does not say which record a row came "
                                      "from: a Kafka range backfill cannot tell the range's rows")
    if request.mode is BackfillMode.APPEND:
        held = kr.lineage_offsets(sorted(_sink_distinct(stream, roots, sink_filter, if_present=False)
                                         | _distinct(stream.dead_letter_table_path(roots), DEAD_LETTER_SOURCE_COLUMN,
                                                     dead_filter)))
        read = kr.less_held(ranges, held)
        plan_range = kr.KafkaRange(ranges=ranges, read=read, notes=notes)
        plan_range.held_offsets = plan_range.offsets - sum(part.offsets for part in read)
        if plan_range.held_offsets:
            notes.append(f"{plan_range.held_offsets} offset(s) of the range are in the tables already; append "
                         "reads the others")
    else:
        plan_range = kr.KafkaRange(ranges=ranges, read=list(ranges), notes=notes)
        plan.sink_filter, plan.dead_letter_filter = sink_filter, dead_filter
        plan.rows_to_replace = _sink_count(stream, roots, sink_filter)
        plan.dead_letter_rows_to_replace = count_rows(stream.dead_letter_table_path(roots), dead_filter)
    plan.offsets = plan_range.to_dict()
    return plan
