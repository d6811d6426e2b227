"""Run catalog streams with ``trigger(availableNow=True)``: read, split, transform, write, then summarise.

Every stream of one call runs concurrently in the same Spark application. Each processes what has arrived since
its checkpoint, commits, and stops. The summary per stream reconciles the rows Spark read with the rows the sinks
committed; a mismatch fails the run, so nothing is dropped silently.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming import StreamingQuery

from sluice.catalog import Catalog
from sluice.connections.kafka import scrub
from sluice.connections.secrets import run_secrets, scrub_secrets
from sluice.constants import (
    CORRUPT_COLUMN,
    INGEST_TIME_COLUMN,
    SOURCE_FILE_COLUMN,
    CommitInfo,
    DeltaEngine,
    RunStatus,
    SchemaEvolution,
    SinkMode,
    TableRole,
)
from sluice.errors import SluiceError
from sluice.kinds.delta import DeltaSink
from sluice.lag.observe import text_append_backlog
from sluice.limits import DRIVER_WRITE_MAX_BYTES
from sluice.model.expectations import Violation
from sluice.model.patterns import LookupSpec
from sluice.model.schema import Column as DeclaredColumn
from sluice.model.sql import SqlTransform
from sluice.model.stream import StreamSpec, TriggerSpec
from sluice.model.transforms import TRANSFORMS
from sluice.model.types import parse as parse_type
from sluice.paths import Roots
from sluice.storage import runlog
from sluice.storage.checkpoint import ensure_query_id
from sluice.storage.delta import added_columns, batch_commits, ensure_table, table_version
from sluice.storage.lock import HeldLock, LockHeld
from sluice.storage.object_lock import lock_for
from sluice.summary import PhaseClock, RunSummary, StreamRunSummary
from sluice.times import iso_utc
from sluice_spark import faults, kinds
from sluice_spark.drift.fields import reads_by_header
from sluice_spark.kinds import explain_failure, read_stream
from sluice_spark.kinds.files import RECORDS_METRIC
from sluice_spark.session import (
    activate,
    preload_case_mappings,
    refuse_script_transforms,
    require_hadoop_connector,
    resolve_engine,
)
from sluice_spark.steps import patterns as steps
from sluice_spark.steps.patterns import with_watermark
from sluice_spark.steps.quality import check_expectations, expectation_counts, flag_dead_letters, rescued_count
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
    ROUTE_COLUMN,
    TableTarget,
)
from sluice_spark.write.batches import SinkRequest, sink_and_dead_letter

log = logging.getLogger(__name__)

LOST_LOCK = "lost the stream's lock to another run during this run; it was stopped"
CANCELLED = ("the run was cancelled (its client went away, or the warm server is stopping); its queries were "
             "stopped before the end of their input")

_STREAM_COLUMN = "_dead_letter_stream"
_DEAD_LETTER_FIELDS = (
    (RAW_COLUMN, "raw_record"),
    (REASON_COLUMN, "reason"),
    (SOURCE_FILE_COLUMN, "source_file"),
    (_STREAM_COLUMN, "stream"),
    (INGEST_TIME_COLUMN, "ingested_at"),
)
_INTERNAL_COLUMNS = {CORRUPT_COLUMN, REASON_COLUMN, RAW_COLUMN, ROUTE_COLUMN, _STREAM_COLUMN, FAILED_COLUMN,
                     NEW_FIELDS_COLUMN, NEW_COLUMNS_COLUMN, NEW_TYPES_COLUMN}


@dataclass
class PreparedStream:
    """A stream ready to start: its routed frame, its sink targets and the ids its commits carry."""

    spec: StreamSpec
    query_id: str
    engine: DeltaEngine
    frame: DataFrame
    targets: list[TableTarget]
    checkpoint: str
    summary: StreamRunSummary
    # The good rows' columns, as the sink receives them (a Delta sink's table, or a Kafka record's value).
    data_columns: list[str] = field(default_factory=list)
    # A Kafka sink's records sent per batch id (its topic has no commit log to count them from).
    sent_to_kafka: dict[int, int] = field(default_factory=dict)
    # A small run on the rs engine: each batch is collected to the driver (see :func:`collects_on_driver`).
    collect: bool = False
    # The columns ``add_new_columns`` added to the stream's table during this run, with their types.
    added_columns: dict[str, str] = field(default_factory=dict)


def build_routed_frame(spark: SparkSession, stream: StreamSpec, roots: Roots, *, path: str | None = None,
                       trigger: TriggerSpec | None = None,
                       engine: DeltaEngine = DeltaEngine.RS) -> tuple[DataFrame, list[str]]:
    """Source -> dead-letter flag -> transform -> patterns -> one frame carrying a route column. Returns it and the
    data columns of the stream's table. ``path`` and ``trigger`` override the source's (see ``read_stream``);
    ``engine`` reads lookup tables.
    """
    parsed = flag_dead_letters(read_stream(spark, stream, roots, path=path, trigger=trigger), stream)
    transformed = apply_transform(parsed, stream)
    transformed = check_expectations(transformed, stream,
                                     [name for name in transformed.columns if name not in _INTERNAL_COLUMNS])
    dimensions = [(spec, steps.read_dimension(spark, spec, roots, engine)) for spec in stream.patterns.lookup]
    if stream.patterns.stateful:
        routed, data_columns = _route_stateful(spark, stream, roots, transformed, dimensions)
    else:
        for spec, dimension in dimensions:
            transformed = steps.lookup(transformed, dimension, spec)
        data_columns = [name for name in transformed.columns if name not in _INTERNAL_COLUMNS]
        rejected = F.col(REASON_COLUMN).isNotNull()
        route = F.when(rejected, F.lit(DEAD_LETTER_ROUTE)).otherwise(F.lit(GOOD_ROUTE))
        routed = _route(transformed, [F.col(c) for c in data_columns], route, _fan_out_flags(stream, ~rejected),
                        stream=stream)
        data_columns = [*data_columns, INGEST_TIME_COLUMN]
    if isinstance(stream.transform, SqlTransform) or stream.expectations or stream.patterns.fan_out:
        refuse_script_transforms(routed, stream=stream.name)  # the catalog's SQL is in the plan: nothing ran yet
    return routed, data_columns


def _route_stateful(spark: SparkSession, stream: StreamSpec, roots: Roots, transformed: DataFrame,
                    dimensions: list[tuple[LookupSpec, DataFrame]]) -> tuple[DataFrame, list[str]]:
    """Good rows through the stateful steps, dead letters around them, one union in front of the sink.

    The watermark is set on the good rows only: a dead letter with a wild event time must not move it. Spark plans
    each branch with its own instance of the source, so a stateful stream scans its input twice per batch
    (``StreamSpec.checkpoint_sources``); both read the same versions, and one batch commits both.
    """
    patterns = stream.patterns
    rejected = F.col(REASON_COLUMN).isNotNull()
    keep = [name for name in transformed.columns if name not in _INTERNAL_COLUMNS]
    good = with_watermark(transformed.where(~rejected).select(*keep), patterns.watermark)
    dead = [transformed.where(rejected)]
    if patterns.dedupe is not None:
        good = steps.dedupe(good, patterns.dedupe)
    if patterns.join is not None:
        right = steps.read_joined(spark, stream, patterns.join, roots)
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
    no_fan_out = [F.lit(False).alias(_fan_out_column(index)) for index, _ in enumerate(patterns.fan_out)]
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
                        F.when(rejected, F.lit(stream.name)).alias(_STREAM_COLUMN), *fan_out, *failing)


def _fan_out_column(index: int) -> str:
    return f"_sluice_fan_out_{index}"


def _fan_out_flags(stream: StreamSpec, good: Column) -> list[Column]:
    """One boolean column per fan-out table: whether a good row goes there too. Its ``where`` is evaluated on good
    rows only: a dead letter may hold what the ``where`` cannot take under ANSI (a zero to divide by, which a rule
    quarantined)."""
    return [F.when(good, F.coalesce(F.expr(spec.where), F.lit(False))).otherwise(F.lit(False))
            .alias(_fan_out_column(index)) for index, spec in enumerate(stream.patterns.fan_out)]


def sink_targets(stream: StreamSpec, roots: Roots, data_columns: list[str]) -> list[TableTarget]:
    """The stream's tables (:meth:`StreamSpec.tables`: its own, its dead-letter table, its fan-out tables) as
    routes of the routed frame."""
    sink, aggregate = stream.sink, stream.patterns.aggregate
    output = [name for name in data_columns if name != INGEST_TIME_COLUMN]
    targets = []
    for table in stream.tables(roots):
        if table.role is TableRole.SINK:
            assert isinstance(sink, DeltaSink)
            keys = aggregate.key_columns if aggregate is not None and sink.mode is SinkMode.MERGE else sink.keys
            targets.append(TableTarget(GOOD_ROUTE, table.path, tuple((c, c) for c in data_columns), sink.partition_by,
                                       mode=sink.mode, keys=keys, sequence_by=sink.sequence_by))
        elif table.role is TableRole.DEAD_LETTER:
            targets.append(TableTarget(DEAD_LETTER_ROUTE, table.path, _DEAD_LETTER_FIELDS))
        else:
            spec = stream.patterns.fan_out[table.index]
            targets.append(TableTarget(GOOD_ROUTE, table.path,
                                       tuple((c, c) for c in [*(spec.columns or output), INGEST_TIME_COLUMN]),
                                       spec.partition_by, flag=_fan_out_column(table.index)))
    return targets


def tables_to_create(targets: list[TableTarget], engine: DeltaEngine) -> list[TableTarget]:
    """The targets :func:`create_tables` prepares before a run: all of them on the rs engine. The jvm engine creates
    an appended table on its first write, but needs the table of a merge (delta-spark merges only into a table), and
    an existing table gains the stream's new columns here all the same (delta-spark would refuse the append, or a
    merge would drop them)."""
    if engine is DeltaEngine.RS:
        return targets
    return [target for target in targets if target.mode is SinkMode.MERGE or table_version(target.path) is not None]


def create_tables(stream: StreamSpec, routed: DataFrame, targets: list[TableTarget]) -> None:
    """Create the targets' Delta tables with delta-rs from the routed frame's schema (the jvm engine creates its
    own on first write); an existing table must have the same schema."""
    arrow_schema = to_arrow_schema(routed.schema, timezone="UTC")
    for target in targets:
        fields = [arrow_schema.field(source).with_name(name) for source, name in target.columns]
        if target.flag:  # a fan-out table is named after its folder
            name = target.path.rstrip("/").rsplit("/", 1)[-1]
        else:
            name = stream.name if target.route == GOOD_ROUTE else f"{stream.name}_dead_letter"
        ensure_table(target.path, pa.schema(fields), target.partition_by, name=name, description=stream.description)


# Spark SQL's calls that go through its case mappings' class: the case functions (ILIKE lowers both of its sides),
# str_to_map and the collations (these two whatever the ICU setting; the preload follows the setting).
_CASE_MAPPINGS = re.compile(r"\b(?:lower|lcase|upper|ucase|initcap|str_to_map)\s*\(|\b(?:ilike|collate)\b",
                            re.IGNORECASE)


def maps_case(stream: StreamSpec) -> bool:
    """Whether a run of ``stream`` lowers or uppers strings in Spark: its SQL (the transform, a rule, a fan-out's
    ``where``) calls a case function, its Python transform declares that it does, or its CSV files are matched to its
    schema by their headers' names, without case. A name that only looks like a call costs an early load, no more."""
    texts = [rule.check for rule in stream.expectations] + [table.where for table in stream.patterns.fan_out]
    if isinstance(stream.transform, SqlTransform):
        texts.append(stream.transform.sql)
    elif TRANSFORMS[stream.transform].maps_case:
        return True
    return reads_by_header(stream.source) or any(_CASE_MAPPINGS.search(text) for text in texts)


