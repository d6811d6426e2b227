"""The stream catalog: a declarative list of streams, validated on load.

Each stream names its source (with a declared schema), its transform, its Delta sink, its checkpoint, its cron
schedule, its trigger limits and its alert thresholds. Every validation failure raises :class:`CatalogError`
with the stream and the dotted field in the message.

The default catalog is ``include/sluice/streams.yaml``; ``SLUICE_CATALOG`` points elsewhere.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from croniter import croniter

from sluice import kafka
from sluice.constants import DeltaEngine, FileFormat, SinkFormat, SinkMode, SourceType, TableRole
from sluice.errors import CatalogError
from sluice.limits import (
    ALERT_MAX,
    BACKFILL_MAX_CLOCK_SKEW_SECONDS,
    BACKFILL_MAX_RANGE_DAYS,
    CATALOG_MAX_BYTES,
    MAX_DURATION_SECONDS,
    MAX_OBSERVATIONS,
    REPAIR_COPY_MARKERS,
    RESERVED_ROOT_FOLDERS,
    TRIGGER_MAX_BYTES,
    TRIGGER_MAX_FILES,
)
from sluice.paths import Roots, check_relative_path, is_absolute, join, path_key, resolved_key
from sluice.patterns import (
    Patterns,
    check_patterns,
    parse_aggregate,
    parse_dedupe,
    parse_fan_out,
    parse_join,
    parse_lookups,
    parse_watermark,
)
from sluice.schema import Schema, parse_schema
from sluice.transforms import TRANSFORMS
from sluice.yaml_loader import load_yaml

DEFAULT_CATALOG = Path(__file__).with_name("streams.yaml")
_STREAM_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")

# Spark file-source options a catalog may set, per format. Anything else is a typo or belongs elsewhere
# (trigger limits live under `trigger`, the schema under `schema`, the path under `path`).
_COMMON_FILE_OPTIONS = frozenset(
    {"pathGlobFilter", "recursiveFileLookup", "maxFileAge", "latestFirst", "fileNameOnly", "encoding",
     "timestampFormat", "dateFormat", "timeZone", "modifiedAfter", "modifiedBefore"}
)
_FORMAT_OPTIONS = {
    FileFormat.JSON: _COMMON_FILE_OPTIONS | {"multiLine", "allowComments", "allowSingleQuotes", "lineSep"},
    FileFormat.CSV: _COMMON_FILE_OPTIONS
    | {"header", "enforceSchema", "sep", "delimiter", "quote", "escape", "comment", "nullValue", "emptyValue",
       "multiLine", "lineSep", "ignoreLeadingWhiteSpace", "ignoreTrailingWhiteSpace"},
    FileFormat.PARQUET: _COMMON_FILE_OPTIONS | {"mergeSchema", "datetimeRebaseMode", "int96RebaseMode"},
    # Options both Delta engines' streaming sources take (delta-spark's names).
    FileFormat.DELTA: frozenset({"startingVersion", "startingTimestamp", "skipChangeCommits"}),
}


class _Section:
    """A mapping from the catalog being read: typed access by key, and a refusal of keys nobody asked for."""

    def __init__(self, raw: object, *, stream: str | None, path: str) -> None:
        if not isinstance(raw, Mapping):
            raise CatalogError(f"expected a mapping, got {type(raw).__name__}", stream=stream, field=path or None)
        self.raw = raw
        self.stream = stream
        self.path = path
        self.allowed: set[str] = set()

    def field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, message: str) -> CatalogError:
        return CatalogError(message, stream=self.stream, field=self.field(key))

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None, *, required: bool = False) -> Any:
        self.allowed.add(key)
        if key not in self.raw or self.raw[key] is None:
            if required:
                raise self.error(key, "is required")
            return default
        value = self.raw[key]
        # bool is an int in Python; a catalog that says `max_files_per_trigger: true` is wrong.
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.error(key, f"expected {_kind_name(kind)}, got a boolean")
        if not isinstance(value, kind):
            raise self.error(key, f"expected {_kind_name(kind)}, got {type(value).__name__} {value!r}")
        return value

    def section(self, key: str, *, required: bool = False) -> _Section:
        raw = self.get(key, Mapping, {}, required=required)
        return _Section(raw, stream=self.stream, path=self.field(key))

    def positive_int(self, key: str, *, maximum: int) -> int | None:
        value = self.get(key, int)
        if value is not None and value <= 0:
            raise self.error(key, f"must be a positive integer, got {value}")
        return self._at_most(key, value, maximum)

    def bounded_int(self, key: str, default: int, *, minimum: int, maximum: int) -> int:
        value: int = self.get(key, int, default)
        if value < minimum:
            raise self.error(key, f"must be at least {minimum}, got {value}")
        return self._at_most(key, value, maximum)

    def _at_most(self, key: str, value: Any, maximum: int) -> Any:
        # Every catalog number ends in a timedelta, a Spark interval or a SQLite integer: bound it here, where the
        # message can still name the field.
        if value is not None and value > maximum:
            raise self.error(key, f"must be at most {maximum:,} (Sluice's bound for this field), got {value:,}")
        return value

    def enum(self, key: str, kind: type[Any], default: Any = None, *, required: bool = False) -> Any:
        value = self.get(key, str, None, required=required)
        if value is None:
            return default
        try:
            return kind(value)
        except ValueError:
            choices = ", ".join(member.value for member in kind)
            raise self.error(key, f"unknown value {value!r}; expected one of {choices}") from None

    def done(self) -> None:
        unknown = sorted(str(key) for key in self.raw if key not in self.allowed)
        if unknown:
            allowed = ", ".join(sorted(self.allowed))
            raise CatalogError(
                f"unknown key(s) {', '.join(unknown)}; allowed here: {allowed}",
                stream=self.stream,
                field=self.path or None,
            )


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {Mapping: "a mapping", str: "a string", int: "an integer", list: "a list", bool: "a boolean"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


@dataclass(frozen=True)
class SourceSpec:
    """A file landing zone (``path`` under the landing root), or a Delta table (``type: delta``, ``path`` under the
    lake root), or Kafka topics (``type: kafka``, no path: the brokers come from the Airflow ``connection``; the
    ``format`` is the value encoding, json or avro with ``value_schema``), read with a declared schema."""

    type: SourceType
    format: FileFormat
    path: str
    schema: Schema
    options: Mapping[str, str] = field(default_factory=dict)
    connection: str | None = None
    value_schema: str | None = None


@dataclass(frozen=True)
class SinkSpec:
    """A Delta table written exactly once per micro-batch: appended to, merged into by ``keys`` (the row with the
    highest ``sequence_by`` wins), or rewritten whole (``complete``). Or (``format: kafka``) a Kafka topic written at
    least once: a retried batch sends its records again. A Kafka sink has no path; its dead-letter table is still
    Delta."""

    path: str
    partition_by: tuple[str, ...] = ()
    mode: SinkMode = SinkMode.APPEND
    engine: DeltaEngine = DeltaEngine.AUTO
    keys: tuple[str, ...] = ()
    sequence_by: str | None = None
    format: SinkFormat = SinkFormat.DELTA
    topic: str | None = None
    connection: str | None = None
    key_column: str | None = None


@dataclass(frozen=True)
class TriggerSpec:
    """Per-micro-batch admission limits. Spark refuses both at once for the file source, so the catalog does too."""

    max_files_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None


@dataclass(frozen=True)
class AlertSpec:
    """Thresholds for the lag sensors, the lag monitor and the staleness check; WARN must not exceed CRITICAL.

    ``records`` are Kafka offsets or Delta rows behind; ``files`` and ``bytes`` what the source holds unread;
    ``seconds`` the age of the oldest unread data. A stream with a backlog and no commit for longer than
    ``stale_after_seconds`` is STOPPED; one whose backlog grew over ``stall_observations`` observations without a
    commit is STALLED. A resolve message waits for ``resolve_after_observations`` OK observations in a row (against
    a stream that flaps around a threshold). ``catch_up`` lets the lag monitor trigger the stream's DAG when it is
    CRITICAL or STOPPED and no run is active. ``email_to`` receives the monitor's alerts by email (through Airflow's
    SMTP connection).
    """

    stale_after_seconds: int | None = None
    warn_records: int | None = None
    critical_records: int | None = None
    warn_files: int | None = None
    critical_files: int | None = None
    warn_bytes: int | None = None
    critical_bytes: int | None = None
    warn_seconds: int | None = None
    critical_seconds: int | None = None
    stall_observations: int = 5
    resolve_after_observations: int = 1
    catch_up: bool = False
    email_to: tuple[str, ...] = ()


@dataclass(frozen=True)
class BackfillSpec:
    """What a backfill of the stream may do: the event-time column that ranges select on (none: file time
    only), the longest range one backfill may cover, and how far an event may be ahead of its file's time."""

    event_time_column: str | None = None
    max_range_days: int = 31
    clock_skew_seconds: int = 300


