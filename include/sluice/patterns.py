"""The stateful patterns a catalog stream may declare, and the output-mode rules that govern them.

A stream runs, in this order: source -> dead-letter split -> row transform -> ``dedupe`` -> ``join`` (stream-stream)
-> ``lookup`` (stream-static) -> ``aggregate`` -> sink. Every stateful step needs the stream's ``watermark`` so
that its state is evicted and a finalized result can be emitted; the catalog refuses a combination that Spark would
refuse at analysis time, or that it would accept and then keep state forever, and it says how to fix it.

This module has no pyspark import: the catalog is validated in the Airflow scheduler.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from sluice.constants import SinkMode, SourceType
from sluice.errors import CatalogError
from sluice.limits import DAY_SECONDS, MAX_DURATION_SECONDS
from sluice.paths import check_relative_path
from sluice.schema import Schema

if TYPE_CHECKING:
    from sluice.catalog import SinkSpec, SourceSpec, _Section

# At most 12 digits: Python refuses to convert a number of thousands of digits, and no bound needs more.
_INTERVAL = re.compile(r"^\s*(\d{1,12})\s*(seconds?|s|minutes?|min|m|hours?|h|days?|d)\s*$", re.IGNORECASE)
# Keyed by the unit's first letter, which tells seconds, minutes, hours and days apart.
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_MEASURE = re.compile(r"^\s*(count|sum|min|max|avg|approx_count_distinct)\s*\(\s*(\*|[A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")
_IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
WINDOW_START = "window_start"
WINDOW_END = "window_end"


def parse_interval(text: object, *, stream: str, field_name: str) -> int:
    """``"10 minutes"``, ``"1 hour"``, ``"30s"``... as whole seconds (at least one, at most 3650 days)."""
    match = _INTERVAL.match(text) if isinstance(text, str) else None
    if match is None or int(match.group(1)) <= 0:
        raise CatalogError(f"expected a positive duration such as '10 minutes', '1 hour' or '30s', got {text!r}",
                           stream=stream, field=field_name)
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)[0].lower()]
    if seconds > MAX_DURATION_SECONDS:
        raise CatalogError(f"must be at most {MAX_DURATION_SECONDS // DAY_SECONDS} days ({MAX_DURATION_SECONDS:,} "
                           f"seconds, Sluice's bound for a duration), got {text!r}", stream=stream, field=field_name)
    return seconds


def spark_interval(seconds: int) -> str:
    """The interval string Spark's ``withWatermark``/``window`` take."""
    return f"{seconds} seconds"


@dataclass(frozen=True)
class WatermarkSpec:
    """``withWatermark(column, delay)``: events older than the newest event time seen minus ``delay`` are late."""

    column: str
    delay_seconds: int


@dataclass(frozen=True)
class DedupeSpec:
    """``dropDuplicatesWithinWatermark(keys)``: a row whose keys were seen within the watermark delay is dropped.
    State for a key is kept until the watermark passes its first event time plus the delay."""

    keys: tuple[str, ...]


@dataclass(frozen=True)
class LookupSpec:
    """A stream-static left join with a dimension Delta table (under the lake root), read once per run."""

    table: str
    on: tuple[str, ...]
    columns: tuple[str, ...]


class JoinType(str, Enum):
    INNER = "inner"
    LEFT_OUTER = "left_outer"


@dataclass(frozen=True)
class JoinSpec:
    """A stream-stream join with a second Delta source, bounded in event time on both sides.

    A right row joins a left row with equal ``on`` keys when ``left.<left_time> <= right.<right_time> <=
    left.<left_time> + max_delay``. Both sides carry a watermark, so each side's state is evicted once no future row
    of the other side can match it; a left-outer row is emitted with NULLs once that is certain.
    """

    source: SourceSpec
    watermark: WatermarkSpec
    on: tuple[str, ...]
    left_time: str
    right_time: str
    max_delay_seconds: int
    type: JoinType = JoinType.INNER


