"""Enums and constants shared by the catalog, the Spark apps and the Airflow plugins."""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A word of Sluice's vocabulary: compared, hashed, printed and stored as its value (``f"{SinkMode.MERGE}"`` is
    ``merge``), so it can go into a log, a command line, a JSON document or a SQLite row as it is."""

    def __str__(self) -> str:
        return str(self.value)


class SourceType(Word):
    FILES = "files"
    # Another Delta table, read by version: a silver or gold stream reading bronze or silver.
    DELTA = "delta"
    # Topics of a Kafka cluster; the brokers and their security settings come from an Airflow connection.
    KAFKA = "kafka"
    # A table of an Iceberg catalog, read by snapshot (appends only): a silver or gold stream reading an Iceberg bronze.
    ICEBERG = "iceberg"


class FileFormat(Word):
    JSON = "json"
    CSV = "csv"
    PARQUET = "parquet"
    DELTA = "delta"
    ICEBERG = "iceberg"
    # Kafka record values encoded as Avro binary (needs the spark-avro package at run time).
    AVRO = "avro"


class SchemaEvolution(Word):
    """What a stream does with fields its declared schema does not read (``source.schema_evolution``)."""

    # Keep them, and values that do not fit their declared type, as JSON in ``_rescued_data``.
    RESCUE = "rescue"
    # Add a new top-level field to the table's schema in the commit of the batch that brought it.
    ADD_NEW_COLUMNS = "add_new_columns"
    # Stop the run before its batch with a new field is committed anywhere, naming the fields and their files.
    FAIL_ON_NEW_COLUMNS = "fail_on_new_columns"
    # Read the declared columns only; a value that does not fit its type sends the record to the dead letters.
    NONE = "none"


class SinkFormat(Word):
    """Where a stream's good rows go: a Delta table (exactly once), a Kafka topic (at least once) or an Iceberg
    table (exactly once)."""

    DELTA = "delta"
    KAFKA = "kafka"
    ICEBERG = "iceberg"


class SinkMode(Word):
    """How a batch's rows reach the table: appended (Spark's append output mode), upserted by key (update output
    mode, through a Delta MERGE), or the whole result rewritten (complete output mode, for small aggregates)."""

    APPEND = "append"
    MERGE = "merge"
    COMPLETE = "complete"
    # A feed of changes (upserts and deletes) applied by key in sequence order: type 1 (the newest row per key) or
    # type 2 (every version, with its validity), whatever order the changes arrive in (``sink.cdc``).
    CDC = "cdc"


class Envelope(Word):
    """How a source's record wraps its row (``source.envelope``): not at all, or Debezium's change event."""

    NONE = "none"
    DEBEZIUM = "debezium"


class OnTruncate(Word):
    """What a Debezium truncate event does (``source.envelope_truncate``): stop the run, or be skipped."""

    FAIL = "fail"
    IGNORE = "ignore"


class BackfillMode(Word):
    """How a backfill writes its range: appended to the tables, or swapped in for the rows the range held."""

    APPEND = "append"
    REPLACE = "replace"


class CleanAction(Word):
    """What ``source.clean`` does with a landing file that committed batches have read, once it is old enough."""

    ARCHIVE = "archive"
    DELETE = "delete"


class AlertChannel(Word):
    """Where the lag monitor sends an alert; each channel keeps its own alert state."""

    LOG = "log"
    WEBHOOK = "webhook"
    EMAIL = "email"


class HealthGate(Word):
    """Where a stream's DAG checks its checkpoint before each run (``health_gate``)."""

    # A task of its own before the run's: a FAIL shows as that task failing, and Spark never starts.
    TASK = "task"
    # Inside the run's task, before Spark starts: one task (and one scheduler hop) less per run.
    INLINE = "inline"


class RunStatus(Word):
    """How a stream run or a backfill ended, as its summary and XCom say."""

    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    # A backfill whose params or catalog were refused before anything was read.
    REFUSED = "refused"


class TableRole(Word):
    """What a Delta table is to the stream that writes it."""

    SINK = "sink"
    DEAD_LETTER = "dead_letter"
    FAN_OUT = "fan_out"
    # A cdc table's remembered deletes (:data:`CDC_TOMBSTONES`), committed after the table in each batch.
    TOMBSTONES = "tombstones"


class DeltaEngine(Word):
    """How the Delta sink is written: delta-spark's JVM connector, Sluice's delta-rs data source, or whichever loads."""

    AUTO = "auto"
    JVM = "jvm"
    RS = "rs"