@dataclass(frozen=True)
class StreamSpec:
    """One catalog stream: everything the runner, the DAG factory and the checks need to know about it."""

    name: str
    description: str
    source: SourceSpec
    transform: str
    sink: SinkSpec
    dead_letter_path: str
    checkpoint: str
    schedule: str | None
    trigger: TriggerSpec
    alerts: AlertSpec
    owner: str = "data-eng"
    tags: tuple[str, ...] = ()
    # A new checkpoint in front of a table this stream already fed is refused (QUERY_ID_UNKNOWN_TO_SINK) unless
    # this is set, for a deliberate full reload into a table whose rows are replaced downstream.
    allow_new_query_id: bool = False
    backfill: BackfillSpec = field(default_factory=BackfillSpec)
    patterns: Patterns = field(default_factory=Patterns)
    # The columns the stream's table receives, before Sluice's metadata columns.
    output_columns: tuple[str, ...] = ()

    def tables(self, roots: Roots) -> list[StreamTable]:
        """Every Delta table the stream's batches commit to, resolved under the lake root: its sink (a Delta sink
        only), its dead-letter table, then its fan-out tables. The one answer the runner, the health checks, repair
        and backfill use."""
        tables = [StreamTable(TableRole.SINK, self.sink_path(roots))] if self.sink.format is SinkFormat.DELTA else []
        tables.append(StreamTable(TableRole.DEAD_LETTER, self.dead_letter_table_path(roots)))
        tables += [StreamTable(TableRole.FAN_OUT, join(roots.lake, spec.path), index)
                   for index, spec in enumerate(self.patterns.fan_out)]
        return tables

    @property
    def table_paths(self) -> list[str]:
        """The tables the stream's batches write, under the lake root: its sink and its fan-out tables."""
        return [*([self.sink.path] if self.sink.path else []), *(spec.path for spec in self.patterns.fan_out)]

    @property
    def checkpoint_sources(self) -> int:
        """How many sources Spark records in this stream's checkpoint. A stateful stream reads its source twice in
        one query: its good rows feed the stateful operators, its dead letters bypass them (the runner unions the
        two before the sink); a join does the same with the joined stream."""
        if not self.patterns.stateful:
            return 1
        return 4 if self.patterns.join is not None else 2

    def source_path(self, roots: Roots) -> str:
        return join(roots.lake if self.source.type is SourceType.DELTA else roots.landing, self.source.path)

    def sink_path(self, roots: Roots) -> str:
        return join(roots.lake, self.sink.path)

    def dead_letter_table_path(self, roots: Roots) -> str:
        return join(roots.lake, self.dead_letter_path)

    def checkpoint_path(self, roots: Roots) -> str:
        return join(roots.checkpoints, self.checkpoint)

    @property
    def written_paths(self) -> list[WrittenPath]:
        """The folders the stream writes: its checkpoint, its sink, dead-letter and fan-out tables."""
        paths = [WrittenPath(self.name, "checkpoint", "checkpoint", self.checkpoint, "checkpoints")]
        if self.sink.format is SinkFormat.DELTA:
            paths.append(WrittenPath(self.name, "sink table", "sink.path", self.sink.path, "lake"))
        paths.append(WrittenPath(self.name, "dead-letter table", "dead_letter.path", self.dead_letter_path, "lake"))
        paths += [WrittenPath(self.name, "fan-out table", f"fan_out[{position}].path", fan_out.path, "lake")
                  for position, fan_out in enumerate(self.patterns.fan_out)]
        return paths


