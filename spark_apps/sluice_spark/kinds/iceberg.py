"""The Iceberg source and sink in Spark: the pip-only engine (pyiceberg), no Iceberg jar.

The source is the ``sluice_iceberg`` data source's reader (:mod:`sluice_spark.rs.iceberg_source`): the rows each
new append snapshot adds, the declared columns selected and cast as a Delta source's are
(:func:`sluice_spark.drift.typed.typed_drift`), with the table's identifier as each row's lineage.

An append on the rs engine goes through the ``sluice_iceberg`` data source (:mod:`sluice_spark.rs.iceberg`): the
executors write the good rows' Iceberg data files and the dead letters' Delta files, the driver commits one Iceberg
append snapshot and one Delta transaction per batch. Otherwise (the jvm engine, a merge or complete mode, or
fan-out tables) each micro-batch goes through the :class:`~sluice_spark.write.batches.BatchRouter`: an append has
its good rows' data files written by Spark's tasks (``mapInArrow``) and committed by the driver as one append
snapshot; a merge or complete mode collects the good rows to the driver as Arrow, committed as one Iceberg snapshot
(an upsert by keys, or an overwrite of the whole table); then each fan-out table (an Iceberg table of the sink's
catalog, :class:`IcebergFanOut`) takes its rows as one append snapshot, written as the sink's appends are; then the
dead letters go to the stream's Delta dead-letter table. Either way each snapshot's summary
carries the query id and the batch id, and a replayed batch the table already holds is skipped
(:meth:`sluice.storage.tableformat.TableFormat.holds_batch`).

Spark's Iceberg runtime (``iceberg-spark-runtime-4.1_2.13``, 1.11.0 and 1.12.0, the newest on Maven Central) does not
load on Spark 4.2 (``IncompatibleClassChangeError`` on Spark's connector ``View``), so there is no JVM engine yet.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming import DataStreamWriter

from sluice.constants import INGEST_TIME_COLUMN, RESCUED_COLUMN, SOURCE_FILE_COLUMN, DeltaEngine, SinkMode
from sluice.errors import SluiceError
from sluice.kinds.iceberg import IcebergSink, IcebergSource
from sluice.model.stream import StreamSpec, TriggerSpec
from sluice.paths import Roots
from sluice.storage.iceberg import IcebergTableFormat
from sluice_spark import faults
from sluice_spark.drift.typed import typed_drift
from sluice_spark.kinds.delta import OUTPUT_MODES
from sluice_spark.rs.iceberg import ICEBERG_DATA_SOURCE
from sluice_spark.session import register_data_sources
from sluice_spark.targets import (
    FAILED_COLUMN,
    GOOD_ROUTE,
    NEW_FIELDS_COLUMN,
    RAW_COLUMN,
    ROUTE_COLUMN,
    encode_targets,
    fan_out_column,
    fan_out_columns,
)
from sluice_spark.write.batches import BatchRouter, SinkRequest, sink_and_dead_letter, stream_commit_info
from sluice_spark.write.tables import latest_per_key

if TYPE_CHECKING:
    import pyarrow as pa


def read(spark: SparkSession, stream: StreamSpec, roots: Roots, *, path: str | None, trigger: TriggerSpec) -> DataFrame:
    """The source table's new append snapshots, from the one after the checkpoint's, as a streaming DataFrame of the
    declared columns."""
    source = stream.source
    assert isinstance(source, IcebergSource)
    register_data_sources(spark)
    reader = (spark.readStream.format(ICEBERG_DATA_SOURCE).options(**source.options)
              .option("table", source.identifier).option("catalog", source.catalog).option("lakeRoot", roots.lake))
    if trigger.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", trigger.max_files_per_trigger)
    if trigger.max_bytes_per_trigger:
        reader = reader.option("maxBytesPerTrigger", trigger.max_bytes_per_trigger)
    where = f"the Iceberg table {source.identifier} (catalog {source.catalog})"
    try:
        frame = reader.load()
    except Exception as exc:
        raise SluiceError(f"stream '{stream.name}': cannot read {where} ({exc}); the stream that writes it must have "
                          "run once") from exc
    present = {name.lower() for name in frame.columns}
    missing = [name for name in source.read_schema.names if name.lower() not in present]
    if missing:
        raise SluiceError(f"stream '{stream.name}': {where} has no column(s) {', '.join(missing)}; it has "
                          f"{', '.join(frame.columns)}")
    lineage = F.col(SOURCE_FILE_COLUMN) if SOURCE_FILE_COLUMN in frame.columns else F.lit(source.origin)
    carried = {SOURCE_FILE_COLUMN: lineage}
    try:
        return typed_drift(frame, source.read_schema, source.schema_evolution, carried,
                           ignored=(SOURCE_FILE_COLUMN, INGEST_TIME_COLUMN, RESCUED_COLUMN))
    except SluiceError as error:
        raise SluiceError(f"stream '{stream.name}': {where}: {error}") from None


def iceberg_table(request: SinkRequest) -> IcebergTableFormat:
    """The stream's Iceberg table, created (with its namespace) from the good rows' columns unless it exists."""
    if request.roots is None:
        raise SluiceError(f"stream '{request.stream.name}': an Iceberg sink needs the run's roots to find its catalog")
    return ensure_iceberg_table(request.stream, request.roots, request.frame, request.data_columns)


def ensure_iceberg_table(stream: StreamSpec, roots: Roots, frame: DataFrame, data_columns: list[str],
                         sink: IcebergSink | None = None) -> IcebergTableFormat:
    """The stream's Iceberg table (or ``sink``, one of its fan-out tables), created with the frame's
    ``data_columns`` and the sink's partition spec unless it exists (an existing one gains the columns it lacks)."""
    sink = sink or stream.sink  # type: ignore[assignment]
    assert isinstance(sink, IcebergSink)
    table = IcebergTableFormat(sink.identifier, sink.catalog_properties(roots))
    schema = to_arrow_schema(frame.select(*data_columns).schema, timezone="UTC")
    table.ensure(schema, sink.partition_transforms, description=stream.description)
    return table