def prepare_stream(spark: SparkSession, stream: StreamSpec, roots: Roots, *, run_id: str,
                   engine: DeltaEngine | None = None) -> PreparedStream:
    """Pin the query id, build the frame and create the Delta tables, all before Spark starts the query."""
    checkpoint = stream.checkpoint_path(roots)
    query_id = ensure_query_id(checkpoint)
    stream = with_added_columns(stream, roots)
    resolved = resolve_engine(spark, engine or stream.sink.engine, stream.locations(roots))
    routed, data_columns = build_routed_frame(spark, stream, roots, engine=resolved)
    targets = sink_targets(stream, roots, data_columns)
    kinds.sink(stream).check(spark, stream)
    create_tables(stream, routed, tables_to_create(targets, resolved))
    collect = collects_on_driver(stream, roots, resolved, targets)
    sink, dead = sink_and_dead_letter(targets)
    summary = StreamRunSummary(
        stream=stream.name,
        query_id=query_id,
        run_id=run_id,
        engine=resolved.value,
        delta_version_before=None if sink is None else table_version(sink.path),
        dead_letter_version_before=table_version(dead.path),
    )
    summary.write_path = "driver" if collect else None
    return PreparedStream(stream, query_id, resolved, routed, targets, checkpoint, summary, data_columns=data_columns,
                          collect=collect)