@dataclass(frozen=True)
class StreamTable:
    """A Delta table a stream writes: its role, its resolved path, and its position among the fan-out tables."""

    role: TableRole
    path: str
    index: int = 0

    @property
    def name(self) -> str:
        """``sink``, ``dead_letter`` or ``fan_out[<index>]``: how reports name it."""
        return f"{self.role.value}[{self.index}]" if self.role is TableRole.FAN_OUT else self.role.value


@dataclass(frozen=True)
class WrittenPath:
    """A folder a stream writes, as the catalog names it; ``root`` is the field of :class:`Roots` that a relative
    ``path`` lives under."""

    stream: str
    what: str
    field: str
    path: str
    root: str

    def error(self, message: str) -> CatalogError:
        return CatalogError(message, stream=self.stream, field=self.field)


@dataclass(frozen=True)
class Catalog:
    """All streams, by name, in catalog order."""

    streams: Mapping[str, StreamSpec]
    source_file: str | None = None

    def __iter__(self) -> Iterator[StreamSpec]:
        return iter(self.streams.values())

    def __len__(self) -> int:
        return len(self.streams)

    def get(self, name: str) -> StreamSpec:
        try:
            return self.streams[name]
        except KeyError:
            known = ", ".join(self.streams) or "none"
            raise CatalogError(f"unknown stream {name!r}; the catalog has: {known}") from None

    def upstream_of(self, stream: StreamSpec) -> StreamSpec | None:
        """The stream whose table a Delta-source stream reads, when another stream of the catalog writes it."""
        return self._writer_of(stream.source) if stream.source.type is SourceType.DELTA else None

    def upstreams_of(self, stream: StreamSpec) -> list[StreamSpec]:
        """Every catalog stream whose table this stream reads: its source's, and its joined source's."""
        join = stream.patterns.join
        found = [self.upstream_of(stream), self._writer_of(join.source) if join is not None else None]
        return [upstream for upstream in found if upstream is not None]

    def _writer_of(self, source: SourceSpec) -> StreamSpec | None:
        """The stream that writes the table a Delta source reads: as its sink, or as one of its fan-out tables."""
        wanted = os.path.normpath(source.path)
        return next((other for other in self if wanted in {os.path.normpath(path) for path in other.table_paths}),
                    None)

    def select(self, names: list[str]) -> list[StreamSpec]:
        if not names:
            raise CatalogError("no stream named; pass at least one stream")
        return [self.get(name) for name in names]

    def check_roots(self, roots: Roots) -> None:
        """Refuse what only the deployment's roots reveal, before anything is written under them.

        Loading compares relative paths under one root, and absolute paths with each other. Here every checkpoint
        and table is resolved (links included, for local paths) and must not: be or contain a root; lie in Sluice's
        own folders under the checkpoint root (``_backfill``, ``_sluice``); be, contain or lie inside another
        stream's checkpoint or table (an absolute ``/data/lake/bronze/events`` and a relative ``bronze/events`` under
        the lake root ``/data/lake`` are one table), or a file source's landing folder (the stream would read Delta's
        files as its input).
        """
        root_keys = {name: resolved_key(getattr(roots, name), ".") for name in ("landing", "lake", "checkpoints")}
        checkpoint_root = root_keys["checkpoints"]
        reserved = [(folder, (checkpoint_root[0], (*checkpoint_root[1], folder.casefold())))
                    for folder in RESERVED_ROOT_FOLDERS]
        claims = _Claims()
        for stream in self:
            for written in stream.written_paths:
                key = resolved_key(getattr(roots, written.root), written.path)
                shown = f"{written.path!r} (resolved: {_show(key)})"
                for name, root_key in root_keys.items():
                    if _inside(key, root_key):
                        raise written.error(f"{written.what} {shown} is or contains the {name} root "
                                            f"{getattr(roots, name)!r}, which holds every stream's data")
                for folder, folder_key in reserved:
                    if _inside(folder_key, key):
                        raise written.error(f"{written.what} {shown} lies in {folder}/ under the checkpoint root, a "
                                            "folder Sluice keeps for itself")
                claims.claim(key, written, shown=shown)
        for stream in self:
            if stream.source.type is not SourceType.FILES:
                continue
            key = resolved_key(roots.landing, stream.source.path)
            other = claims.overlapping(key)
            if other is not None:
                raise CatalogError(f"the landing folder {_show(key)} overlaps {other.what} {other.path!r} of stream "
                                   f"'{other.stream}': the stream would read Delta's own files as its input",
                                   stream=stream.name, field="source.path")


