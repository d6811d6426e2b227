"""The routing step: a stream's parsed rows, split into good rows and dead letters, transformed, judged by its rules,
through its patterns, and routed to its tables as one frame with a route column (the sink's input).

:func:`route` takes a DataFrame, not a source: the quality split, the rules and the fan-out are the same on a
streaming frame from a source and on a frame built by hand (``spark.createDataFrame``), which is how they are tested.
:class:`Routed` gives the rows each table receives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sluice.constants import CORRUPT_COLUMN, INGEST_TIME_COLUMN, SOURCE_FILE_COLUMN, SchemaEvolution
from sluice.errors import CatalogError
from sluice.model.expectations import Violation
from sluice.model.patterns import LookupSpec
from sluice.model.stream import StreamSpec
from sluice_spark.steps import patterns as steps
from sluice_spark.steps.patterns import joined_side, with_watermark
from sluice_spark.steps.quality import check_expectations, flag_dead_letters
from sluice_spark.steps.transforms import apply_transform
from sluice_spark.targets import (
    DEAD_LETTER_ROUTE,
    FAILED_COLUMN,
    FAILED_ROUTE,
    GOOD_ROUTE,
    NEW_COLUMNS_COLUMN,
    NEW_FIELDS_COLUMN,
    NEW_TYPES_COLUMN,
    RAW_COLUMN,
    REASON_COLUMN,
    RECORD_COLUMN,
    ROUTE_COLUMN,
    fan_out_column,
    fan_out_columns,
)

STREAM_COLUMN = "_dead_letter_stream"
DEAD_LETTER_FIELDS = (
    (RAW_COLUMN, "raw_record"),
    (REASON_COLUMN, "reason"),
    (SOURCE_FILE_COLUMN, "source_file"),
    (STREAM_COLUMN, "stream"),
    (INGEST_TIME_COLUMN, "ingested_at"),
)
INTERNAL_COLUMNS = {CORRUPT_COLUMN, REASON_COLUMN, RAW_COLUMN, ROUTE_COLUMN, STREAM_COLUMN, FAILED_COLUMN,
                     NEW_FIELDS_COLUMN, NEW_COLUMNS_COLUMN, NEW_TYPES_COLUMN, RECORD_COLUMN}


@dataclass(frozen=True)
class Routed:
    """A stream's routed rows: ``frame`` carries every row with its route (the sink's input), ``data_columns`` are
    the good rows' columns as its own table receives them (the ingest time last). The methods give the rows each
    table receives, as the writers select them."""

    stream: StreamSpec
    frame: DataFrame
    data_columns: list[str]

    def good(self) -> DataFrame:
        """The rows of the stream's own table."""
        return self.frame.where(F.col(ROUTE_COLUMN) == GOOD_ROUTE).select(*self.data_columns)

    def dead_letters(self) -> DataFrame:
        """The rows of the stream's dead-letter table, with its column names."""
        return self.frame.where(F.col(ROUTE_COLUMN) == DEAD_LETTER_ROUTE).select(
            *[F.col(source).alias(name) for source, name in DEAD_LETTER_FIELDS])

    def failed(self) -> DataFrame:
        """The rows no table takes: they broke a ``fail`` rule, or brought new fields under
        ``fail_on_new_columns``; the writers refuse their batch."""
        return self.frame.where(F.col(ROUTE_COLUMN) == FAILED_ROUTE)

    def outputs(self) -> list[DataFrame]:
        """The rows of each fan-out table, in the order of ``patterns.fan_out``."""
        return [self.frame.where((F.col(ROUTE_COLUMN) == GOOD_ROUTE) & F.col(fan_out_column(index)))
                .select(*fan_out_columns(spec, self.data_columns))
                for index, spec in enumerate(self.stream.patterns.fan_out)]


def route(parsed: DataFrame, stream: StreamSpec, *, dimensions: Sequence[tuple[LookupSpec, DataFrame]] = (),
          joined: DataFrame | None = None) -> Routed:
    """Dead-letter flag -> transform -> rules -> patterns -> one frame carrying a route column.

    ``parsed`` is the stream's source as a source kind reads it (:func:`sluice_spark.kinds.read_stream`): the
    declared columns, ``_corrupt_record`` and ``_source_file``. ``dimensions`` pairs each of ``patterns.lookup``
    with its table's rows; ``joined`` is the source of ``patterns.join``, read the same way.
    """
    lookups = [spec for spec, _ in dimensions]
    if lookups != list(stream.patterns.lookup):
        raise CatalogError(f"route() got {len(lookups)} lookup table(s) for the {len(stream.patterns.lookup)} "
                           "the stream declares, or in another order", stream=stream.name, field="patterns.lookup")
    if (joined is None) != (stream.patterns.join is None):
        raise CatalogError("route() needs the joined source's rows exactly when the stream declares a join",
                           stream=stream.name, field="patterns.join")
    missing = [name for name in (CORRUPT_COLUMN, SOURCE_FILE_COLUMN) if name not in parsed.columns]
    if missing:
        raise CatalogError(f"route() needs the source's columns {missing}, as a source kind reads them",
                           stream=stream.name, field="source")
    flagged = flag_dead_letters(parsed, stream)
    transformed = apply_transform(flagged, stream)
    transformed = check_expectations(transformed, stream,
                                     [name for name in transformed.columns if name not in INTERNAL_COLUMNS])
    if stream.patterns.stateful:
        frame, data_columns = _route_stateful(stream, transformed, dimensions, joined)
        return Routed(stream, frame, data_columns)
    for spec, dimension in dimensions:
        transformed = steps.lookup(transformed, dimension, spec)
    data_columns = [name for name in transformed.columns if name not in INTERNAL_COLUMNS]
    rejected = F.col(REASON_COLUMN).isNotNull()
    route_value = F.when(rejected, F.lit(DEAD_LETTER_ROUTE)).otherwise(F.lit(GOOD_ROUTE))
    frame = _route(transformed, [F.col(c) for c in data_columns], route_value, _fan_out_flags(stream, ~rejected),
                   stream=stream)
    return Routed(stream, frame, [*data_columns, INGEST_TIME_COLUMN])