# Columns the bronze layer adds to every good row.
INGEST_TIME_COLUMN = "_ingested_at"
SOURCE_FILE_COLUMN = "_source_file"
# Every source's reader hands on this column: the record's text when it did not parse, else NULL.
CORRUPT_COLUMN = "_corrupt_record"

# Under the ``rescue`` drift policy, each good row's fields the declared schema does not read (undeclared ones at any
# depth, and values that do not fit their declared type), as one JSON object by path; NULL when there are none.
RESCUED_COLUMN = "_rescued_data"
# The dead-letter table's column that marks a dead letter a redrive landed in the stream's table: the redrive's run id
# (NULL on every other row). A redrive selects only rows without it, so none is redriven twice.
REDRIVEN_BY_COLUMN = "redriven_by"
# The Delta column metadata key that marks a column ``add_new_columns`` added to a stream's table, with the batch that
# brought it (``<query id>:<batch id>``). The table's schema is where a stream records the columns it now reads: the
# column arrives in the same commit as its batch's rows, so no crash can separate the two.
ADDED_COLUMN_KEY = "sluice.addedBy"

# Columns a Kafka source adds to every row: the record's key (as a string) and the broker's timestamp. Its
# ``_source_file`` is ``kafka://<topic>/<partition>/<offset>``.
KAFKA_KEY_COLUMN = "_kafka_key"
KAFKA_TIMESTAMP_COLUMN = "_kafka_timestamp"

# The marker in front of the run summary JSON line on the driver's stdout.
SUMMARY_MARKER = "SLUICE_RUN_SUMMARY "
# ... and in front of a backfill's summary.
BACKFILL_MARKER = "SLUICE_BACKFILL_SUMMARY "
# ... and in front of a redrive's.
REDRIVE_MARKER = "SLUICE_REDRIVE_SUMMARY "

class CommitInfo(Word):
    """The keys Sluice writes into a Delta commit's commitInfo: what health, repair, the run summary and a reader of
    the table's history read back. Each batch commit says which stream, query, batch and route wrote it; a reset,
    a repair action and a backfill say what they did."""

    STREAM = "sluice.stream"
    QUERY = "sluice.queryId"
    BATCH = "sluice.batchId"
    ROUTE = "sluice.route"
    RECORDS = "sluice.numRecords"
    # A type 2 cdc batch's versions closed (a current version given its end).
    VERSIONS_CLOSED = "sluice.cdc.versionsClosed"
    RUN = "sluice.runId"
    # A repair's commit: the action, and for a reset which query it set back, to which batch and sink version.
    ACTION = "sluice.action"
    RESET_STREAM = "sluice.reset.stream"
    RESET_QUERY = "sluice.reset.queryId"
    RESET_BATCH = "sluice.reset.afterBatch"
    RESET_VERSION = "sluice.reset.sinkVersion"
    # A backfill's commits: its run, its own query, its mode, its range, the operator's reason and the batch.
    BACKFILL_RUN = "sluice.backfill.runId"
    BACKFILL_QUERY = "sluice.backfill.queryId"
    BACKFILL_MODE = "sluice.backfill.mode"
    BACKFILL_RANGE = "sluice.backfill.range"
    BACKFILL_REASON = "sluice.backfill.reason"
    BACKFILL_BATCH = "sluice.backfill.batchId"
    # A redrive's commits: its run (the Delta transaction's app id is ``sluice-redrive/<stream>/<run key>``).
    REDRIVE_RUN = "sluice.redrive.runId"
    # A maintenance's commits (compaction, vacuum): its run.
    MAINTENANCE = "sluice.maintenance.runId"

DEFAULT_CHECKPOINT_INTERVAL = 10


class Severity(Word):
    """A health finding's weight: FAIL stops the run before Spark starts, WARN is logged."""

    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"


class FaultCode(Word):
    """The stable codes of the checkpoint health checks. :data:`FAULT_CODES` says what each means; the docs' table
    of codes is :func:`fault_code_table` (a test keeps the two equal)."""

    NEW = "NEW"
    METADATA_MISSING = "METADATA_MISSING"
    METADATA_CORRUPT = "METADATA_CORRUPT"
    OFFSETS_CORRUPT = "OFFSETS_CORRUPT"
    UNCOMMITTED_BATCH = "UNCOMMITTED_BATCH"
    COMMIT_WITHOUT_OFFSETS = "COMMIT_WITHOUT_OFFSETS"
    GAP = "GAP"
    SOURCE_COUNT_MISMATCH = "SOURCE_COUNT_MISMATCH"
    SOURCE_LOG_MISSING = "SOURCE_LOG_MISSING"
    SINK_AHEAD_OF_CHECKPOINT = "SINK_AHEAD_OF_CHECKPOINT"
    QUERY_ID_UNKNOWN_TO_SINK = "QUERY_ID_UNKNOWN_TO_SINK"
    STALE = "STALE"
    LOCKED = "LOCKED"
    STATE_MISSING = "STATE_MISSING"
    LANDING_SYMLINK = "LANDING_SYMLINK"
    ODD_LOG_FILE = "ODD_LOG_FILE"


