"""Streaming sources built from catalog entries.

A file source is read with its declared schema in PERMISSIVE mode, so that a malformed record becomes a row with
``_corrupt_record`` set instead of failing the batch; :mod:`sluice_spark.quality` then routes it to the dead-letter
table with a reason.

A Delta source (a silver stream reading bronze) is read by version: delta-spark's ``format("delta")`` on the jvm
engine, Sluice's ``sluice_delta`` on rs. The declared columns are selected and cast; a row that lacks a required
one goes to the dead-letter table like a file record. ``_source_file`` carries the upstream's lineage when the
table has it.

A Kafka source is read and decoded by :mod:`sluice_spark.kafka`.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sluice.catalog import StreamSpec, TriggerSpec
from sluice.constants import SOURCE_FILE_COLUMN, DeltaEngine, FileFormat, SourceType
from sluice.errors import SluiceError
from sluice.paths import Roots

CORRUPT_COLUMN = "_corrupt_record"


def read_stream(spark: SparkSession, stream: StreamSpec, roots: Roots, *, path: str | None = None,
                trigger: TriggerSpec | None = None) -> DataFrame:
    """The stream's source as a streaming DataFrame: the declared columns, ``_corrupt_record``, ``_source_file``.

    ``path`` and ``trigger`` replace the catalog's source path and admission limits (a backfill reads a glob of
    the files it selected, with its own limits).
    """
    source = stream.source
    if source.type is SourceType.DELTA:
        return _read_delta(spark, stream, roots, trigger or stream.trigger)
    if source.type is SourceType.KAFKA:
        from sluice_spark.kafka import read_kafka

        return read_kafka(spark, stream)
    if path is None:
        path = stream.source_path(roots)
        if "://" not in path:
            # A landing zone nobody has written to yet is empty, not an error: the run finds nothing and ends.
            Path(path).mkdir(parents=True, exist_ok=True)
    trigger = trigger or stream.trigger
    reader = spark.readStream.format(source.format.value).options(**source.options)
    if trigger.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", trigger.max_files_per_trigger)
    if trigger.max_bytes_per_trigger:
        reader = reader.option("maxBytesPerTrigger", trigger.max_bytes_per_trigger)

    schema = source.schema.ddl(nullable_only=True)
    if source.format is FileFormat.CSV and source.options.get("header") == "true":
        # Spark matches CSV columns by position unless told otherwise: a reordered export would silently land
        # values in the wrong columns. Check the header against the declared names instead.
        reader = reader.option("enforceSchema", source.options.get("enforceSchema", "false"))
    if source.format in (FileFormat.JSON, FileFormat.CSV):
        reader = reader.schema(f"{schema}, `{CORRUPT_COLUMN}` STRING").option("mode", "PERMISSIVE").option(
            "columnNameOfCorruptRecord", CORRUPT_COLUMN
        )
        frame = reader.load(path)
    else:
        frame = reader.schema(schema).load(path).withColumn(
            CORRUPT_COLUMN, F.lit(None).cast("string")
        )
    return frame.select(*source.schema.names, CORRUPT_COLUMN, F.col("_metadata.file_path").alias(SOURCE_FILE_COLUMN))


def _read_delta(spark: SparkSession, stream: StreamSpec, roots: Roots, trigger: TriggerSpec) -> DataFrame:
    from sluice_spark.delta_rs_datasource import DATA_SOURCE_NAME
    from sluice_spark.session import resolve_engine

    path = stream.source_path(roots)
    engine = resolve_engine(spark, stream.sink.engine)
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
    missing = [name for name in stream.source.schema.names if name not in frame.columns]
    if missing:
        raise SluiceError(f"stream '{stream.name}': the Delta table {path} has no column(s) {', '.join(missing)}; "
                          f"it has {', '.join(frame.columns)}")
    declared = [F.col(f"`{column.name}`").cast(column.sql_type).alias(column.name)
                for column in stream.source.schema.columns]
    lineage = F.col(SOURCE_FILE_COLUMN) if SOURCE_FILE_COLUMN in frame.columns else F.lit(path)
    return frame.select(*declared, F.lit(None).cast("string").alias(CORRUPT_COLUMN), lineage.alias(SOURCE_FILE_COLUMN))
