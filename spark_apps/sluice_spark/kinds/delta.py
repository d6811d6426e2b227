"""The Delta source and the Delta sink in Spark.

The source reads a table by version: delta-spark's ``format("delta")`` on the jvm engine, Sluice's ``sluice_delta``
on rs. The declared columns are selected and cast; a row that lacks a required one goes to the dead-letter table like
a file record. ``_source_file`` carries the upstream's lineage when the table has it. The table's other columns
follow the stream's drift policy (:func:`sluice_spark.drift.typed.typed_drift`), except the upstream stream's own
(its ingest time, and what its drift policy rescued, which stays in its table).

The sink writes the stream's table, its dead-letter table and any fan-out tables, each exactly once per micro-batch.
Appends on ``rs`` go through :mod:`sluice_spark.rs.sink`, which writes Parquet on the executors. Everything
else runs in ``foreachBatch`` through :class:`sluice_spark.write.batches.BatchRouter`. On ``rs`` such a batch crosses to
the driver as Arrow: merge and complete mode are meant for upserts and aggregates, whose batches are small next to
a bronze append.
"""

from __future__ import annotations

import json

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

from sluice.constants import (
    INGEST_TIME_COLUMN,
    RESCUED_COLUMN,
    SOURCE_FILE_COLUMN,
    DeltaEngine,
    SchemaEvolution,
    SinkMode,
)
from sluice.errors import SluiceError
from sluice.model.stream import StreamSpec, TriggerSpec
from sluice.paths import Roots
from sluice_spark.drift.typed import typed_drift
from sluice_spark.rs.datasource import DATA_SOURCE_NAME
from sluice_spark.session import register_data_sources, resolve_engine
from sluice_spark.targets import FAILED_COLUMN, NEW_FIELDS_COLUMN, RAW_COLUMN, ROUTE_COLUMN, encode_targets
from sluice_spark.write.batches import BatchRouter, SinkRequest, stream_commit_info


def read(spark: SparkSession, stream: StreamSpec, roots: Roots, *, path: str | None, trigger: TriggerSpec) -> DataFrame:
    """The source table, from the version after the checkpoint's, as a streaming DataFrame of the declared columns."""
    path = stream.source_path(roots)
    engine = resolve_engine(spark, stream.sink.engine, stream.locations(roots))
    if engine is not DeltaEngine.JVM:
        register_data_sources(spark)
    reader = spark.readStream.format("delta" if engine is DeltaEngine.JVM else DATA_SOURCE_NAME)
    reader = reader.options(**stream.source.options)
    if trigger.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", trigger.max_files_per_trigger)
    if trigger.max_bytes_per_trigger:
        reader = reader.option("maxBytesPerTrigger", trigger.max_bytes_per_trigger)
    try:
        frame = reader.load(path)
    except Exception as exc:
        raise SluiceError(f"stream '{stream.name}': cannot read the Delta table {path} ({exc}); the stream that "
                          "writes it must have run once") from exc
    present = {name.lower() for name in frame.columns}
    missing = [name for name in stream.source.read_schema.names if name.lower() not in present]
    if missing:
        raise SluiceError(f"stream '{stream.name}': the Delta table {path} has no column(s) {', '.join(missing)}; "
                          f"it has {', '.join(frame.columns)}")
    lineage = F.col(SOURCE_FILE_COLUMN) if SOURCE_FILE_COLUMN in frame.columns else F.lit(path)
    try:
        return typed_drift(frame, stream.source.read_schema, stream.source.schema_evolution,
                           {SOURCE_FILE_COLUMN: lineage},
                           ignored=(SOURCE_FILE_COLUMN, INGEST_TIME_COLUMN, RESCUED_COLUMN))
    except SluiceError as error:
        raise SluiceError(f"stream '{stream.name}': the Delta table {path}: {error}") from None


# Spark's output mode for each way a table is written.
# A cdc stream's rows are changes: each is appended to its batch, and the writer applies them in sequence order.
OUTPUT_MODES = {SinkMode.APPEND: "append", SinkMode.MERGE: "update", SinkMode.COMPLETE: "complete",
                SinkMode.CDC: "append"}


def sink_writer(request: SinkRequest) -> DataStreamWriter:
    """A ``DataStreamWriter`` (without trigger or checkpoint) that routes the stream's frame into its tables."""
    mode, targets = request.stream.sink.mode, request.targets
    columns = request.frame.columns
    failing = {"failedColumn": FAILED_COLUMN, "exampleColumn": RAW_COLUMN} if FAILED_COLUMN in columns else {}
    if NEW_FIELDS_COLUMN in columns:
        failing.update(newFieldsColumn=NEW_FIELDS_COLUMN, originColumn=SOURCE_FILE_COLUMN)
    appends = request.engine is DeltaEngine.RS and all(target.mode is SinkMode.APPEND for target in targets)
    # A batch that adds columns is written from the driver, which sees the whole batch to type them.
    adds = request.stream.source.schema_evolution is SchemaEvolution.ADD_NEW_COLUMNS
    if appends and not request.collect and not adds:
        register_data_sources(request.frame.sparkSession)
        return (
            request.frame.writeStream.format(DATA_SOURCE_NAME)
            .options(**failing)
            .outputMode(OUTPUT_MODES[mode])
            .option("targets", encode_targets(targets))
            .option("routeColumn", ROUTE_COLUMN)
            .option("queryId", request.query_id)
            .option("stream", request.stream.name)
            .option("commitInfo", json.dumps(request.commit_info))
        )

    router = BatchRouter(targets, engine=request.engine, route_column=ROUTE_COLUMN, query_id=request.query_id,
                         commit_info=stream_commit_info(request.commit_info, stream=request.stream.name,
                                                        query_id=request.query_id),
                         example_column=RAW_COLUMN, collect=appends and request.collect,
                         added=request.added_columns if adds else None)
    return request.frame.writeStream.foreachBatch(router).outputMode(OUTPUT_MODES[mode])