def _route_stateful(stream: StreamSpec, transformed: DataFrame, dimensions: Sequence[tuple[LookupSpec, DataFrame]],
                    joined: DataFrame | None) -> tuple[DataFrame, list[str]]:
    """Good rows through the stateful steps, dead letters around them, one union in front of the sink.

    The watermark is set on the good rows only: a dead letter with a wild event time must not move it. Spark plans
    each branch with its own instance of the source, so a stateful stream scans its input twice per batch
    (``StreamSpec.checkpoint_sources``); both read the same versions, and one batch commits both.
    """
    patterns = stream.patterns
    rejected = F.col(REASON_COLUMN).isNotNull()
    keep = [name for name in transformed.columns if name not in INTERNAL_COLUMNS]
    good = with_watermark(transformed.where(~rejected).select(*keep), patterns.watermark)
    dead = [transformed.where(rejected)]
    if patterns.dedupe is not None:
        good = steps.dedupe(good, patterns.dedupe)
    if patterns.join is not None:
        assert joined is not None  # route() checks it
        right = flag_dead_letters(joined, joined_side(stream, patterns.join))
        dead.append(right.where(F.col(REASON_COLUMN).isNotNull()))
        right_good = right.where(F.col(REASON_COLUMN).isNull()).select(*patterns.join.source.schema.names)
        good = steps.stream_join(good, with_watermark(right_good, patterns.join.watermark), patterns.join, keep)
    for spec, dimension in dimensions:
        good = steps.lookup(good, dimension, spec)
    if patterns.aggregate is not None:
        good = steps.aggregate(good, patterns.aggregate)
    data_columns = list(good.columns)
    types = dict(good.dtypes)
    # A dead letter keeps its lineage even when the stream's own rows (an aggregate's) have none.
    lineage = [] if SOURCE_FILE_COLUMN in data_columns else [SOURCE_FILE_COLUMN]
    empty = {name: F.lit(None).cast("string") for name in (*lineage, RAW_COLUMN, REASON_COLUMN)}
    routed = _route(good.withColumns(empty), [F.col(c) for c in (*data_columns, *lineage)], F.lit(GOOD_ROUTE),
                    _fan_out_flags(stream, F.lit(True)), stream=stream)
    no_fan_out = [F.lit(False).alias(fan_out_column(index)) for index, _ in enumerate(patterns.fan_out)]
    for bad in dead:
        nulls = [F.lit(None).cast(types[name]).alias(name) for name in data_columns]
        routed = routed.unionByName(_route(bad, [*nulls, *map(F.col, lineage)], F.lit(DEAD_LETTER_ROUTE), no_fan_out,
                                           stream=stream))
    return routed, [*data_columns, INGEST_TIME_COLUMN]


def _route(frame: DataFrame, data: list[Column], route: Column, fan_out: list[Column], *,
           stream: StreamSpec) -> DataFrame:
    """The routed frame's columns: the data, the ingest time, the route, the dead-letter columns (NULL on good rows)
    and one flag per fan-out table. Only what some table keeps crosses to the sink: the corrupt-record text is
    already in the raw record. A stream with ``fail`` rules also carries the rules each row broke, and one under
    ``fail_on_new_columns`` each row's new fields; such a row takes the failed route, which no table takes."""
    rejected = F.col(REASON_COLUMN).isNotNull()
    failing: list[Column] = []
    blocking = {FAILED_COLUMN: "string"} if any(rule.on_violation is Violation.FAIL for rule in stream.expectations) \
        else {}
    if stream.source.schema_evolution is SchemaEvolution.FAIL_ON_NEW_COLUMNS:
        blocking[NEW_FIELDS_COLUMN] = "array<string>"
    for name, kind in blocking.items():
        failed = F.col(name) if name in frame.columns else F.lit(None).cast(kind)
        route = F.when(failed.isNotNull(), F.lit(FAILED_ROUTE)).otherwise(route)
        failing.append(failed.alias(name))
    if stream.source.schema_evolution is SchemaEvolution.ADD_NEW_COLUMNS:  # for the writer to add (see BatchRouter)
        failing += [F.col(name) for name in (NEW_COLUMNS_COLUMN, NEW_TYPES_COLUMN) if name in frame.columns]
    return frame.select(*data, F.current_timestamp().alias(INGEST_TIME_COLUMN),
                        route.cast("tinyint").alias(ROUTE_COLUMN), RAW_COLUMN, REASON_COLUMN,
                        F.when(rejected, F.lit(stream.name)).alias(STREAM_COLUMN), *fan_out, *failing)


def _fan_out_flags(stream: StreamSpec, good: Column) -> list[Column]:
    """One boolean column per fan-out table: whether a good row goes there too. Its ``where`` is evaluated on good
    rows only: a dead letter may hold what the ``where`` cannot take under ANSI (a zero to divide by, which a rule
    quarantined)."""
    return [F.when(good, F.coalesce(F.expr(spec.where), F.lit(False))).otherwise(F.lit(False))
            .alias(fan_out_column(index)) for index, spec in enumerate(stream.patterns.fan_out)]