def with_added_columns(stream: StreamSpec, roots: Roots) -> StreamSpec:
    """The stream as a run reads it: under ``add_new_columns``, with the columns earlier batches added to its table
    (which records them in its schema: :func:`sluice.storage.delta.added_columns`) unless the catalog now declares
    them."""
    if stream.source.schema_evolution is not SchemaEvolution.ADD_NEW_COLUMNS or stream.sink.table is None:
        return stream
    declared = {name.casefold() for name in stream.source.schema.names}
    evolved = tuple(DeclaredColumn(name, kind, True, parse_type(kind)[0]) for name, kind in
                    added_columns(stream.sink_path(roots)).items() if name.casefold() not in declared)
    return replace(stream, source=replace(stream.source, evolved=evolved)) if evolved else stream


def collects_on_driver(stream: StreamSpec, roots: Roots, engine: DeltaEngine, targets: list[TableTarget]) -> bool:
    """True for a small run of a stream whose tables the rs engine appends to: a text file source holding at most
    ``SLUICE_DRIVER_WRITE_MAX_BYTES`` unread (default :data:`DRIVER_WRITE_MAX_BYTES`; 0 turns it off), as its lag
    probe measures it without Spark (:func:`sluice.lag.observe.text_append_backlog`). Its batches are then collected
    to the driver as Arrow and appended there with the same once-only Delta transaction: no Python data source to
    plan, no Python workers on the executors and none for the driver's commit, which on a cold application cost more
    than the small run's own work."""
    if engine is not DeltaEngine.RS or any(target.mode is not SinkMode.APPEND for target in targets):
        return False
    limit = int(os.environ.get("SLUICE_DRIVER_WRITE_MAX_BYTES", DRIVER_WRITE_MAX_BYTES))
    unread = text_append_backlog(stream, roots) if limit > 0 else None
    return unread is not None and unread <= limit


