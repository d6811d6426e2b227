"""The stateful patterns of :mod:`sluice.model.patterns` as DataFrame steps.

Each step takes the stream's good rows and returns the rows that go on; the runner keeps the dead-letter rows out
of every stateful operator and unions them back in front of the sink (:func:`sluice_spark.runner.build_routed_frame`).
"""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sluice.constants import DeltaEngine
from sluice.errors import SluiceError
from sluice.model.patterns import (
    WINDOW_END,
    WINDOW_START,
    AggregateSpec,
    DedupeSpec,
    JoinSpec,
    JoinType,
    LookupSpec,
    WatermarkSpec,
    WindowType,
)
from sluice.model.stream import StreamSpec
from sluice.paths import Roots, join
from sluice.times import spark_interval
from sluice_spark.kinds import read_stream


def with_watermark(frame: DataFrame, watermark: WatermarkSpec | None) -> DataFrame:
    if watermark is None:
        return frame
    return frame.withWatermark(watermark.column, spark_interval(watermark.delay_seconds))


def dedupe(frame: DataFrame, spec: DedupeSpec) -> DataFrame:
    """Drop a row whose keys were seen within the watermark delay. Unlike ``dropDuplicates(keys + [event time])``,
    two copies of an event with different event times (a producer's retry) are still one event."""
    return frame.dropDuplicatesWithinWatermark(list(spec.keys))


def joined_side(stream: StreamSpec, spec: JoinSpec) -> StreamSpec:
    """The joined stream as a stream of its own: the same stream over the join's source, whose schema decides its
    dead letters."""
    return replace(stream, source=spec.source)


def read_joined(spark: SparkSession, stream: StreamSpec, spec: JoinSpec, roots: Roots) -> DataFrame:
    """The joined stream's source as the runner reads a source: the declared columns, ``_corrupt_record`` and
    ``_source_file``. The routing step flags its dead letters and puts its watermark on its good rows
    (:func:`sluice_spark.steps.route.route`)."""
    return read_stream(spark, joined_side(stream, spec), roots)


def stream_join(left: DataFrame, right: DataFrame, spec: JoinSpec, left_columns: list[str]) -> DataFrame:
    """Equal keys, and the right event time within ``[left time, left time + max_delay]``."""
    left, right = left.alias("l"), right.alias("r")
    condition: Column = F.col(f"r.{spec.right_time}") >= F.col(f"l.{spec.left_time}")
    condition = condition & (F.col(f"r.{spec.right_time}") <= F.col(f"l.{spec.left_time}")
                             + F.expr(f"INTERVAL {spec.max_delay_seconds} SECONDS"))
    for key in spec.on:
        condition = condition & (F.col(f"l.{key}") == F.col(f"r.{key}"))
    how = "inner" if spec.type is JoinType.INNER else "left_outer"
    right_columns = [name for name in spec.source.schema.names if name not in spec.on]
    return left.join(right, condition, how).select(*[F.col(f"l.{name}") for name in left_columns],
                                            *[F.col(f"r.{name}") for name in right_columns])


def read_dimension(spark: SparkSession, spec: LookupSpec, roots: Roots, engine: DeltaEngine) -> DataFrame:
    """The dimension table as it is when the run starts, with its key unique (a duplicate key would multiply the
    stream's rows)."""
    from sluice.storage.delta import query, table_version

    path = join(roots.lake, spec.table)
    wanted = [*spec.on, *spec.columns]
    # Pinned to the version of the run's start on both engines; unpinned, delta-spark reads the newest every batch.
    version = table_version(path)
    if version is None:
        raise SluiceError(f"lookup table {path} does not exist")
    if engine is DeltaEngine.JVM:
        table = spark.read.format("delta").option("versionAsOf", version).load(path)
        columns = table.columns
    else:
        from deltalake import DeltaTable

        columns = [field.name for field in DeltaTable(path, version=version).schema().fields]
    missing = [name for name in wanted if name not in columns]
    if missing:
        raise SluiceError(f"lookup table {path} has no column(s) {', '.join(missing)}")
    if engine is DeltaEngine.JVM:
        dimension = table.select(*wanted)
    else:
        selected = ", ".join(f'"{name}"' for name in wanted)
        dimension = spark.createDataFrame(query(path, f"SELECT {selected} FROM t", version=version))
    duplicates = dimension.groupBy(*spec.on).count().where("count > 1").limit(5).collect()
    if duplicates:
        keys = ", ".join(str(tuple(row)[:-1]) for row in duplicates)
        raise SluiceError(f"lookup table {path} has more than one row for key(s) {keys} of {list(spec.on)}; a "
                          "stream-static join on it would multiply the stream's rows")
    return dimension


def lookup(frame: DataFrame, dimension: DataFrame, spec: LookupSpec) -> DataFrame:
    """A left join: every row of the stream stays, with NULLs where the dimension has no row for its key."""
    return frame.join(F.broadcast(dimension), list(spec.on), "left").select(*frame.columns, *spec.columns)


def aggregate(frame: DataFrame, spec: AggregateSpec) -> DataFrame:
    keys: list[Column] = []
    window = spec.window
    if window is not None:
        column = F.col(window.column)
        if window.type is WindowType.SESSION:
            keys.append(F.session_window(column, spark_interval(window.gap_seconds)).alias("window"))
        elif window.type is WindowType.SLIDING:
            keys.append(F.window(column, spark_interval(window.duration_seconds),
                                 spark_interval(window.slide_seconds)).alias("window"))
        else:
            keys.append(F.window(column, spark_interval(window.duration_seconds)).alias("window"))
    keys += [F.col(name) for name in spec.group_by]
    measures = [_measure(measure.function, measure.column).alias(measure.name) for measure in spec.measures]
    result = frame.groupBy(*keys).agg(*measures)
    bounds = [F.col("window.start").alias(WINDOW_START), F.col("window.end").alias(WINDOW_END)] if window else []
    return result.select(*bounds, *spec.group_by, *[measure.name for measure in spec.measures])


def _measure(function: str, column: str) -> Column:
    if function == "count":
        return F.count(F.lit(1)) if column == "*" else F.count(F.col(column))
    return getattr(F, function)(F.col(column))
