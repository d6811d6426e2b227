"""Read and check the patterns of a stream (:mod:`sluice.model.patterns`): the parsers of each section, and the
rules that tie them to the stream's columns and its sink's output mode.

This module has no pyspark import: the catalog is validated in the Airflow scheduler.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from sluice.constants import (
    CDC_END_COLUMN,
    CDC_START_COLUMN,
    DEBEZIUM_OP_COLUMN,
    Envelope,
    SchemaEvolution,
    SinkMode,
)
from sluice.errors import CatalogError
from sluice.kinds import parse_source
from sluice.kinds.delta import DeltaSink, DeltaSource
from sluice.kinds.iceberg import ICEBERG_IDENTIFIER
from sluice.model.patterns import (
    AggregateSpec,
    DedupeSpec,
    FanOutSpec,
    JoinSpec,
    JoinType,
    LookupSpec,
    Measure,
    Patterns,
    WatermarkSpec,
    WindowSpec,
    WindowType,
)
from sluice.model.schema import Schema
from sluice.model.section import Section
from sluice.model.sinks import CdcSpec, SinkSpec
from sluice.model.sources import SourceSpec
from sluice.model.sql import Columns, Shape, SqlError, check_expression, parse_sql
from sluice.storage.iceberg_files import parse_partition

_MEASURE = re.compile(r"^\s*(count|sum|min|max|avg|approx_count_distinct)\s*\(\s*(\*|[A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")
_IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def parse_patterns(top: Section) -> Patterns:
    """Every pattern section of a stream entry."""
    return Patterns(
        watermark=parse_watermark(top.section("watermark")),
        dedupe=parse_dedupe(top.section("dedupe")),
        join=parse_join(top.section("join")),
        lookup=parse_lookups(top, "lookup"),
        aggregate=parse_aggregate(top.section("aggregate")),
        fan_out=parse_fan_out(top, "fan_out"),
    )


def parse_watermark(section: Section) -> WatermarkSpec | None:
    if not section.raw:
        return None
    spec = WatermarkSpec(
        column=section.get("column", str, required=True),
        delay_seconds=section.interval("delay", required=True) or 0,
    )
    section.done()
    return spec


def parse_dedupe(section: Section) -> DedupeSpec | None:
    if not section.raw:
        return None
    spec = DedupeSpec(keys=section.names("keys", required=True))
    section.done()
    return spec


def parse_lookups(owner: Section, key: str) -> tuple[LookupSpec, ...]:
    lookups = []
    for section in owner.items(key):
        table = section.folder("table")
        lookups.append(LookupSpec(table=table, on=section.names("on", required=True),
                                  columns=section.names("columns", required=True)))
        section.done()
    return tuple(lookups)


def parse_join(section: Section) -> JoinSpec | None:
    if not section.raw:
        return None
    joined = section.section("source", required=True)
    source = parse_source(joined)
    if not isinstance(source, DeltaSource):
        raise section.error("source.type", "the joined stream must be a Delta table (type: delta)")
    # A join keeps whole rows in its state: the joined side reads its declared columns, as under none.
    if "schema_evolution" in joined.raw and source.schema_evolution is not SchemaEvolution.NONE:
        raise joined.error("schema_evolution", "the joined side of a stream-stream join reads its declared columns "
                                               "only; it takes none")
    source = dataclasses.replace(source, schema_evolution=SchemaEvolution.NONE)
    watermark = parse_watermark(section.section("watermark", required=True))
    assert watermark is not None
    within = section.section("within", required=True)
    spec = JoinSpec(
        source=source,
        watermark=watermark,
        on=section.names("on", required=True),
        type=section.enum("type", JoinType, JoinType.INNER),
        left_time=within.get("left", str, required=True),
        right_time=within.get("right", str, required=True),
        max_delay_seconds=within.interval("max_delay", required=True) or 0,
    )
    within.done()
    section.done()
    return spec


def parse_aggregate(section: Section) -> AggregateSpec | None:
    if not section.raw:
        return None
    window: WindowSpec | None = None
    window_section = section.section("window")
    if window_section.raw:
        kind = window_section.enum("type", WindowType, required=True)
        window = WindowSpec(
            type=kind,
            column=window_section.get("column", str, required=True),
            duration_seconds=window_section.interval("duration", required=kind is not WindowType.SESSION) or 0,
            slide_seconds=window_section.interval("slide", required=kind is WindowType.SLIDING) or 0,
            gap_seconds=window_section.interval("gap", required=kind is WindowType.SESSION) or 0,
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
        if not isinstance(name, str) or not _IDENTIFIER.match(name):
            raise measures_section.error(str(name), f"a measure name must match {_IDENTIFIER.pattern}")
        try:
            parse_sql(expression, what="the measure", shape=Shape.GROUP)
        except SqlError as exc:
            raise measures_section.error(name, str(exc)) from None
        match = _MEASURE.match(expression)
        if match is None:
            raise measures_section.error(name, f"expected function(column) with function one of count, sum, min, "
                                               f"max, avg, approx_count_distinct, got {expression!r}")
        function, column = match.group(1), match.group(2)
        if column == "*" and function != "count":
            raise measures_section.error(name, f"{function}(*) is not defined; name a column")
        measures.append(Measure(name, function, column))
    if not measures:
        raise section.error("measures", "must define at least one measure")
    spec = AggregateSpec(window=window, group_by=section.names("group_by"), measures=tuple(measures))
    section.done()
    return spec


def parse_fan_out(owner: Section, key: str) -> tuple[FanOutSpec, ...]:
    """Each fan-out table: a Delta table by ``path``, or an Iceberg table of an Iceberg sink's catalog by ``table``
    (its ``partition_by`` Iceberg transforms); the loader checks it is the kind its sink takes."""
    outputs = []
    for section in owner.items(key):
        table = section.get("table", str)
        if table is not None and "path" in section.raw:
            raise section.error("table", "a fan-out table is a Delta table by path or an Iceberg table by table, "
                                         "not both")
        path = section.folder("path") if table is None else ""
        if table is not None and not ICEBERG_IDENTIFIER.match(table):
            raise section.error("table", f"expected an Iceberg identifier namespace.table (letters, digits, '_'), "
                                         f"got {table!r}")
        where = section.get("where", str, required=True)
        partition_by = section.names("partition_by")
        if table is not None:
            try:
                partitioned = [parse_partition(text).column for text in partition_by]
            except ValueError as error:
                raise section.error("partition_by", str(error)) from None
            if len(set(partitioned)) != len(partitioned):  # pyiceberg's writer takes one field per source column
                raise section.error("partition_by", f"one transform per column, got {list(partition_by)!r}")
        unpartition = table is not None and section.raw.get("partition_by") == []
        outputs.append(FanOutSpec(path=path, where=where, columns=section.names("columns"),
                                  partition_by=partition_by, table=table, unpartition=unpartition))
        section.done()
    return tuple(outputs)


# -- validation ------------------------------------------------------------------------------------------------------

def check_patterns(stream: str, patterns: Patterns, columns: Columns, source: SourceSpec, sink: SinkSpec,
                   required: set[str]) -> list[str]:
    """Validate the patterns against the columns (with their types, where known) the row transform produces; return
    the stream's output columns (without Sluice's metadata columns). ``required`` holds the columns declared
    ``not null``."""
    check = _Columns(stream, list(columns))
    check.watermark_and_dedupe(patterns, source)
    if patterns.join is not None:
        check.join(patterns.join, patterns.watermark)
    check.lookups(patterns.lookup)
    output = check.aggregate(patterns.aggregate, joined=patterns.join is not None)
    _check_output_mode(patterns, sink, output, required, check.refuse)
    # A measure may reuse an input column's name with another type: the output's types are known without one.
    output_types = {name: None if patterns.aggregate else columns.get(name) for name in output}
    for index, fan_out in enumerate(patterns.fan_out):
        try:
            check_expression(fan_out.where, output_types, what="the condition")
        except SqlError as exc:
            raise check.refuse(f"fan_out[{index}].where", str(exc)) from None
        check.need(fan_out.columns, output, f"fan_out[{index}].columns", "column(s)")
        kept = list(fan_out.columns) or output
        partitioned = (fan_out.partition_by if fan_out.table is None else
                       tuple(parse_partition(text).column for text in fan_out.partition_by))
        check.need(partitioned, kept, f"fan_out[{index}].partition_by", "column(s)")
    if isinstance(sink, DeltaSink):
        check.need(sink.partition_by, output, "sink.partition_by", "partition column(s)")
        if sink.mode is SinkMode.CDC:
            _check_cdc(sink, source, output, output_types, check)
    return output


def _check_cdc(sink: DeltaSink, source: SourceSpec, output: list[str], types: Columns, check: _Columns) -> None:
    """A cdc block against the stream's output: its delete predicate, and the columns it leaves out or tracks."""
    cdc = sink.cdc or CdcSpec()
    delete_when = cdc.delete_when if cdc.delete_when is not None else default_delete_when(source)
    if delete_when is not None:
        try:
            check_expression(delete_when, types, what="the delete predicate")
        except SqlError as exc:
            raise check.refuse("sink.cdc.delete_when", str(exc)) from None
    check.need(cdc.except_columns, output, "sink.cdc.except_columns", "column(s)")
    kept = [name for name in (*sink.keys, sink.sequence_by, *sink.partition_by) if name in cdc.except_columns]
    if kept:
        raise check.refuse("sink.cdc.except_columns", f"{', '.join(kept)} must be written: the keys, the sequence "
                                                      "and the partition columns are how a change finds its row")
    written = [name for name in output if name not in cdc.except_columns]
    check.need(cdc.track_history_columns, written, "sink.cdc.track_history_columns", "written column(s)")
    if cdc.scd_type == 2:
        taken = [name for name in (CDC_START_COLUMN, CDC_END_COLUMN) if name in written]
        if taken:
            raise check.refuse("sink.cdc.scd_type", f"type 2 adds {CDC_START_COLUMN} and {CDC_END_COLUMN}; the "
                                                    f"output has {', '.join(taken)} already: rename or except it")