def start_stream(prepared: PreparedStream) -> StreamingQuery:
    writer = kinds.sink(prepared.spec).writer(SinkRequest(
        prepared.frame, prepared.spec, prepared.targets, prepared.data_columns, prepared.engine, prepared.query_id,
        commit_info={CommitInfo.RUN: prepared.summary.run_id}, sent=prepared.sent_to_kafka,
        collect=prepared.collect, added_columns=prepared.added_columns))
    query = (
        writer.queryName(prepared.spec.name)
        .option("checkpointLocation", prepared.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    if query.id != prepared.query_id:
        query.stop()
        raise SluiceError(
            f"stream '{prepared.spec.name}': Spark started query id {query.id}, not the pinned {prepared.query_id}"
        )
    return query


def _progress_rows(query: StreamingQuery, stream: str, scans: int = 1) -> dict[int, int]:
    """Input rows per executed batch id, from every progress report of this run.

    A report without an ``addBatch`` duration is an idle trigger that found no new data: no batch ran. A stateful
    stream reads each of its sources ``scans`` times (good rows and dead letters), and Spark counts every scan. A
    source whose input rows are not its records counts them itself (:data:`~sluice_spark.kinds.files.RECORDS_METRIC`).
    """
    rows: dict[int, int] = {}
    for progress in query.recentProgress:
        if "addBatch" in progress.durationMs:
            records = progress.observedMetrics.get(RECORDS_METRIC.format(stream=stream))
            # Spark counts every scan's input rows; an observed metric is reported once, whatever the scans.
            rows[int(progress.batchId)] = (int(progress.numInputRows) // scans if records is None
                                           else int(records.asDict()["records"]))
    return rows


def _state_counts(query: StreamingQuery) -> tuple[int, int, int]:
    """Rows the stateful operators dropped as late and as duplicates during this run, and the rows they hold in
    state at its end."""
    late = duplicates = 0
    held = 0
    for progress in query.recentProgress:
        operators = progress.stateOperators
        late += sum(int(op.numRowsDroppedByWatermark) for op in operators)
        duplicates += sum(int(op.customMetrics.get("numDroppedDuplicateRows", 0)) for op in operators)
        held = sum(int(op.numRowsTotal) for op in operators)
    return late, duplicates, held


def finish_stream(prepared: PreparedStream, query: StreamingQuery, started: float) -> StreamRunSummary:
    """Fill the summary once the query has ended; reconcile rows read with rows committed."""
    summary = prepared.summary
    summary.duration_seconds = round(time.monotonic() - started, 3)
    summary.ended_at = iso_utc(time.time())
    input_rows = _progress_rows(query, prepared.spec.name, scans=2 if prepared.spec.patterns.stateful else 1)
    summary.batch_ids = sorted(input_rows)
    summary.batches = len(input_rows)
    summary.input_rows = sum(input_rows.values())
    summary.late_rows, summary.duplicate_rows, summary.state_rows = _state_counts(query)
    summary.expectations, summary.dropped_rows = expectation_counts(query.recentProgress, prepared.spec)
    summary.rescued_rows = rescued_count(query.recentProgress, prepared.spec)
    summary.added_columns = dict(prepared.added_columns)
    data, dead = sink_and_dead_letter(prepared.targets)
    summary.delta_version_after = None if data is None else table_version(data.path)
    summary.dead_letter_version_after = table_version(dead.path)

    def committed(target: TableTarget, since: int | None) -> int:
        commits = batch_commits(target.path, query_id=prepared.query_id, batch_ids=input_rows, since_version=since)
        return sum(commit.rows for commit in commits)

    summary.output_rows = (sum(prepared.sent_to_kafka.get(batch, 0) for batch in input_rows) if data is None
                           else committed(data, summary.delta_version_before))
    summary.dead_letter_rows = committed(dead, summary.dead_letter_version_before)
    error = query.exception()
    if error is not None:
        summary.status = RunStatus.FAILED
        explanation = explain_failure(prepared.spec, error)
        summary.error = explanation or error_message(error)
        summary.retryable = explanation is None and not is_permanent_failure(summary.error)
    elif (not prepared.spec.patterns.stateful
          and summary.input_rows != summary.output_rows + summary.dropped_rows + summary.dead_letter_rows):
        # A stateful stream drops late rows and duplicates, and an aggregate turns rows into groups: there the
        # counts are reported, not reconciled.
        summary.status = RunStatus.FAILED
        summary.retryable = False
        summary.error = (
            f"row reconciliation failed: read {summary.input_rows} rows but committed {summary.output_rows} good "
            f"and {summary.dead_letter_rows} dead-letter rows, and dropped {summary.dropped_rows}, in batches "
            f"{summary.batch_ids}"
        )
    else:
        summary.status = RunStatus.SUCCEEDED
    return summary


# Spark's words for a checkpoint that lacks what a resume needs: the same run fails the same way until someone
# restores or resets the checkpoint, so Airflow must not retry it.
_PERMANENT_FAILURES = re.compile(
    r"batch \d+ doesn't exist|Unable to find batch|Error reading (?:delta|snapshot) file .* of HDFSStateStoreProvider|"
    r"STATE_STORE_\w*(?:NOT_FOUND|CORRUPT)|CANNOT_LOAD_STATE_STORE|expectation\(s\) failed in batch|"
    r"new field\(s\) not in the declared schema in batch|cannot add new columns in batch"
)


# Spark's ANSI errors for a value an expression cannot take (Spark 4 runs SQL under ANSI by default): the same rows
# meet the same expression on every rerun.
_ANSI_VALUE_ERRORS = re.compile(
    r"\[(?:CAST_INVALID_INPUT|CAST_OVERFLOW\w*|DIVIDE_BY_ZERO|INTERVAL_DIVIDED_BY_ZERO|ARITHMETIC_OVERFLOW|"
    r"BINARY_ARITHMETIC_OVERFLOW|NUMERIC_VALUE_OUT_OF_RANGE\w*|INVALID_ARRAY_INDEX\w*|INVALID_INDEX_OF_ZERO|"
    r"DATETIME_OVERFLOW|DATETIME_FIELD_OUT_OF_BOUNDS|INVALID_FRACTION_OF_SECOND|CANNOT_PARSE_TIMESTAMP|"
    r"CONVERSION_INVALID_INPUT|INVALID_VARIANT_CAST)[\].]"
)
ANSI_HINT = ("; a value of the batch broke an expression of the stream (its transform, a rule, a cast) under ANSI SQL, "
             "so every rerun fails the same way: write it with the try_* functions (try_cast, try_divide, "
             "try_element_at...) or catch such rows with an expectation; Spark names the expression above")


def is_permanent_failure(message: str) -> bool:
    """True for a query error that a rerun of the same checkpoint cannot get past."""
    return _PERMANENT_FAILURES.search(message) is not None or _ANSI_VALUE_ERRORS.search(message) is not None


def explained(message: str) -> str:
    """A query's error, with what to do about an ANSI error (see :data:`ANSI_HINT`)."""
    if _ANSI_VALUE_ERRORS.search(message) is None:
        return message
    return f"{message[:2000 - len(ANSI_HINT)]}{ANSI_HINT}"


_PYTHON_EXCEPTION = re.compile(r"^(?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Failed|Exit|Interrupt)(?::|$)")


def error_message(error: BaseException) -> str:
    """The first line of a query's error, and its root cause: Spark wraps most causes in a generic message; an
    ANSI error says what to do (:func:`explained`)."""
    def first_line(exc: BaseException) -> str:
        text = str(exc).strip()
        if not text:
            return repr(exc)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if "Traceback (most recent call last)" not in text:
            return lines[0]
        # A Python error raised in foreachBatch or a Python data source arrives as a traceback, with Spark's plan
        # after it: the line that names the Python exception says what happened.
        raised = next((line for line in lines[1:] if _PYTHON_EXCEPTION.match(line)), lines[-1])
        # A JVM error met inside the Python code (a batch collected in foreachBatch) carries its Java stack in the
        # traceback's text: its last cause is what went wrong.
        causes = [line for line in lines if line.startswith("Caused by: ")]
        return f"{lines[0]} {raised}" + (f" {causes[-1]}" if causes else "")

    message, root, seen = first_line(error), error, 0
    # pyspark keeps the JVM cause chain on captured exceptions as ``_cause``.
    while getattr(root, "_cause", None) is not None and seen < 20:
        root, seen = root._cause, seen + 1  # type: ignore[attr-defined]
    cause = first_line(root)
    if root is not error and cause[-200:] not in message:  # a Python error repeats in its JVM wrapper
        message = f"{message} Caused by: {cause}"
    return explained(message[:2000])


def run_streams(spark: SparkSession, catalog: Catalog, names: list[str], roots: Roots, *,
                run_id: str | None = None, engine: DeltaEngine | None = None,
                clock: PhaseClock | None = None, cancel: threading.Event | None = None) -> RunSummary:
    """Run the named streams to the end of their available input, concurrently, and summarise each. ``clock``
    (from the application's start) gets a lap per phase: lock, prepare, query, finish, run_log. Setting ``cancel``
    (the warm server does, when the run's client goes away) stops the run's queries; their streams fail, retryably.
    """
    cancel = cancel or threading.Event()
    run_id = run_id or str(uuid.uuid4())
    clock = clock or PhaseClock()
    streams = catalog.select(names)
    activate(spark)
    if any(maps_case(stream) for stream in streams):
        preload_case_mappings(spark)  # on the other core, while the locks are taken and the frames built
    with contextlib.ExitStack() as locks:
        # One writer per checkpoint: every lock is taken before anything is read or written.
        held: dict[str, HeldLock] = {}
        for stream in streams:
            checkpoint = stream.checkpoint_path(roots)
            require_hadoop_connector(spark, checkpoint, f"stream '{stream.name}': checkpoint")
            held[stream.name] = lock = lock_for(checkpoint, stream.name, run_id)
            locks.enter_context(lock)
        clock.lap("lock")
        prepared = [prepare_stream(spark, stream, roots, run_id=run_id, engine=engine) for stream in streams]
        clock.lap("prepare")
        started, started_at = time.monotonic(), time.time()
        running: list[tuple[PreparedStream, StreamingQuery]] = []
        cancelled = {item.spec.name for item in prepared}  # until it starts, or ends by itself
        try:
            for item in prepared:
                if cancel.is_set():
                    break
                running.append((item, start_stream(item)))
                cancelled.discard(item.spec.name)
                await_sources(running[-1][1], cancel)
            for item, query in running:
                if await_query(item.spec.name, query, held[item.spec.name], cancel) == CANCELLED:
                    cancelled.add(item.spec.name)
        finally:
            for _, query in running:
                if query.isActive:
                    query.stop()
        clock.lap("query")
        summaries = [finish_stream(item, query, started) for item, query in running]
        summaries += [item.summary for item in prepared[len(running):]]  # cancelled before they started
        for summary in summaries:
            summary.started_at = iso_utc(started_at)
            if held[summary.stream].lost:  # the cause, whatever else the stopped query reported
                summary.status, summary.retryable = RunStatus.FAILED, True
                summary.error = LOST_LOCK
            elif summary.stream in cancelled and summary.status in (RunStatus.SUCCEEDED, RunStatus.PENDING):
                # A stopped query reports no error, and the batches it ran reconcile: it did not reach the end.
                summary.status, summary.retryable = RunStatus.FAILED, True
                summary.error = CANCELLED
        clock.lap("finish")
        scrub_errors(summaries)
        write_run_log(roots, [runlog.run_row(summary) for summary in summaries],
                      [row for item, query in running for row in batch_rows(item.spec.name, run_id, query)])
        faults.reach("run_logged")
        clock.lap("run_log")
    return RunSummary(app_id=spark.sparkContext.applicationId, streams=summaries, phases_seconds=clock.seconds)


def run_or_refuse(spark: SparkSession, catalog: Catalog, names: list[str], roots: Roots, **options: Any) -> RunSummary:
    """:func:`run_streams`, with a refusal before anything ran (a held lock, a bad root) as every stream's failed
    summary. A held lock clears when the other run ends, so a retry can succeed; other refusals need a fix."""
    try:
        return run_streams(spark, catalog, names, roots, **options)
    except SluiceError as exc:
        return RunSummary(spark.sparkContext.applicationId, [
            StreamRunSummary(stream=name, status=RunStatus.FAILED, error=str(exc), retryable=isinstance(exc, LockHeld))
            for name in names])


def scrubbed(summary: RunSummary) -> RunSummary:
    """``summary`` without the secrets this process was given (:mod:`sluice.connections.secrets`): a Spark error may
    quote a client option or a value, and no credential may reach XCom, the task log or the run log."""
    scrub_errors(summary.streams)
    return summary


def scrub_errors(summaries: Iterable[StreamRunSummary]) -> None:
    secrets = run_secrets()
    for summary in summaries:
        if summary.error and secrets:
            summary.error = scrub(summary.error, secrets)


def write_run_log(roots: Roots, runs: list[dict[str, Any]], batches: list[dict[str, Any]]) -> None:
    """Record runs and their batches in the run log (:mod:`sluice.storage.runlog`) while the streams' locks are
    held. The tables are committed already: a run log that cannot be written is logged, not a failed run."""
    try:
        runlog.record_batches(roots.lake, batches)
        runlog.record_runs(roots.lake, runs)
    except Exception as exc:
        log.error("could not write the run log under %s: %s", roots.lake, scrub_secrets(str(exc)))


def batch_rows(stream: str, run_id: str, query: StreamingQuery) -> list[dict[str, Any]]:
    """The run log's rows of a query's executed batches, from Spark's progress reports."""
    rows = []
    for progress in query.recentProgress:
        if "addBatch" not in progress.durationMs:
            continue  # an idle trigger: no batch ran
        operators = progress.stateOperators
        rows.append({
            "stream": stream, "run_id": run_id, "query_id": str(progress.id), "batch_id": int(progress.batchId),
            "timestamp": dt.datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")),
            "duration_ms": int(progress.batchDuration), "phases_ms": runlog.json_text(dict(progress.durationMs)),
            "input_rows": int(progress.numInputRows),
            "input_rows_per_second": _finite(progress.inputRowsPerSecond),
            "processed_rows_per_second": _finite(progress.processedRowsPerSecond),
            "state_rows": runlog.total(op.numRowsTotal for op in operators),
            "state_memory_bytes": runlog.total(op.memoryUsedBytes for op in operators),
            "watermark": progress.eventTime.get("watermark"),
            "sources": runlog.json_text([{"description": source.description, "start": source.startOffset,
                                          "end": source.endOffset, "input_rows": source.numInputRows}
                                         for source in progress.sources]),
        })
    return rows


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) or math.isinf(value) else float(value)


def await_sources(query: StreamingQuery, cancel: threading.Event, timeout: float = 120.0) -> None:
    """Wait until a started query has initialized its sources. A Python data source starts a Python worker on the
    driver that must connect back within Spark's fixed 10 s; several queries starting at once on a small, busy
    driver miss it (measured: six at once on 2 cores under load). Starting them one after another costs a second
    each."""
    deadline = time.monotonic() + timeout
    while (query.isActive and query.status["message"] == "Initializing sources" and time.monotonic() < deadline
           and not cancel.is_set()):
        time.sleep(0.05)


def await_query(name: str, query: StreamingQuery, lock: HeldLock, cancel: threading.Event | None = None) -> str | None:
    """Wait for a query to end; stop it if another run took its lock (this run's heartbeat stalled past expiry) or
    the run was cancelled. Returns why it was stopped, None when it ended by itself. A query's error is left for the
    caller to read from ``query.exception()``."""
    while True:
        try:
            if query.awaitTermination(1):
                return None
        except Exception as exc:
            log.error("query %s failed: %s", name, scrub_secrets(str(exc)))
            return None
        why = LOST_LOCK if lock.lost else CANCELLED if cancel is not None and cancel.is_set() else None
        if why is not None:
            log.error("query %s: %s; stopping it", name, why)
            query.stop()
            return why