# Each code's usual severity and its meaning, for the docs (fault_code_table).
FAULT_CODES: dict[FaultCode, tuple[Severity, str]] = {
    FaultCode.NEW: (Severity.OK, "no batch has run yet"),
    FaultCode.METADATA_MISSING: (Severity.FAIL, "the query id is lost: replays would no longer be deduplicated"),
    FaultCode.METADATA_CORRUPT: (Severity.FAIL, "the `metadata` file does not parse"),
    FaultCode.OFFSETS_CORRUPT: (Severity.FAIL, "the latest `offsets/N` is torn"),
    FaultCode.UNCOMMITTED_BATCH: (Severity.WARN, "batch N was planned, not committed: Spark replays it, the sink "
                                                 "skips what it holds"),
    FaultCode.COMMIT_WITHOUT_OFFSETS: (Severity.FAIL, "a commit has no offsets file: the logs were edited or partly "
                                                      "restored"),
    FaultCode.GAP: (Severity.FAIL, "`offsets/` or `commits/` misses a batch between two others: Spark cannot replay "
                                   "across it"),
    FaultCode.SOURCE_COUNT_MISMATCH: (Severity.FAIL, "the checkpoint belongs to another query"),
    FaultCode.SOURCE_LOG_MISSING: (Severity.FAIL, "a file source's log (`sources/<i>/`) lacks batches Spark needs to "
                                                  "resume; no retry can fix it"),
    FaultCode.SINK_AHEAD_OF_CHECKPOINT: (Severity.FAIL, "a Delta table holds batches the checkpoint never planned (old "
                                                        "backup restored)"),
    FaultCode.QUERY_ID_UNKNOWN_TO_SINK: (Severity.FAIL, "a new checkpoint in front of a table this stream already fed "
                                         "(a likely full duplicate load); `allow_new_query_id: true` in the catalog "
                                         "makes it a WARN"),
    FaultCode.STALE: (Severity.WARN, "no commit for longer than `alerts.stale_after_seconds`"),
    FaultCode.LOCKED: (Severity.FAIL, "another run holds the stream's lock (the gate waits for that run to end, then "
                                      "retries), or something other than a lock file sits at its path"),
    FaultCode.STATE_MISSING: (Severity.FAIL, "a stateful stream lost its `state/` folder"),
    FaultCode.LANDING_SYMLINK: (Severity.FAIL, "the landing zone holds a symbolic link, which Spark would follow to "
                                               "read any host file"),
    FaultCode.ODD_LOG_FILE: (Severity.WARN, "a file of `offsets/`, `commits/` or `sources/<i>/` is named as no batch "
                                            "Spark writes (past 2^63-1, or not ASCII digits): Spark and Sluice skip "
                                            "it; remove it"),
}


def fault_code_table() -> str:
    """The docs' table of health codes, as Markdown (docs/hooks/reference.py)."""
    rows = [f"| `{code.value}` | {severity.value} | {meaning} |" for code, (severity, meaning) in FAULT_CODES.items()]
    return "\n".join(["| code | status | meaning |", "| --- | --- | --- |", *rows])

# A Debezium envelope, unwrapped (:mod:`sluice_spark.steps.envelope`): the row's columns plus its operation
# (c, u, r, d, t), the event's ts_ms and one orderable sequence (ts_ms, then the catalog's tiebreak).
DEBEZIUM_OP_COLUMN = "__op"
DEBEZIUM_TS_COLUMN = "__ts_ms"
DEBEZIUM_SEQUENCE_COLUMN = "__sequence"
DEBEZIUM_COLUMNS = {DEBEZIUM_OP_COLUMN: "STRING", DEBEZIUM_TS_COLUMN: "BIGINT",
                    DEBEZIUM_SEQUENCE_COLUMN: "DECIMAL(38,0)"}
# A CDC table of type 2: when each version of a key became current, and when it stopped being (NULL: current).
CDC_START_COLUMN = "__start_at"
CDC_END_COLUMN = "__end_at"
# A cdc table's remembered deletes: a Delta table in this folder inside the table's own (readers and VACUUM leave a
# folder whose name starts with ``_`` alone).
CDC_TOMBSTONES = "_sluice_tombstones"
