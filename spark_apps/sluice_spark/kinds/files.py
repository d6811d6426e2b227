"""The file source in Spark: a landing-zone folder read with its declared schema.

JSON and CSV are read in PERMISSIVE mode, so that a malformed record becomes a row with ``_corrupt_record`` set
instead of failing the batch; :mod:`sluice_spark.steps.quality` then routes it to the dead-letter table with a reason.
``_source_file`` is each row's file.

Under a drift policy (:mod:`sluice_spark.drift.fields`), JSON files are read as text, a record per line (a file per
record, or per element of its top-level array, with ``multiLine``), so that each record's text is at hand to find what
the schema does not declare. A CSV record's values that do not fit their type are rescued from its text as Spark's
reader keeps it. """

from __future__ import annotations

from functools import partial
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamReader

from sluice.constants import (
    CORRUPT_COLUMN,
    RESCUED_COLUMN,
    SOURCE_FILE_COLUMN,
    Envelope,
    FileFormat,
    SchemaEvolution,
)
from sluice.kinds.files import FileSource
from sluice.model.stream import StreamSpec, TriggerSpec
from sluice.model.types import quote
from sluice.paths import Roots
from sluice_spark.drift import csv as csv_drift
from sluice_spark.drift.fields import parse_json_text, reads_by_header, rescue_csv
from sluice_spark.drift.parquet import conform_files, output_columns
from sluice_spark.kinds.envelope import debezium_text
from sluice_spark.session import require_hadoop_connector

# The options of Spark's file source that the text reader takes as they are; a JSON record's own options (dates,
# time zone) go to its parser.
_FILE_OPTIONS = frozenset({"pathGlobFilter", "recursiveFileLookup", "maxFileAge", "latestFirst", "fileNameOnly",
                           "modifiedAfter", "modifiedBefore", "lineSep"})
_JSON_OPTIONS = frozenset({"timestampFormat", "dateFormat", "timeZone"})
#: The observed metric that counts a stream's records per micro-batch where Spark's input rows are not records: a
#: JSON file read as text has lines that are no record (blank ones), or is one input row holding many (multiLine).
RECORDS_METRIC = "sluice_records_{stream}"


def read(spark: SparkSession, stream: StreamSpec, roots: Roots, *, path: str | None, trigger: TriggerSpec) -> DataFrame:
    """The landing folder (or ``path``, a backfill's glob of the files it selected) as a streaming DataFrame."""
    source = stream.source
    assert isinstance(source, FileSource)
    # Spark's reader may check the headers of the stream's own folder (not of a backfill's or a notified run's
    # selection of files): a run plans it again, by header, when one does not match.
    checked = path is None and reads_by_header(source) and csv_drift.checks_headers(stream.name,
                                                                                       stream.source_path(roots))
    if path is None:
        path = stream.source_path(roots)
        require_hadoop_connector(spark, path, f"stream '{stream.name}': landing folder")
        if "://" not in path:
            # A landing zone nobody has written to yet is empty, not an error: the run finds nothing and ends.
            Path(path).mkdir(parents=True, exist_ok=True)
    policy = source.schema_evolution
    if source.format is FileFormat.JSON and (policy is not SchemaEvolution.NONE
                                             or source.envelope is Envelope.DEBEZIUM):
        return _json_text(spark, stream, path, trigger)
    if source.format is FileFormat.PARQUET and policy is not SchemaEvolution.NONE:
        return _parquet_files(spark, stream, path, trigger)
    reader = _limited(spark.readStream.format(source.format.value).options(**source.options), trigger)
    if checked:
        # Spark's reader types every file whose header is the declared names, and fails on another one (the run
        # then plans the stream again, by header).
        frame = reader.option("enforceSchema", "false").schema(
            f"{source.read_schema.ddl(nullable_only=True)}, `{CORRUPT_COLUMN}` STRING") \
            .option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT_COLUMN).load(path)
        return csv_drift.conform_checked(frame.select(*[quote(name) for name in source.read_schema.names],
                                                      CORRUPT_COLUMN,
                                                      F.col("_metadata.file_path").alias(SOURCE_FILE_COLUMN)), source)
    if reads_by_header(source):  # each file's columns found by its header (sluice_spark.drift.csv)
        frame = reader.option("enforceSchema", "true").schema(csv_drift.read_schema_ddl(source)) \
            .option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT_COLUMN).load(path)
        return csv_drift.conform(frame.select(*[quote(name) for name in source.read_schema.names], CORRUPT_COLUMN,
                                              F.col("_metadata.file_path").alias(SOURCE_FILE_COLUMN),
                                              *csv_drift.file_version()), source)

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
    frame = frame.select(*source.schema.names, CORRUPT_COLUMN, F.col("_metadata.file_path").alias(SOURCE_FILE_COLUMN))
    if policy is SchemaEvolution.RESCUE:
        frame = frame.select(*source.schema.names, CORRUPT_COLUMN, rescue_csv(source).alias(RESCUED_COLUMN),
                             SOURCE_FILE_COLUMN)
    return frame