@dataclass(frozen=True)
class IcebergFanOut:
    """A fan-out table of an Iceberg sink: the good rows its flag column selects, its columns, appended once per
    batch as the sink's appends are (the files written by Spark's tasks, one append snapshot by the driver carrying
    the batch's query id and batch id, a replayed batch the table holds skipped)."""

    table: IcebergTableFormat
    flag: str
    columns: tuple[str, ...]

    def append(self, batch: DataFrame, *, query_id: str, batch_id: int, metadata: dict[str, Any]) -> bool:
        rows = batch.where((F.col(ROUTE_COLUMN) == GOOD_ROUTE) & F.col(self.flag)).select(*self.columns)
        return self.table.append_files(write_on_executors(self.table, rows), query_id=query_id, batch_id=batch_id,
                                       metadata=metadata)


def fan_out_tables(request: SinkRequest) -> list[IcebergFanOut]:
    """The stream's Iceberg fan-out tables, each created (in the sink's catalog, with its own columns and partition
    spec) unless it exists."""
    stream, sink = request.stream, request.stream.sink
    assert isinstance(sink, IcebergSink) and request.roots is not None
    tables = []
    for index, spec in enumerate(stream.patterns.fan_out):
        columns = fan_out_columns(spec, request.data_columns)
        table = ensure_iceberg_table(stream, request.roots, request.frame, columns, sink.fan_out_sink(spec))
        tables.append(IcebergFanOut(table, fan_out_column(index), tuple(columns)))
    return tables


