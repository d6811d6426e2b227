"""The Delta source and the Delta sink in Spark.

The source reads a table by version: delta-spark's ``format("delta")`` on the jvm engine, Sluice's ``sluice_delta``
on rs (and on both for a range backfill, whose ending version only ``sluice_delta`` takes). The declared columns are
selected and cast; a row that lacks a required one goes to the dead-letter table like a file record.
``_source_file`` carries the upstream's lineage when the table has it. Under ``read: changes`` the frame is the
table's change data feed (delta-spark's ``readChangeFeed``, or ``sluice_delta``'s), read from version 0 unless
``startingVersion`` or ``startingTimestamp`` says otherwise (on both engines: delta-spark alone would start with a
snapshot), without the updates' old rows, and with the change columns. The table's other columns follow the stream's
drift policy (:func:`sluice_spark.drift.typed.typed_drift`), except the upstream stream's own (its ingest time, and
what its drift policy rescued, which stays in its table).

The sink writes the stream's table, its dead-letter table and any fan-out tables, each exactly once per micro-batch.
Appends on ``rs`` go through :mod:`sluice_spark.rs.sink`, which writes Parquet on the executors. Everything
else runs in ``foreachBatch`` through :class:`sluice_spark.write.batches.BatchRouter`. On ``rs`` such a batch crosses to
the driver as Arrow: merge and complete mode are meant for upserts and aggregates, whose batches are small next to
a bronze append.
"""

from __future__ import annotations

import json
import re

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
from sluice.kinds.delta import CHANGE_COLUMNS, DeltaRead, DeltaSource
from sluice.model.stream import StreamSpec, TriggerSpec
from sluice.paths import Roots
from sluice_spark.drift.typed import typed_drift
from sluice_spark.kinds.files import RECORDS_METRIC
from sluice_spark.rs.datasource import DATA_SOURCE_NAME
from sluice_spark.session import register_data_sources, resolve_engine
from sluice_spark.targets import FAILED_COLUMN, NEW_FIELDS_COLUMN, RAW_COLUMN, ROUTE_COLUMN, encode_targets
from sluice_spark.write.batches import BatchRouter, SinkRequest, stream_commit_info


def read(spark: SparkSession, stream: StreamSpec, roots: Roots, *, path: str | None, trigger: TriggerSpec) -> DataFrame:
    """The source table, from the version after the checkpoint's, as a streaming DataFrame of the declared columns."""
    path = stream.source_path(roots)
    # A range backfill's bound (endingVersion, never a catalog option) is read by sluice_delta on either engine:
    # delta-spark's streaming source has no ending version. The writes still go through the stream's engine.
    bounded = "endingVersion" in stream.source.options
    engine = DeltaEngine.RS if bounded else resolve_engine(spark, stream.sink.engine, stream.locations(roots))
    if engine is not DeltaEngine.JVM:
        register_data_sources(spark)
    reader = spark.readStream.format("delta" if engine is DeltaEngine.JVM else DATA_SOURCE_NAME)
    reader = reader.options(**stream.source.options)
    changes = isinstance(stream.source, DeltaSource) and stream.source.read is DeltaRead.CHANGES
    if changes:
        refuse_without_change_feed(stream, path)
        reader = reader.option("readChangeFeed", "true")
        if not {"startingVersion", "startingTimestamp"} & set(stream.source.options):
            reader = reader.option("startingVersion", "0")
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
    carried = {SOURCE_FILE_COLUMN: lineage}
    if changes:
        # Spark counts the updates' old rows as input rows too: the stream's records are counted here.
        frame = frame.where(F.col("_change_type") != F.lit("update_preimage")).observe(
            RECORDS_METRIC.format(stream=stream.name), F.count(F.lit(1)).alias("records"))
        carried.update({name: F.col(name).cast(kind) for name, kind in CHANGE_COLUMNS.items()})
    try:
        return typed_drift(frame, stream.source.read_schema, stream.source.schema_evolution, carried,
                           ignored=(SOURCE_FILE_COLUMN, INGEST_TIME_COLUMN, RESCUED_COLUMN, *carried))
    except SluiceError as error:
        raise SluiceError(f"stream '{stream.name}': the Delta table {path}: {error}") from None


def refuse_without_change_feed(stream: StreamSpec, path: str) -> None:
    """Refuse, before any query starts, a ``read: changes`` of a table that does not record its changes now (a table
    no stream of the catalog writes, or whose writer has not run since a stream began to read its changes)."""
    from deltalake.exceptions import TableNotFoundError

    from sluice.storage.delta import CHANGE_FEED_PROPERTY, open_table, records_changes

    try:
        table = open_table(path)
    except TableNotFoundError:
        return  # the read says the table is missing, as for appends
    if not records_changes(table):
        raise SluiceError(f"stream '{stream.name}': source.read is changes, but the Delta table {path} does not record "
                          f"its changes ({CHANGE_FEED_PROPERTY} is not true at version {table.version()}); a table a "
                          "stream of the catalog writes gets it on that stream's next run, any other needs ALTER "
                          f"TABLE ... SET TBLPROPERTIES ({CHANGE_FEED_PROPERTY} = true)")


def explain_failure(stream: StreamSpec, error: BaseException) -> str | None:
    """A ``read: changes`` run on the jvm engine that reached a version committed before the table recorded its
    changes: delta-spark's error class ``DELTA_MISSING_CHANGE_DATA``, which names the version. (The rs engine's
    source says so itself.)"""
    found = _MISSING_CHANGE_DATA.search(str(error))
    if found is None or not isinstance(stream.source, DeltaSource) or stream.source.read is not DeltaRead.CHANGES:
        return None
    return (f"stream '{stream.name}': the Delta table {stream.source.table} has no change data for version "
            f"{found.group(1)}: it was committed before the table recorded its changes (delta.enableChangeDataFeed). "
            "Start the stream after it (source.options.startingVersion) with a new checkpoint (python -m sluice "
            f"repair reset --stream {stream.name})")


_MISSING_CHANGE_DATA = re.compile(r"DELTA_MISSING_CHANGE_DATA\].*?recorded for version \[(\d+)\]", re.DOTALL)


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
                         added=request.added_columns if adds else None, tables=request.tables)
    return request.frame.writeStream.foreachBatch(router).outputMode(OUTPUT_MODES[mode])
