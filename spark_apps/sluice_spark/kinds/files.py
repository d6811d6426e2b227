"""The file source in Spark: a landing-zone folder read with its declared schema.

JSON and CSV are read in PERMISSIVE mode, so that a malformed record becomes a row with ``_corrupt_record`` set
instead of failing the batch; :mod:`sluice_spark.quality` then routes it to the dead-letter table with a reason.
``_source_file`` is each row's file.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sluice.constants import CORRUPT_COLUMN, SOURCE_FILE_COLUMN, FileFormat
from sluice.kinds.files import FileSource
from sluice.model.stream import StreamSpec, TriggerSpec
from sluice.paths import Roots
from sluice_spark.session import require_hadoop_connector


def read(spark: SparkSession, stream: StreamSpec, roots: Roots, *, path: str | None, trigger: TriggerSpec) -> DataFrame:
    """The landing folder (or ``path``, a backfill's glob of the files it selected) as a streaming DataFrame."""
    source = stream.source
    assert isinstance(source, FileSource)
    if path is None:
        path = stream.source_path(roots)
        require_hadoop_connector(spark, path, f"stream '{stream.name}': landing folder")
        if "://" not in path:
            # A landing zone nobody has written to yet is empty, not an error: the run finds nothing and ends.
            Path(path).mkdir(parents=True, exist_ok=True)
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