class WindowType(str, Enum):
    TUMBLING = "tumbling"
    SLIDING = "sliding"
    SESSION = "session"


@dataclass(frozen=True)
class WindowSpec:
    """An event-time window over ``column``: tumbling (``duration``), sliding (``duration`` every ``slide``) or
    session (closed after ``gap`` without an event)."""

    type: WindowType
    column: str
    duration_seconds: int = 0
    slide_seconds: int = 0
    gap_seconds: int = 0


@dataclass(frozen=True)
class Measure:
    """``name: function(column)`` in the catalog, e.g. ``revenue: sum(amount)``."""

    name: str
    function: str
    column: str  # "*" for count(*)


@dataclass(frozen=True)
class AggregateSpec:
    window: WindowSpec | None
    group_by: tuple[str, ...]
    measures: tuple[Measure, ...]

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The columns that identify one result row: the window bounds and the grouping columns."""
        return ((WINDOW_START, WINDOW_END) if self.window else ()) + self.group_by


@dataclass(frozen=True)
class FanOutSpec:
    """One more table fed from the same batch: the good rows for which ``where`` (a Spark SQL predicate over the
    output columns) is true, optionally only some ``columns``."""

    path: str
    where: str
    columns: tuple[str, ...] = ()
    partition_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class Patterns:
    """Everything a stream declares beyond a row-wise transform."""

    watermark: WatermarkSpec | None = None
    dedupe: DedupeSpec | None = None
    join: JoinSpec | None = None
    lookup: tuple[LookupSpec, ...] = ()
    aggregate: AggregateSpec | None = None
    fan_out: tuple[FanOutSpec, ...] = field(default_factory=tuple)

    @property
    def stateful(self) -> bool:
        return self.dedupe is not None or self.join is not None or self.aggregate is not None


# -- parsing ---------------------------------------------------------------------------------------------------------

def _names(section: _Section, key: str, *, required: bool = False) -> tuple[str, ...]:
    values = section.get(key, list, [], required=required)
    if required and not values:
        raise section.error(key, "must name at least one column")
    if not all(isinstance(value, str) and value for value in values):
        raise section.error(key, f"expected a list of column names, got {values!r}")
    if len(set(values)) != len(values):
        raise section.error(key, f"lists a column twice: {values}")
    return tuple(values)


def parse_watermark(section: _Section) -> WatermarkSpec | None:
    if not section.raw:
        return None
    spec = WatermarkSpec(
        column=section.get("column", str, required=True),
        delay_seconds=parse_interval(section.get("delay", str, required=True), stream=section.stream or "",
                                     field_name=section.field("delay")),
    )
    section.done()
    return spec


def parse_dedupe(section: _Section) -> DedupeSpec | None:
    if not section.raw:
        return None
    spec = DedupeSpec(keys=_names(section, "keys", required=True))
    section.done()
    return spec


def parse_lookups(owner: _Section, key: str) -> tuple[LookupSpec, ...]:
    entries = owner.get(key, list, [])
    lookups = []
    for index, raw in enumerate(entries):
        section = type(owner)(raw, stream=owner.stream or "", path=f"{owner.field(key)}[{index}]")
        table = check_relative_path(section.get("table", str, required=True), stream=owner.stream or "",
                                    field=section.field("table"))
        lookups.append(LookupSpec(table=table, on=_names(section, "on", required=True),
                                  columns=_names(section, "columns", required=True)))
        section.done()
    return tuple(lookups)


def parse_join(section: _Section, parse_source: Callable[[str, _Section], SourceSpec]) -> JoinSpec | None:
    if not section.raw:
        return None
    stream = section.stream or ""
    source = parse_source(stream, section.section("source", required=True))
    watermark = parse_watermark(section.section("watermark", required=True))
    assert watermark is not None
    within = section.section("within", required=True)
    spec = JoinSpec(
        source=source,
        watermark=watermark,
        on=_names(section, "on", required=True),
        type=section.enum("type", JoinType, JoinType.INNER),
        left_time=within.get("left", str, required=True),
        right_time=within.get("right", str, required=True),
        max_delay_seconds=parse_interval(within.get("max_delay", str, required=True), stream=stream,
                                         field_name=within.field("max_delay")),
    )
    within.done()
    section.done()
    return spec


def parse_aggregate(section: _Section) -> AggregateSpec | None:
    if not section.raw:
        return None
    stream = section.stream or ""
    window: WindowSpec | None = None
    window_section = section.section("window")
    if window_section.raw:
        kind = window_section.enum("type", WindowType, required=True)

        def interval(key: str, *, required: bool) -> int:
            value = window_section.get(key, str, required=required)
            return 0 if value is None else parse_interval(value, stream=stream, field_name=window_section.field(key))

        window = WindowSpec(
            type=kind,
            column=window_section.get("column", str, required=True),
            duration_seconds=interval("duration", required=kind is not WindowType.SESSION),
            slide_seconds=interval("slide", required=kind is WindowType.SLIDING),
            gap_seconds=interval("gap", required=kind is WindowType.SESSION),
        )
        window_section.done()
        if kind is WindowType.SESSION and window.duration_seconds:
            raise window_section.error("duration", "a session window has a gap, not a duration")
        if kind is not WindowType.SLIDING and window.slide_seconds:
            raise window_section.error("slide", f"a {kind.value} window does not slide; use type: sliding")
        if kind is not WindowType.SESSION and window.gap_seconds:
            raise window_section.error("gap", "only a session window has a gap")
        if kind is WindowType.SLIDING and window.slide_seconds > window.duration_seconds:
            raise window_section.error("slide", "a slide longer than the window duration would skip events")
    measures_section = section.section("measures", required=True)
    measures = []
    for name, expression in measures_section.raw.items():
        measures_section.allowed.add(name)
        match = _MEASURE.match(expression) if isinstance(expression, str) else None
        if not isinstance(name, str) or not _IDENTIFIER.match(name):
            raise measures_section.error(str(name), f"a measure name must match {_IDENTIFIER.pattern}")
        if match is None:
            raise measures_section.error(name, f"expected function(column) with function one of count, sum, min, "
                                               f"max, avg, approx_count_distinct, got {expression!r}")
        function, column = match.group(1), match.group(2)
        if column == "*" and function != "count":
            raise measures_section.error(name, f"{function}(*) is not defined; name a column")
        measures.append(Measure(name, function, column))
    if not measures:
        raise section.error("measures", "must define at least one measure")
    spec = AggregateSpec(window=window, group_by=_names(section, "group_by"), measures=tuple(measures))
    section.done()
    return spec


def parse_fan_out(owner: _Section, key: str) -> tuple[FanOutSpec, ...]:
    outputs = []
    for index, raw in enumerate(owner.get(key, list, [])):
        section = type(owner)(raw, stream=owner.stream or "", path=f"{owner.field(key)}[{index}]")
        path = check_relative_path(section.get("path", str, required=True), stream=owner.stream or "",
                                   field=section.field("path"))
        where = section.get("where", str, required=True)
        if ";" in where:
            raise section.error("where", "a predicate is one SQL expression; ';' is not allowed")
        outputs.append(FanOutSpec(path=path, where=where, columns=_names(section, "columns"),
                                  partition_by=_names(section, "partition_by")))
        section.done()
    return tuple(outputs)


# -- validation ------------------------------------------------------------------------------------------------------

def check_patterns(stream: str, patterns: Patterns, columns: list[str], source: SourceSpec, sink: SinkSpec,
                   required: set[str]) -> list[str]:
    """Validate the patterns against the columns the row transform produces; return the stream's output columns
    (without Sluice's metadata columns). ``required`` holds the columns declared ``not null``."""

    def refuse(field_name: str, message: str) -> CatalogError:
        return CatalogError(message, stream=stream, field=field_name)

    def need(names: tuple[str, ...], available: list[str], field_name: str, what: str) -> None:
        missing = [name for name in names if name not in available]
        if missing:
            raise refuse(field_name, f"{what} {', '.join(missing)} not among the columns available here: "
                                     f"{', '.join(available)}")

    watermark, aggregate, join = patterns.watermark, patterns.aggregate, patterns.join
    available = list(columns)
    if watermark is not None:
        need((watermark.column,), available, "watermark.column", "column")
        _need_timestamp(source.schema, watermark.column, lambda message: refuse("watermark.column", message))
    if watermark is not None and not patterns.stateful:
        raise refuse("watermark", "a watermark bounds the state of dedupe, join or aggregate, and this stream has "
                                  "none of them; remove it")
    if patterns.dedupe is not None:
        need(patterns.dedupe.keys, available, "dedupe.keys", "key column(s)")
        if watermark is None:
            raise refuse("dedupe", "deduplication without a watermark keeps every key seen in state forever; add "
                                   "`watermark: {column: <event time>, delay: <how late a duplicate may come>}`")
    if join is not None:
        if watermark is None:
            raise refuse("join", "a stream-stream join needs a watermark on both sides; add `watermark` for this "
                                 "stream's side")
        if join.source.type is not SourceType.DELTA:
            raise refuse("join.source.type", "the joined stream must be a Delta table (type: delta)")
        right_columns = join.source.schema.names
        need(join.on, available, "join.on", "key column(s)")
        need(join.on, right_columns, "join.on", "key column(s) of the joined source:")
        need((join.left_time,), available, "join.within.left", "column")
        need((join.right_time,), right_columns, "join.within.right", "column of the joined source:")
        need((join.watermark.column,), right_columns, "join.watermark.column", "column of the joined source:")
        _need_timestamp(join.source.schema, join.right_time, lambda message: refuse("join.within.right", message))
        if join.left_time != watermark.column:
            raise refuse("join.within.left", f"the time bound must use the watermark column {watermark.column!r}, "
                                             "or Spark cannot evict the join state")
        if join.right_time != join.watermark.column:
            raise refuse("join.within.right", f"the time bound must use the joined source's watermark column "
                                              f"{join.watermark.column!r}, or Spark cannot evict the join state")
        clashes = [name for name in right_columns if name in available and name not in join.on]
        if clashes:
            raise refuse("join.source.schema", f"column(s) {', '.join(clashes)} exist on both sides; rename them "
                                               "in one source's schema (only the join keys may be shared)")
        available += [name for name in right_columns if name not in join.on]
    for index, lookup in enumerate(patterns.lookup):
        need(lookup.on, available, f"lookup[{index}].on", "key column(s)")
        clashes = [name for name in lookup.columns if name in available]
        if clashes:
            raise refuse(f"lookup[{index}].columns", f"column(s) {', '.join(clashes)} already exist in the stream")
        available += list(lookup.columns)
    output = available
    if aggregate is not None:
        if join is not None:
            raise refuse("aggregate", "an aggregate over a stream-stream join is not supported; write the join to "
                                      "a table and aggregate it in a downstream stream")
        need(aggregate.group_by, available, "aggregate.group_by", "column(s)")
        for measure in aggregate.measures:
            if measure.column != "*":
                need((measure.column,), available, f"aggregate.measures.{measure.name}", "column")
        if aggregate.window is not None:
            need((aggregate.window.column,), available, "aggregate.window.column", "column")
        output = list(aggregate.key_columns) + [measure.name for measure in aggregate.measures]
        if len(set(output)) != len(output):
            raise refuse("aggregate.measures", f"a measure name repeats a key column: {output}")
    _check_output_mode(patterns, sink, output, required, refuse)
    for index, fan_out in enumerate(patterns.fan_out):
        need(fan_out.columns, output, f"fan_out[{index}].columns", "column(s)")
        kept = list(fan_out.columns) or output
        need(fan_out.partition_by, kept, f"fan_out[{index}].partition_by", "column(s)")
    need(sink.partition_by, output, "sink.partition_by", "partition column(s)")
    return output


def _need_timestamp(schema: Schema, column: str, refuse: Callable[[str], CatalogError]) -> None:
    """A declared event-time column must be a timestamp (one a row transform adds is checked by Spark)."""
    types = {c.name: c.sql_type for c in schema.columns}
    if column in types and types[column] != "TIMESTAMP":
        raise refuse(f"an event-time column must be a timestamp; {column!r} is {types[column]}")


def _check_output_mode(patterns: Patterns, sink: SinkSpec, output: list[str], required: set[str],
                       refuse: Callable[[str, str], CatalogError]) -> None:
    """Spark's output-mode rules, checked before Spark is started, each with its fix."""
    aggregate, watermark = patterns.aggregate, patterns.watermark
    mode = sink.mode
    if mode is SinkMode.COMPLETE and aggregate is None:
        raise refuse("sink.mode", "complete mode rewrites the whole result every batch and needs an `aggregate`; "
                                  "use mode append (or merge with keys) for row streams")
    windowed = aggregate is not None and aggregate.window is not None
    if windowed and mode is not SinkMode.COMPLETE and watermark is None:
        raise refuse("watermark", f"an aggregate in {mode.value} mode needs a watermark, or its state grows forever "
                                  "(append mode would never emit a row); add `watermark: {column, delay}` on the "
                                  "event-time column, or use sink.mode complete for a small result")
    if aggregate is not None and mode is SinkMode.APPEND:
        window = aggregate.window
        if window is None or watermark is None or window.column != watermark.column:
            raise refuse("sink.mode", "append mode emits an aggregate row once, when the watermark finalizes it, "
                                      "which needs an event-time `aggregate.window` on the watermark column; "
                                      "use sink.mode merge to upsert running results instead")
    if aggregate is not None and mode is SinkMode.MERGE:
        if sink.keys:
            raise refuse("sink.keys", f"an aggregate is merged on its own keys ({', '.join(aggregate.key_columns)}); "
                                      "remove sink.keys")
        if aggregate.window is not None and aggregate.window.type is WindowType.SESSION:
            raise refuse("sink.mode", "a session window's bounds move as events arrive, so an upserted session "
                                      "would leave its earlier versions behind; use sink.mode append")
        if not aggregate.key_columns:
            raise refuse("aggregate", "a merged aggregate needs a window or group_by columns to key its rows")
    if patterns.join is not None and mode is not SinkMode.APPEND:
        raise refuse("sink.mode", "a stream-stream join emits append-only output; use sink.mode append")
    if mode is SinkMode.MERGE and aggregate is None:
        if not sink.keys:
            raise refuse("sink.keys", "merge mode upserts by key: name the key column(s) in sink.keys")
        if not sink.sequence_by:
            raise refuse("sink.sequence_by", "a batch may carry several versions of a key, and a late version must "
                                             "not overwrite a newer one: name the column that orders them (e.g. "
                                             "updated_at) in sink.sequence_by")
        missing = [key for key in sink.keys if key not in output]
        if missing:
            raise refuse("sink.keys", f"column(s) {', '.join(missing)} are not in the output: {', '.join(output)}")
        if sink.sequence_by not in output:
            raise refuse("sink.sequence_by", f"column {sink.sequence_by!r} is not in the output: {', '.join(output)}")
        if sink.sequence_by not in required:
            raise refuse("sink.sequence_by", f"{sink.sequence_by!r} must be declared `not null` in the source schema: "
                                             "a version without a sequence cannot be ordered against the others")
        nullable = [key for key in sink.keys if key not in required]
        if nullable:
            raise refuse("sink.keys", f"merge key(s) {', '.join(nullable)} must be declared `not null` in the "
                                      "source schema: a row with a NULL key can never be matched again")
    elif sink.sequence_by:
        raise refuse("sink.sequence_by", "only merge mode with sink.keys orders rows by a sequence column")
    if patterns.fan_out and mode is SinkMode.COMPLETE:
        raise refuse("fan_out", "fan-out tables are appended to, and complete mode re-emits the whole result every "
                                "batch; fan out from an append or merge stream")