def _limited(reader: DataStreamReader, trigger: TriggerSpec) -> DataStreamReader:
    if trigger.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", trigger.max_files_per_trigger)
    if trigger.max_bytes_per_trigger:
        reader = reader.option("maxBytesPerTrigger", trigger.max_bytes_per_trigger)
    return reader


def _parquet_files(spark: SparkSession, stream: StreamSpec, path: str, trigger: TriggerSpec) -> DataFrame:
    """Parquet files as bytes, each read whole by pyarrow on an executor and compared with the declared schema
    (:mod:`sluice_spark.drift.parquet`)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    source = stream.source
    options = {key: value for key, value in source.options.items() if key in _FILE_OPTIONS}
    files = _limited(spark.readStream.format("binaryFile").options(**options), trigger) \
        .schema("path STRING, modificationTime TIMESTAMP, length BIGINT, content BINARY").load(path)
    files = files.select(F.col("_metadata.file_path").alias(SOURCE_FILE_COLUMN), "content")
    policy = source.schema_evolution
    ddl = ", ".join([source.read_schema.ddl(nullable_only=True),
                     *(f"{quote(name)} {kind}" for name, kind in output_columns(policy))])
    output = StructType.fromDDL(ddl)
    assert isinstance(output, StructType)
    declared = to_arrow_schema(StructType(output.fields[:len(source.read_schema.columns)]), timezone="UTC")
    schema = source.read_schema
    required = frozenset(schema.required) if source.rescues and not schema.required_fields else None
    records = files.mapInArrow(partial(conform_files, declared=declared, policy=policy, required=required,
                                       output=to_arrow_schema(output, timezone="UTC")), output)
    # Spark counts the files; the stream's records are counted here.
    return records.observe(RECORDS_METRIC.format(stream=stream.name), F.count(F.lit(1)).alias("records"))


def _json_text(spark: SparkSession, stream: StreamSpec, path: str, trigger: TriggerSpec) -> DataFrame:
    """JSON files as records of text, parsed under the source's drift policy. Blank lines are no records, as for
    Spark's JSON reader."""
    source = stream.source
    options = {key: value for key, value in source.options.items() if key in _FILE_OPTIONS}
    multi_line = source.options.get("multiLine", "false").lower() == "true"
    reader = _limited(spark.readStream.format("text").options(**options), trigger)
    if multi_line:
        reader = reader.option("wholetext", "true")
    line = F.col("value")
    # A byte order mark is no part of a record.
    text = F.when(line.startswith("\ufeff"), F.expr("substring(value, 2)")).otherwise(line)
    lines = reader.load(path).select(text.alias("value"), F.col("_metadata.file_path").alias(SOURCE_FILE_COLUMN))
    if multi_line:  # a file holds one record, or an array of them (split without the variant's size limit)
        records = F.coalesce(F.from_json(line, "ARRAY<STRING>"), F.array(line))
        lines = lines.select(F.explode(records).alias("value"), SOURCE_FILE_COLUMN)
    # A blank line is no record, as for Spark's JSON reader (most lines open an object: no regular expression).
    lines = lines.where(line.startswith("{") | line.rlike(r"\S"))
    # Spark counts the text reader's lines (or files); the stream's records are counted here, after the split.
    lines = lines.observe(RECORDS_METRIC.format(stream=stream.name), F.count(F.lit(1)).alias("records"))
    parse_options = {key: value for key, value in source.options.items() if key in _JSON_OPTIONS}
    text = F.col("value")
    if source.envelope is Envelope.DEBEZIUM:
        text = debezium_text(text, source, stream=stream.name)
    return parse_json_text(lines, text, source.read_schema, source.schema_evolution, parse_options,
                           {SOURCE_FILE_COLUMN: F.col(SOURCE_FILE_COLUMN)})
