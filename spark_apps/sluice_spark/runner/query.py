"""A stream's query: started, awaited (stopped when the run loses its lock or is cancelled), and summarised once it
ended, its rows read reconciled with the rows its tables committed."""

from __future__ import annotations

import logging
import threading
import time
from enum import Enum
from typing import Any

from pyspark.sql.streaming import StreamingQuery

from sluice.constants import CommitInfo, RunStatus
from sluice.errors import SluiceError
from sluice.kinds import sink_table_format
from sluice.kinds.credentials import scrub_secrets
from sluice.storage.delta import batch_commits, brought_up_to_date, open_if_table
from sluice.storage.lock import HeldLock
from sluice.summary import StreamRunSummary
from sluice.times import iso_utc
from sluice_spark import kinds
from sluice_spark.kinds import explain_failure
from sluice_spark.kinds.files import RECORDS_METRIC
from sluice_spark.runner.failures import error_message, is_permanent
from sluice_spark.runner.prepare import PreparedStream, sink_snapshot_id
from sluice_spark.steps.quality import expectation_counts, rescued_count
from sluice_spark.targets import GOOD_ROUTE, TableTarget
from sluice_spark.write.batches import SinkRequest, sink_and_dead_letter

log = logging.getLogger(__name__)


class Stopped(Enum):
    """Why the runner stopped a query before the end of its input; the value is the stream's error."""

    LOST_LOCK = "lost the stream's lock to another run during this run; it was stopped"
    CANCELLED = ("the run was cancelled (its client went away, or the warm server is stopping); its queries were "
                 "stopped before the end of their input")


LOST_LOCK = Stopped.LOST_LOCK.value
CANCELLED = Stopped.CANCELLED.value


def start_stream(prepared: PreparedStream) -> StreamingQuery:
    writer = kinds.sink(prepared.spec).writer(SinkRequest(
        prepared.frame, prepared.spec, prepared.targets, prepared.data_columns, prepared.engine, prepared.query_id,
        commit_info={CommitInfo.RUN: prepared.summary.run_id}, sent=prepared.sent_to_kafka,
        collect=prepared.collect, added_columns=prepared.added_columns, roots=prepared.roots,
        tables=prepared.tables))
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


def await_sources(query: StreamingQuery, cancel: threading.Event, timeout: float = 120.0) -> None:
    """Wait until a started query has initialized its sources. A Python data source starts a Python worker on the
    driver that must connect back within Spark's fixed 10 s; several queries starting at once on a small, busy
    driver miss it (measured: six at once on 2 cores under load). Starting them one after another costs a second
    each."""
    deadline = time.monotonic() + timeout
    while (query.isActive and query.status["message"] == "Initializing sources" and time.monotonic() < deadline
           and not cancel.is_set()):
        time.sleep(0.05)


def await_query(name: str, query: StreamingQuery, lock: HeldLock,
                cancel: threading.Event | None = None) -> Stopped | None:
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
        why = Stopped.LOST_LOCK if lock.lost else Stopped.CANCELLED if cancel is not None and cancel.is_set() else None
        if why is not None:
            log.error("query %s: %s; stopping it", name, why.value)
            query.stop()
            return why


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


def sent_rows(prepared: PreparedStream, batches: dict[int, int]) -> int:
    """The good rows a sink that is no Delta table took in ``batches``: as its writer counted them on the driver
    (Kafka, an Iceberg merge), else from the batch commits of its table (an Iceberg append, committed by a data
    source's writer in a Python worker)."""
    if prepared.sent_to_kafka or prepared.roots is None:
        return sum(prepared.sent_to_kafka.get(batch, 0) for batch in batches)
    table = sink_table_format(prepared.spec, prepared.roots)
    if table is None:
        return 0
    rows = {commit.batch_id: commit.rows or 0 for commit in table.commits(limit=2 * len(batches) + 50)
            if commit.query_id == prepared.query_id and commit.batch_id in batches}
    return sum(rows.values())


def _version(table: Any) -> int | None:
    return None if table is None else int(table.version())


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
    # Each table's version and commits from one state of it: the one the run loaded, brought up to date, else a
    # load (a load replays the newest log checkpoint, and costs more as the table's history grows).
    loaded = prepared.tables
    tables = {target.path: brought_up_to_date(target.path, loaded[target.path]) if target.path in loaded
              else open_if_table(target.path) for target in (data, dead) if target is not None}
    summary.delta_version_after = None if data is None else _version(tables[data.path])
    summary.dead_letter_version_after = _version(tables[dead.path])
    if prepared.roots is not None:
        summary.snapshot_id_after = sink_snapshot_id(prepared.spec, prepared.roots)

    def committed(target: TableTarget, since: int | None) -> int:
        commits = batch_commits(target.path, query_id=prepared.query_id, batch_ids=input_rows, since_version=since,
                                table=tables[target.path])
        if target.route == GOOD_ROUTE:
            changes = [commit.changes for commit in commits if commit.changes]
            if changes:
                summary.table_changes = {key: sum(change.get(key, 0) for change in changes)
                                         for key in dict.fromkeys(k for change in changes for k in change)}
        return sum(commit.rows for commit in commits)

    summary.output_rows = (sent_rows(prepared, input_rows) if data is None
                           else committed(data, summary.delta_version_before))
    summary.dead_letter_rows = committed(dead, summary.dead_letter_version_before)
    error = query.exception()
    if error is not None:
        summary.status = RunStatus.FAILED
        explanation = explain_failure(prepared.spec, error)
        summary.error = explanation or error_message(error)
        summary.retryable = explanation is None and not is_permanent(error)
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
