"""Enums and constants shared by the catalog, the Spark apps and the Airflow plugins."""

from __future__ import annotations

from enum import Enum


class SourceType(str, Enum):
    FILES = "files"
    RATE = "rate"
    # Another Delta table, read by version: a silver or gold stream reading bronze or silver.
    DELTA = "delta"
    # Topics of a Kafka cluster; the brokers and their security settings come from an Airflow connection.
    KAFKA = "kafka"


class FileFormat(str, Enum):
    JSON = "json"
    CSV = "csv"
    PARQUET = "parquet"
    DELTA = "delta"
    # Kafka record values encoded as Avro binary (needs the spark-avro package at run time).
    AVRO = "avro"


class SinkFormat(str, Enum):
    """Where a stream's good rows go: a Delta table (exactly once) or a Kafka topic (at least once)."""

    DELTA = "delta"
    KAFKA = "kafka"


class SinkMode(str, Enum):
    """How a batch's rows reach the table: appended (Spark's append output mode), upserted by key (update output
    mode, through a Delta MERGE), or the whole result rewritten (complete output mode, for small aggregates)."""

    APPEND = "append"
    MERGE = "merge"
    COMPLETE = "complete"


class DeltaEngine(str, Enum):
    """How the Delta sink is written: delta-spark's JVM connector, Sluice's delta-rs data source, or whichever loads."""

    AUTO = "auto"
    JVM = "jvm"
    RS = "rs"


# Columns the bronze layer adds to every good row.
INGEST_TIME_COLUMN = "_ingested_at"
SOURCE_FILE_COLUMN = "_source_file"

# Columns a Kafka source adds to every row: the record's key (as a string) and the broker's timestamp. Its
# ``_source_file`` is ``kafka://<topic>/<partition>/<offset>``.
KAFKA_KEY_COLUMN = "_kafka_key"
KAFKA_TIMESTAMP_COLUMN = "_kafka_timestamp"

# The marker in front of the run summary JSON line on the driver's stdout.
SUMMARY_MARKER = "SLUICE_RUN_SUMMARY "
# ... and in front of a backfill's summary.
BACKFILL_MARKER = "SLUICE_BACKFILL_SUMMARY "

# Delta commit info keys that Sluice writes on every batch commit, and reads back for summaries and checks.
COMMIT_INFO_STREAM = "sluice.stream"
COMMIT_INFO_QUERY = "sluice.queryId"
COMMIT_INFO_BATCH = "sluice.batchId"
COMMIT_INFO_ROUTE = "sluice.route"
COMMIT_INFO_RECORDS = "sluice.numRecords"
# ... and on the commit of a reset (``sluice.repair reset``), which sets a query's transaction version back.
COMMIT_INFO_ACTION = "sluice.action"
COMMIT_INFO_RESET_QUERY = "sluice.reset.queryId"
COMMIT_INFO_RESET_BATCH = "sluice.reset.afterBatch"
COMMIT_INFO_RESET_VERSION = "sluice.reset.sinkVersion"

DEFAULT_CHECKPOINT_INTERVAL = 10