def default_delete_when(source: SourceSpec) -> str | None:
    """A Debezium envelope's rows say their operation: a ``d`` is a delete. Other sources have no default."""
    return f"{DEBEZIUM_OP_COLUMN} = 'd'" if source.envelope is Envelope.DEBEZIUM else None


class _Columns:
    """The columns available at each step of a stream, checked step by step against what the step names."""

    def __init__(self, stream: str, available: list[str]) -> None:
        self.stream = stream
        self.available = available

    def refuse(self, field_name: str, message: str) -> CatalogError:
        return CatalogError(message, stream=self.stream, field=field_name)

    def need(self, names: tuple[str, ...], available: list[str], field_name: str, what: str) -> None:
        missing = [name for name in names if name not in available]
        if missing:
            raise self.refuse(field_name, f"{what} {', '.join(missing)} not among the columns available here: "
                                          f"{', '.join(available)}")

    def watermark_and_dedupe(self, patterns: Patterns, source: SourceSpec) -> None:
        watermark = patterns.watermark
        if watermark is not None:
            self.need((watermark.column,), self.available, "watermark.column", "column")
            _need_timestamp(source.schema, watermark.column,
                            lambda message: self.refuse("watermark.column", message))
            if not patterns.stateful:
                raise self.refuse("watermark", "a watermark bounds the state of dedupe, join or aggregate, and this "
                                               "stream has none of them; remove it")
        if patterns.dedupe is not None:
            self.need(patterns.dedupe.keys, self.available, "dedupe.keys", "key column(s)")
            if watermark is None:
                raise self.refuse("dedupe", "deduplication without a watermark keeps every key seen in state "
                                            "forever; add `watermark: {column: <event time>, delay: <how late a "
                                            "duplicate may come>}`")

    def join(self, join: JoinSpec, watermark: WatermarkSpec | None) -> None:
        if watermark is None:
            raise self.refuse("join", "a stream-stream join needs a watermark on both sides; add `watermark` for "
                                      "this stream's side")
        right_columns = join.source.schema.names
        self.need(join.on, self.available, "join.on", "key column(s)")
        self.need(join.on, right_columns, "join.on", "key column(s) of the joined source:")
        self.need((join.left_time,), self.available, "join.within.left", "column")
        self.need((join.right_time,), right_columns, "join.within.right", "column of the joined source:")
        self.need((join.watermark.column,), right_columns, "join.watermark.column", "column of the joined source:")
        _need_timestamp(join.source.schema, join.right_time,
                        lambda message: self.refuse("join.within.right", message))
        if join.left_time != watermark.column:
            raise self.refuse("join.within.left", f"the time bound must use the watermark column "
                                                  f"{watermark.column!r}, or Spark cannot evict the join state")
        if join.right_time != join.watermark.column:
            raise self.refuse("join.within.right", f"the time bound must use the joined source's watermark column "
                                                   f"{join.watermark.column!r}, or Spark cannot evict the join state")
        clashes = [name for name in right_columns if name in self.available and name not in join.on]
        if clashes:
            raise self.refuse("join.source.schema", f"column(s) {', '.join(clashes)} exist on both sides; rename "
                                                    "them in one source's schema (only the join keys may be shared)")
        self.available += [name for name in right_columns if name not in join.on]

    def lookups(self, lookups: tuple[LookupSpec, ...]) -> None:
        for index, lookup in enumerate(lookups):
            self.need(lookup.on, self.available, f"lookup[{index}].on", "key column(s)")
            reserved = [name for name in lookup.columns if name.startswith("_")]
            if reserved:
                raise self.refuse(f"lookup[{index}].columns", f"column(s) {', '.join(reserved)} start with '_', which "
                                                             "is reserved for Sluice's metadata columns")
            clashes = [name for name in lookup.columns if name in self.available]
            if clashes:
                raise self.refuse(f"lookup[{index}].columns",
                                  f"column(s) {', '.join(clashes)} already exist in the stream")
            self.available += list(lookup.columns)

    def aggregate(self, aggregate: AggregateSpec | None, *, joined: bool) -> list[str]:
        """The output columns: the available ones, or the aggregate's keys and measures."""
        if aggregate is None:
            return self.available
        if joined:
            raise self.refuse("aggregate", "an aggregate over a stream-stream join is not supported; write the join "
                                           "to a table and aggregate it in a downstream stream")
        self.need(aggregate.group_by, self.available, "aggregate.group_by", "column(s)")
        for measure in aggregate.measures:
            if measure.column != "*":
                self.need((measure.column,), self.available, f"aggregate.measures.{measure.name}", "column")
        if aggregate.window is not None:
            self.need((aggregate.window.column,), self.available, "aggregate.window.column", "column")
        output = list(aggregate.key_columns) + [measure.name for measure in aggregate.measures]
        if len(set(output)) != len(output):
            raise self.refuse("aggregate.measures", f"a measure name repeats a key column: {output}")
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
    if aggregate is not None and mode is SinkMode.MERGE and isinstance(sink, DeltaSink):
        if sink.keys:
            raise refuse("sink.keys", f"an aggregate is merged on its own keys ({', '.join(aggregate.key_columns)}); "
                                      "remove sink.keys")
        if aggregate.window is not None and aggregate.window.type is WindowType.SESSION:
            raise refuse("sink.mode", "a session window's bounds move as events arrive, so an upserted session "
                                      "would leave its earlier versions behind; use sink.mode append")
        if not aggregate.key_columns:
            raise refuse("aggregate", "a merged aggregate needs a window or group_by columns to key its rows")
    if mode is SinkMode.CDC and (aggregate is not None or patterns.join is not None):
        raise refuse("sink.mode", "cdc mode applies a feed of changes row by row; an aggregate or a join makes "
                                  "other rows: use sink.mode merge (aggregate) or append (join)")
    if patterns.join is not None and mode is not SinkMode.APPEND:
        raise refuse("sink.mode", "a stream-stream join emits append-only output; use sink.mode append")
    if not isinstance(sink, DeltaSink):
        return
    if mode in (SinkMode.MERGE, SinkMode.CDC) and aggregate is None:
        if not sink.keys:
            raise refuse("sink.keys", f"{mode.value} mode upserts by key: name the key column(s) in sink.keys")
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
        raise refuse("sink.sequence_by", "only merge and cdc modes with sink.keys order rows by a sequence column")
    if patterns.fan_out and mode is SinkMode.CDC:
        raise refuse("fan_out", "fan-out tables are appended to, and a cdc feed's deletes and late changes would "
                                "not reach them; fan out in a stream that reads the cdc table")
    if patterns.fan_out and mode is SinkMode.COMPLETE:
        raise refuse("fan_out", "fan-out tables are appended to, and complete mode re-emits the whole result every "
                                "batch; fan out from an append or merge stream")