def _parse_source(stream: str, section: _Section) -> SourceSpec:
    source_type = section.enum("type", SourceType, required=True)
    if source_type is SourceType.KAFKA:
        return _parse_kafka_source(stream, section)
    file_format = section.enum("format", FileFormat, FileFormat.DELTA if source_type is SourceType.DELTA else None,
                               required=source_type is not SourceType.DELTA)
    if (source_type is SourceType.DELTA) != (file_format is FileFormat.DELTA):
        raise section.error("format", f"a {source_type.value} source cannot have format {file_format.value}")
    if file_format not in _FORMAT_OPTIONS:
        raise section.error("format", f"a {source_type.value} source cannot have format {file_format.value}")
    path = check_relative_path(section.get("path", str, required=True), stream=stream, field=section.field("path"))
    if "schema" not in section.raw or section.raw["schema"] is None:
        raise section.error("schema", f"a {file_format.value} source needs a declared schema; inferring one from "
                                      "whatever arrives first is not reproducible")
    schema = parse_schema(section.get("schema", Mapping), stream=stream, field=section.field("schema"))
    options_section = section.section("options")
    allowed = _FORMAT_OPTIONS[file_format]
    options: dict[str, str] = {}
    for key, value in options_section.raw.items():
        if key not in allowed:
            raise options_section.error(
                str(key), f"not a supported {file_format.value} source option; allowed: {', '.join(sorted(allowed))}"
            )
        if isinstance(value, Mapping | list):
            raise options_section.error(str(key), "expected a scalar value")
        options[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
        options_section.allowed.add(key)
    options_section.done()
    section.done()
    return SourceSpec(type=source_type, format=file_format, path=path, schema=schema, options=options)


def _parse_kafka_source(stream: str, section: _Section) -> SourceSpec:
    """A Kafka source: value encoding, declared schema, subscription options and the connection's name."""
    value_format = section.enum("format", FileFormat, FileFormat.JSON)
    if value_format not in (FileFormat.JSON, FileFormat.AVRO):
        raise section.error("format", f"a kafka source's format is its value encoding: json or avro, got "
                                      f"{value_format.value}")
    if "schema" not in section.raw or section.raw["schema"] is None:
        raise section.error("schema", "a kafka source needs a declared schema of its values")
    schema = parse_schema(section.get("schema", Mapping), stream=stream, field=section.field("schema"))
    value_schema = section.get("value_schema", (str, Mapping))
    if value_format is FileFormat.AVRO:
        if value_schema is None:
            raise section.error("value_schema", "an avro kafka source needs the writer's Avro schema (inline)")
        value_schema = kafka.check_avro_schema(value_schema, stream=stream, field=section.field("value_schema"),
                                               columns=schema.names)
    elif value_schema is not None:
        raise section.error("value_schema", "only an avro kafka source has a value_schema; json values are "
                                            "decoded with the declared schema")
    options = kafka.check_source_options(section.get("options", Mapping, {}, required=True), stream=stream,
                                         field=section.field("options"))
    connection = kafka.check_connection_id(section.get("connection", str, kafka.DEFAULT_CONNECTION), stream=stream,
                                           field=section.field("connection"))
    section.done()
    return SourceSpec(type=SourceType.KAFKA, format=value_format, path="", schema=schema, options=options,
                      connection=connection, value_schema=value_schema)


def _parse_kafka_sink(stream: str, section: _Section) -> SinkSpec:
    """A Kafka sink: the topic, the connection, an optional key column. Its dead-letter table's engine may be set."""
    topic = kafka.check_topic(section.get("topic", str, required=True), stream=stream, field=section.field("topic"))
    connection = kafka.check_connection_id(section.get("connection", str, kafka.DEFAULT_CONNECTION), stream=stream,
                                           field=section.field("connection"))
    key_column = section.get("key_column", str)
    mode = section.enum("mode", SinkMode, SinkMode.APPEND)
    engine = section.enum("engine", DeltaEngine, DeltaEngine.AUTO)
    section.done()
    return SinkSpec(path="", mode=mode, engine=engine, format=SinkFormat.KAFKA, topic=topic, connection=connection,
                    key_column=key_column)


def _parse_sink(stream: str, section: _Section) -> SinkSpec:
    sink_format = section.enum("format", SinkFormat, SinkFormat.DELTA)
    if sink_format is SinkFormat.KAFKA:
        return _parse_kafka_sink(stream, section)
    path = check_relative_path(section.get("path", str, required=True), stream=stream, field=section.field("path"))
    partition_by = section.get("partition_by", list, [])
    for column in partition_by:
        if not isinstance(column, str) or not column:
            raise section.error("partition_by", f"expected column names, got {column!r}")
    if len(set(partition_by)) != len(partition_by):
        raise section.error("partition_by", f"lists a column twice: {partition_by}")
    mode = section.enum("mode", SinkMode, SinkMode.APPEND)
    engine = section.enum("engine", DeltaEngine, DeltaEngine.AUTO)
    keys = section.get("keys", list, [])
    if not all(isinstance(key, str) and key for key in keys) or len(set(keys)) != len(keys):
        raise section.error("keys", f"expected distinct column names, got {keys!r}")
    sequence_by = section.get("sequence_by", str)
    section.done()
    if keys and mode is not SinkMode.MERGE:
        raise section.error("keys", f"keys are for mode merge; mode {mode.value} does not upsert")
    return SinkSpec(path=path, partition_by=tuple(partition_by), mode=mode, engine=engine, keys=tuple(keys),
                    sequence_by=sequence_by)


def _parse_trigger(section: _Section) -> TriggerSpec:
    trigger = TriggerSpec(
        max_files_per_trigger=section.positive_int("max_files_per_trigger", maximum=TRIGGER_MAX_FILES),
        max_bytes_per_trigger=section.positive_int("max_bytes_per_trigger", maximum=TRIGGER_MAX_BYTES),
    )
    section.done()
    if trigger.max_files_per_trigger and trigger.max_bytes_per_trigger:
        raise section.error("max_bytes_per_trigger", "set max_files_per_trigger or max_bytes_per_trigger, not both")
    return trigger


_MEASURES = ("records", "files", "bytes", "seconds")


def _parse_alerts(section: _Section) -> AlertSpec:
    thresholds = {f"{level}_{measure}": section.positive_int(f"{level}_{measure}", maximum=ALERT_MAX[measure])
                  for measure in _MEASURES for level in ("warn", "critical")}
    email_to = section.get("email_to", list, [])
    if not all(isinstance(address, str) and "@" in address for address in email_to):
        raise section.error("email_to", f"expected a list of email addresses, got {email_to!r}")
    alerts = AlertSpec(
        stale_after_seconds=section.positive_int("stale_after_seconds", maximum=MAX_DURATION_SECONDS),
        stall_observations=section.positive_int("stall_observations", maximum=MAX_OBSERVATIONS)
        or AlertSpec.stall_observations,
        resolve_after_observations=section.positive_int("resolve_after_observations", maximum=MAX_OBSERVATIONS)
        or AlertSpec.resolve_after_observations,
        catch_up=section.get("catch_up", bool, False),
        email_to=tuple(email_to),
        **thresholds,
    )
    section.done()
    if alerts.stall_observations < 2:
        raise section.error("stall_observations", "a trend needs at least 2 observations")
    for measure in _MEASURES:
        warn, critical = getattr(alerts, f"warn_{measure}"), getattr(alerts, f"critical_{measure}")
        if warn is not None and critical is not None and warn > critical:
            raise section.error(f"warn_{measure}", f"WARN threshold {warn} exceeds CRITICAL threshold {critical}")
    return alerts


def _parse_backfill(section: _Section, source: SourceSpec) -> BackfillSpec:
    column = section.get("event_time_column", str)
    spec = BackfillSpec(
        event_time_column=column,
        max_range_days=section.positive_int("max_range_days", maximum=BACKFILL_MAX_RANGE_DAYS)
        or BackfillSpec.max_range_days,
        clock_skew_seconds=section.bounded_int("clock_skew_seconds", BackfillSpec.clock_skew_seconds, minimum=0,
                                               maximum=BACKFILL_MAX_CLOCK_SKEW_SECONDS),
    )
    section.done()
    if column is not None:
        types = {c.name: c.sql_type.lower() for c in source.schema.columns}
        if types.get(column) != "timestamp":
            raise section.error("event_time_column", f"must name a timestamp column of the source schema, got "
                                f"{column!r} ({types.get(column, 'not declared')})")
    return spec


def _check_transform(stream: str, name: str, source: SourceSpec) -> list[str]:
    """The columns the row transform hands on: the source's, plus those it adds."""
    spec = TRANSFORMS.get(name)
    if spec is None:
        raise CatalogError(f"unknown transform {name!r}; known transforms: {', '.join(sorted(TRANSFORMS))}",
                           stream=stream, field="transform")
    missing = [column for column in spec.required_columns if column not in source.schema.names]
    if missing:
        raise CatalogError(f"transform {name!r} needs column(s) {', '.join(missing)}, which the source schema "
                           "does not declare", stream=stream, field="transform")
    return [*source.schema.names, *(column for column in spec.adds_columns if column not in source.schema.names)]


def _parse_patterns(top: _Section) -> Patterns:
    return Patterns(
        watermark=parse_watermark(top.section("watermark")),
        dedupe=parse_dedupe(top.section("dedupe")),
        join=parse_join(top.section("join"), _parse_source),
        lookup=parse_lookups(top, "lookup"),
        aggregate=parse_aggregate(top.section("aggregate")),
        fan_out=parse_fan_out(top, "fan_out"),
    )


def parse_stream(raw: object, *, index: int) -> StreamSpec:
    """Validate one catalog entry."""
    if not isinstance(raw, Mapping):
        raise CatalogError(f"expected a mapping, got {type(raw).__name__}", field=f"streams[{index}]")
    name = raw.get("name")
    if not isinstance(name, str) or not _STREAM_NAME.match(name):
        raise CatalogError(f"name must match {_STREAM_NAME.pattern} (it becomes a DAG id and a lock name), "
                           f"got {name!r}", field=f"streams[{index}].name")
    top = _Section(raw, stream=name, path="")
    top.get("name", str)
    description = top.get("description", str, "")
    source = _parse_source(name, top.section("source", required=True))
    transform = top.get("transform", str, "identity")
    sink = _parse_sink(name, top.section("sink", required=True))
    patterns = _parse_patterns(top)
    output_columns = check_patterns(name, patterns, _check_transform(name, transform, source), source, sink,
                                    required=set(source.schema.required))
    if sink.key_column is not None and sink.key_column not in output_columns:
        raise CatalogError(f"key column {sink.key_column!r} is not produced by the stream; output columns: "
                           f"{', '.join(output_columns)}", stream=name, field="sink.key_column")
    if sink.format is SinkFormat.KAFKA and (sink.mode is not SinkMode.APPEND or patterns.fan_out):
        raise CatalogError("a kafka sink takes appended rows and no fan_out: Sluice sends each row once per batch, "
                           "and a topic cannot be upserted or rewritten", stream=name,
                           field="sink.mode" if sink.mode is not SinkMode.APPEND else "fan_out")
    dead_letter = top.section("dead_letter")
    dead_letter_path = check_relative_path(
        dead_letter.get("path", str, f"{sink.path}_dead_letter" if sink.path else f"_dead_letter/{name}"),
        stream=name, field="dead_letter.path"
    )
    dead_letter.done()
    checkpoint = check_relative_path(top.get("checkpoint", str, name), stream=name, field="checkpoint")
    schedule = top.get("schedule", str, required=source.type is not SourceType.DELTA)
    if schedule is not None and not croniter.is_valid(schedule):
        raise top.error("schedule", f"{schedule!r} is not a valid cron expression (five fields, e.g. '*/5 * * * *')")
    trigger = _parse_trigger(top.section("trigger"))
    if source.type is SourceType.KAFKA and (trigger.max_files_per_trigger or trigger.max_bytes_per_trigger):
        raise top.error("trigger", "a kafka source has no files or bytes limits; set source.options."
                                   "maxOffsetsPerTrigger")
    alerts = _parse_alerts(top.section("alerts"))
    allow_new_query_id = top.get("allow_new_query_id", bool, False)
    backfill = _parse_backfill(top.section("backfill"), source)
    owner = top.get("owner", str, "data-eng")
    tags = top.get("tags", list, [])
    if not all(isinstance(tag, str) and tag for tag in tags):
        raise top.error("tags", f"expected a list of strings, got {tags!r}")
    top.done()
    stream = StreamSpec(
        name=name,
        description=description,
        source=source,
        transform=transform,
        sink=sink,
        dead_letter_path=dead_letter_path,
        checkpoint=checkpoint,
        schedule=schedule,
        trigger=trigger,
        alerts=alerts,
        owner=owner,
        tags=tuple(tags),
        allow_new_query_id=allow_new_query_id,
        backfill=backfill,
        patterns=patterns,
        output_columns=tuple(output_columns),
    )
    for written in stream.written_paths:
        _check_own_name(written)
    return stream


def _check_own_name(written: WrittenPath) -> None:
    """Refuse a written path that takes a name Sluice gives its own folders."""
    parts = path_key(written.path)[1]
    if not is_absolute(written.path) and parts[0] in RESERVED_ROOT_FOLDERS:
        raise written.error(f"path {written.path!r} starts with {parts[0]}/, a folder Sluice keeps for itself under "
                            f"the checkpoint root; reserved: {', '.join(RESERVED_ROOT_FOLDERS)}")
    if written.root == "checkpoints" and any(marker in parts[-1] for marker in REPAIR_COPY_MARKERS):
        raise written.error(f"path {written.path!r} looks like a copy the repair tools make beside a checkpoint "
                            f"(<checkpoint>{'<time>, <checkpoint>'.join(REPAIR_COPY_MARKERS)}<time>), which an "
                            "operator may delete; rename it")


_Key = tuple[str, tuple[str, ...]]


def _inside(outer: _Key, inner: _Key) -> bool:
    """True when ``inner`` is ``outer`` or lies under it."""
    return outer[0] == inner[0] and inner[1][:len(outer[1])] == outer[1]


def _show(key: _Key) -> str:
    storage, parts = key
    return storage + "/".join(parts) if storage.endswith("/") else "/".join((storage, *parts))


class _Claims:
    """The folders the streams write. Two of them must not be one folder: checkpoints would mix two queries'
    logs, tables two streams' commits (and a batch's second write would be skipped as a replay). One must not lie
    inside another either: a table's VACUUM deletes the files it does not know, and a checkpoint's repair moves
    everything under it."""

    def __init__(self) -> None:
        self.claims: dict[_Key, tuple[WrittenPath, str]] = {}
        # Every folder above a claimed one, with a claim below it.
        self.above: dict[_Key, tuple[WrittenPath, str]] = {}

    def overlapping(self, key: _Key) -> WrittenPath | None:
        """A claim that is ``key``, lies inside it, or holds it."""
        storage, parts = key
        for length in range(len(parts), 0, -1):
            found = self.claims.get((storage, parts[:length]))
            if found is not None:
                return found[0]
        found = self.above.get(key)
        return found[0] if found is not None else None

    def claim(self, key: _Key, written: WrittenPath, *, shown: str) -> None:
        storage, parts = key
        if key in self.claims:
            other, other_shown = self.claims[key]
            raise written.error(f"{written.what} {shown} is already used by stream '{other.stream}' as its "
                                f"{other.what} {other_shown}; each stream needs its own")
        for length in range(len(parts) - 1, 0, -1):
            if (storage, parts[:length]) in self.claims:
                other, other_shown = self.claims[(storage, parts[:length])]
                raise written.error(f"{written.what} {shown} lies inside the {other.what} {other_shown} of stream "
                                    f"'{other.stream}'; {self.why(written, other)}")
        if key in self.above:
            other, other_shown = self.above[key]
            raise written.error(f"{written.what} {shown} holds the {other.what} {other_shown} of stream "
                                f"'{other.stream}'; {self.why(written, other)}")
        self.claims[key] = (written, shown)
        for length in range(len(parts) - 1, 0, -1):
            self.above.setdefault((storage, parts[:length]), (written, shown))

    @staticmethod
    def why(written: WrittenPath, other: WrittenPath) -> str:
        kinds = {written.root, other.root}
        if kinds == {"checkpoints"}:
            return "a checkpoint's repair and reset move everything under it; give each its own folder"
        if kinds == {"lake"}:
            return "a table's VACUUM deletes the files it does not know; give each its own folder"
        return "a table's VACUUM would delete the checkpoint's files; give each its own folder"


def parse_catalog(raw: object, *, source_file: str | None = None) -> Catalog:
    """Validate a whole catalog document, including what streams must not share."""
    top = _Section(raw, stream=None, path="")
    version = top.get("version", int, 1)
    if version != 1:
        raise top.error("version", f"unsupported catalog version {version}; this Sluice reads version 1")
    entries = top.get("streams", list, required=True)
    top.done()
    streams: dict[str, StreamSpec] = {}
    claims = _Claims()
    for index, entry in enumerate(entries):
        stream = parse_stream(entry, index=index)
        if stream.name in streams:
            raise CatalogError("is defined twice", stream=stream.name, field="name")
        for written in stream.written_paths:
            # Relative paths are compared under their own root; absolute ones with each other, whatever they are
            # (Catalog.check_roots compares across roots once they are known).
            storage, parts = path_key(written.path)
            key = (storage or f"<{written.root} root>/", parts)
            claims.claim(key, written, shown=repr(written.path))
        streams[stream.name] = stream
    catalog = Catalog(streams=streams, source_file=source_file)
    for stream in catalog:
        upstreams = catalog.upstreams_of(stream)
        if any(upstream.name == stream.name for upstream in upstreams):
            raise CatalogError("a stream cannot read its own table", stream=stream.name, field="source.path")
        if stream.schedule is None and not upstreams:
            raise CatalogError(f"is required: no stream of the catalog writes {stream.source.path!r}, so there is no "
                               "table update to schedule the stream on", stream=stream.name, field="schedule")
    return catalog


def load_catalog(path: str | os.PathLike[str] | None = None) -> Catalog:
    """Load and validate a catalog file (default: ``SLUICE_CATALOG`` or the bundled ``streams.yaml``)."""
    catalog_path = Path(path or os.environ.get("SLUICE_CATALOG") or DEFAULT_CATALOG)
    chunks: list[bytes] = []
    size = 0
    try:
        with catalog_path.open("rb") as handle:
            # In pieces: a catalog path may name a pipe or a device that never ends.
            while chunk := handle.read(64 * 1024):
                size += len(chunk)
                if size > CATALOG_MAX_BYTES:
                    raise CatalogError(f"catalog {catalog_path} is larger than {CATALOG_MAX_BYTES:,} bytes")
                chunks.append(chunk)
    except OSError as exc:
        raise CatalogError(f"cannot read catalog {catalog_path}: {exc.strerror or exc}") from exc
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CatalogError(f"catalog {catalog_path} is not UTF-8: {exc}") from exc
    return parse_catalog(load_yaml(text, source=str(catalog_path)), source_file=str(catalog_path))