def sink_writer(request: SinkRequest) -> DataStreamWriter:
    """A ``DataStreamWriter`` (without trigger or checkpoint) that commits each micro-batch's good rows to the
    stream's Iceberg table and its dead letters to the Delta dead-letter table, each exactly once.
    ``request.sent`` receives the rows each batch gave the table, for the run's row reconciliation."""
    stream, sink = request.stream, request.stream.sink
    assert isinstance(sink, IcebergSink)
    table = iceberg_table(request)
    fan_outs = fan_out_tables(request)
    if sink.mode is SinkMode.APPEND and request.engine is DeltaEngine.RS and not fan_outs:
        return executor_writer(request, table)
    commit_info = stream_commit_info(request.commit_info, stream=stream.name, query_id=request.query_id)

    def commit(batch: DataFrame, batch_id: int) -> bool:
        good = batch.where(F.col(ROUTE_COLUMN) == GOOD_ROUTE).select(*request.data_columns)
        offered = None
        if sink.mode is SinkMode.MERGE:  # a key's superseded versions count as processed, for the reconciliation
            offered = good.count()
            good = latest_per_key(good, sink.keys, sink.sequence_by)
        metadata = commit_info(batch_id, GOOD_ROUTE)
        if sink.mode is SinkMode.APPEND:  # beside a jvm dead-letter table or fan-out tables: the executors write
            files = write_on_executors(table, good)
            faults.reach("before_commit", batch_id)
            table.append_files(files, query_id=request.query_id, batch_id=batch_id, metadata=metadata)
            request.sent[batch_id] = sum(int(data_file.record_count) for data_file in files)
        else:
            rows = good.toArrow()
            faults.reach("before_commit", batch_id)
            if sink.mode is SinkMode.MERGE:
                table.upsert_batch(rows, list(sink.keys), query_id=request.query_id, batch_id=batch_id,
                                   metadata=metadata, sequence_by=sink.sequence_by)
            else:
                table.commit_batch(rows, query_id=request.query_id, batch_id=batch_id, metadata=metadata,
                                   overwrite=sink.mode is SinkMode.COMPLETE)
            request.sent[batch_id] = rows.num_rows if offered is None else offered
        faults.reach("between_commits", batch_id)
        for fan_out in fan_outs:  # after the sink's table, before the dead letters, each once
            fan_out.append(batch, query_id=request.query_id, batch_id=batch_id, metadata=metadata)
            faults.reach("between_commits", batch_id)
        return True

    router = BatchRouter([sink_and_dead_letter(request.targets)[1]], engine=request.engine, route_column=ROUTE_COLUMN,
                         query_id=request.query_id, commit_info=commit_info, before=commit,
                         example_column=RAW_COLUMN)
    return request.frame.writeStream.foreachBatch(router).outputMode(OUTPUT_MODES[sink.mode])


def write_on_executors(table: IcebergTableFormat, good: DataFrame) -> list[Any]:
    """The good rows written as the table's data files by Spark's tasks (:func:`write_task_files`), pyiceberg's
    ``DataFile`` of each back on the driver to be committed: no row is collected to the driver."""
    import functools
    import pickle

    metadata, catalog = table.writer_state()
    write = functools.partial(write_task_files, metadata, catalog)
    return [pickle.loads(row.file) for row in good.mapInArrow(write, "file binary").collect()]


def write_task_files(metadata: Any, catalog: dict[str, str], batches: Iterator[pa.RecordBatch]
                     ) -> Iterator[pa.RecordBatch]:
    """In a Spark task: its rows as data files of the table whose pyiceberg ``metadata`` is given
    (:func:`sluice.storage.iceberg_files.write_data_files`, as the ``sluice_iceberg`` data source's writer writes
    them), and one row per file, the pickled ``DataFile``. Files never committed are orphans."""
    import pickle

    import pyarrow as pa
    from pyiceberg.io import load_file_io

    from sluice.storage.iceberg_files import write_data_files

    held = list(batches)
    if held:
        files = write_data_files(metadata, load_file_io(catalog, metadata.location), pa.Table.from_batches(held))
        yield pa.RecordBatch.from_pydict({"file": [pickle.dumps(data_file) for data_file in files]},
                                         schema=pa.schema([("file", pa.binary())]))


def executor_writer(request: SinkRequest, table: IcebergTableFormat) -> DataStreamWriter:
    """The ``sluice_iceberg`` data source's writer: the executors write the files, the driver commits them."""
    columns = request.frame.columns
    failing = {"failedColumn": FAILED_COLUMN, "exampleColumn": RAW_COLUMN} if FAILED_COLUMN in columns else {}
    if NEW_FIELDS_COLUMN in columns:
        failing.update(newFieldsColumn=NEW_FIELDS_COLUMN, originColumn=SOURCE_FILE_COLUMN)
    register_data_sources(request.frame.sparkSession)
    return (
        request.frame.writeStream.format(ICEBERG_DATA_SOURCE)
        .options(**failing)
        .outputMode("append")
        .option("table", table.identifier)
        .option("catalog", json.dumps(table.catalog_properties))
        .option("columns", json.dumps(request.data_columns))
        .option("targets", encode_targets([sink_and_dead_letter(request.targets)[1]]))
        .option("routeColumn", ROUTE_COLUMN)
        .option("queryId", request.query_id)
        .option("stream", request.stream.name)
        .option("commitInfo", json.dumps(request.commit_info))
    )
