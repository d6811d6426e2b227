"""Run a backfill: a bounded availableNow query over the planned files, with its own checkpoint.

The query reads exactly the planned files (a Hadoop glob of their paths) through the stream's own source, quality
split and transform, so backfilled rows are the rows the stream would have written. Each micro-batch is
committed in ``foreachBatch``: once per table, with the backfill's query id and batch id as the Delta
transaction, so that a retried backfill (same run id, same frozen plan, same checkpoint) never writes a batch twice.
``replace`` runs as one batch and swaps the range in one commit per table (``replaceWhere``).

The backfill holds the live stream's lock from planning to the last commit: it never writes while the stream
writes, and the stream never writes while it does.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sluice.backfill import BackfillError, BackfillPlan, BackfillRequest, plan_backfill
from sluice.catalog import Catalog, StreamSpec, TriggerSpec
from sluice.checkpoint import ensure_query_id
from sluice.constants import BACKFILL_MARKER, DeltaEngine
from sluice.delta import table_version
from sluice.lock import LockHeld, StreamLock
from sluice.paths import Roots, join, require_local
from sluice.predicates import DATAFUSION, SPARK_SQL, RowFilter, render
from sluice_spark.delta_rs_sink import TableTarget
from sluice_spark.runner import (
    DEAD_LETTER_ROUTE,
    GOOD_ROUTE,
    ROUTE_COLUMN,
    await_query,
    build_routed_frame,
    create_tables,
    error_message,
    sink_targets,
)
from sluice_spark.session import activate, resolve_engine

log = logging.getLogger(__name__)

BACKFILL_ROOT = "_backfill"
_GLOB_SPECIAL = "\\{}[]*?,^"


@dataclass
class BackfillSummary:
    """What one backfill read and wrote. Rows read = rows written + rows outside the range + dead-letter rows."""

    stream: str
    run_id: str
    mode: str
    select_by: str
    start: str
    end: str
    dry_run: bool
    reason: str | None = None
    status: str = "pending"
    files: int = 0
    file_bytes: int = 0
    pending_files: int = 0
    held_files: int = 0
    batches: int = 0
    input_rows: int = 0
    rows_written: int = 0
    rows_outside_range: int = 0
    rows_replaced: int = 0
    dead_letter_rows: int = 0
    dead_letter_rows_replaced: int = 0
    replayed_batches: list[int] = field(default_factory=list)
    delta_version_before: int | None = None
    delta_version_after: int | None = None
    dead_letter_version_before: int | None = None
    dead_letter_version_after: int | None = None
    duration_seconds: float = 0.0
    query_id: str | None = None
    checkpoint: str | None = None
    sample_files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    retryable: bool = True

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=str)

    def to_line(self) -> str:
        return BACKFILL_MARKER + self.to_json()


def backfill_checkpoint(stream: StreamSpec, roots: Roots, request: BackfillRequest) -> str:
    """``<checkpoint root>/_backfill/<stream>/<run id>``: never the live stream's checkpoint."""
    return join(roots.checkpoints, f"{BACKFILL_ROOT}/{stream.name}/{request.run_key}")


def hadoop_glob(paths: list[str]) -> str:
    """One glob that matches exactly ``paths`` (absolute): ``<common folder>/{a,b/c,...}`` with Hadoop's special
    characters escaped. Hadoop expands the braces, slashes included, before it matches. Escaped braces inside the
    alternation are not expanded correctly: the planner refuses such paths first."""
    def escape(path: str) -> str:
        return "".join(f"\\{char}" if char in _GLOB_SPECIAL else char for char in path)

    base = os.path.commonpath([os.path.dirname(path) for path in paths])
    relative = sorted(os.path.relpath(path, base) for path in paths)
    return f"{escape(base).rstrip('/')}/{{{','.join(escape(path) for path in relative)}}}"


@contextmanager
def _stream_lock(checkpoint: str, stream: str, run_id: str, wait_seconds: float) -> Iterator[StreamLock]:
    """The live stream's lock, waiting up to ``wait_seconds`` for a running stream to finish."""
    deadline = time.monotonic() + wait_seconds
    while True:
        lock = StreamLock(checkpoint, stream, run_id)
        try:
            lock.acquire()
        except LockHeld:
            if time.monotonic() >= deadline:
                raise
            time.sleep(min(5.0, max(deadline - time.monotonic(), 0.1)))
            continue
        try:
            yield lock
        finally:
            lock.release()
        return


def _frozen_plan(folder: Path, request: BackfillRequest, stream: StreamSpec, roots: Roots) -> BackfillPlan:
    """The plan of this run id: made and written on the first attempt, read back on a retry, so that a retry
    reads the same files and its batches line up with the ones already committed."""
    path = folder / "plan.json"
    if path.exists():
        plan = BackfillPlan.from_dict(json.loads(path.read_text(encoding="utf-8")))
        if plan.request != request.to_dict():
            raise BackfillError("run_id", f"backfill run {request.run_id!r} already ran with other params "
                                          f"({plan.request}); start a new run")
        return plan
    plan = plan_backfill(request, stream, roots)
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / ".plan.json.tmp"
    temporary.write_text(json.dumps(plan.to_dict()), encoding="utf-8")
    os.replace(temporary, path)
    return plan


def run_backfill(spark: SparkSession, catalog: Catalog, request: BackfillRequest, roots: Roots, *,
                 engine: DeltaEngine | None = None, lock_wait_seconds: float = 600) -> BackfillSummary:
    """Plan and run one backfill under the live stream's lock; a dry run plans and counts, and writes nothing."""
    stream = catalog.get(request.stream)
    activate(spark)
    summary = BackfillSummary(stream=stream.name, run_id=request.run_id, mode=request.mode,
                              select_by=request.select_by, start=request.start.isoformat(),
                              end=request.end.isoformat(), dry_run=request.dry_run, reason=request.reason)
    started = time.monotonic()
    live = require_local(stream.checkpoint_path(roots), what=f"stream '{stream.name}': checkpoint")
    own = Path(require_local(backfill_checkpoint(stream, roots, request), what="backfill checkpoint"))
    with _stream_lock(live, stream.name, f"backfill/{request.run_id}", lock_wait_seconds) as lock:
        plan = plan_backfill(request, stream, roots) if request.dry_run else _frozen_plan(own, request, stream, roots)
        summary.files, summary.file_bytes = len(plan.files), plan.bytes
        summary.pending_files, summary.held_files = plan.pending_files, plan.held_files
        summary.rows_replaced, summary.dead_letter_rows_replaced = (plan.rows_to_replace,
                                                                     plan.dead_letter_rows_to_replace)
        summary.sample_files = [f.path for f in plan.files[:50]]
        summary.notes = list(plan.notes)
        summary.delta_version_before = summary.delta_version_after = table_version(stream.sink_path(roots))
        summary.dead_letter_version_before = table_version(stream.dead_letter_table_path(roots))
        summary.dead_letter_version_after = summary.dead_letter_version_before
        if plan.files:
            _run_query(spark, stream, roots, request, plan, summary, own, lock, engine)
        else:
            summary.status = "succeeded"
            summary.notes.append("no file to read: nothing to do")
    summary.delta_version_after = table_version(stream.sink_path(roots))
    summary.dead_letter_version_after = table_version(stream.dead_letter_table_path(roots))
    summary.duration_seconds = round(time.monotonic() - started, 3)
    return summary


def _run_query(spark: SparkSession, stream: StreamSpec, roots: Roots, request: BackfillRequest, plan: BackfillPlan,
               summary: BackfillSummary, own: Path, lock: StreamLock, engine: DeltaEngine | None) -> None:
    routed, data_columns = build_routed_frame(
        spark, stream, roots, path=hadoop_glob([f.path for f in plan.files]),
        trigger=TriggerSpec(max_files_per_trigger=request.max_files_per_trigger),
    )
    targets = sink_targets(stream, roots, data_columns)
    resolved = resolve_engine(spark, engine or stream.sink.engine)
    if resolved is DeltaEngine.RS and not request.dry_run:
        create_tables(stream, routed, targets)
    column = plan.event_time_column
    in_range = (F.col(column) >= F.lit(request.start)) & (F.col(column) < F.lit(request.end)) if column \
        else F.lit(True)
    if request.dry_run:
        scratch = Path(tempfile.mkdtemp(prefix="sluice-backfill-dry-run-"))
        checkpoint, query_id = str(scratch / "checkpoint"), "dry-run"
    else:
        scratch, checkpoint, query_id = own / "staging", str(own / "stream"), ensure_query_id(own / "stream")
        summary.query_id, summary.checkpoint = query_id, str(own)
    metadata = {"sluice.stream": stream.name, "sluice.backfill.runId": request.run_id,
                "sluice.backfill.queryId": query_id, "sluice.backfill.mode": request.mode,
                "sluice.backfill.range": f"[{request.start.isoformat()}, {request.end.isoformat()})",
                "sluice.backfill.reason": request.reason or ""}
    replaced = {GOOD_ROUTE: plan.sink_filter, DEAD_LETTER_ROUTE: plan.dead_letter_filter}

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        batch = batch.withColumn("_sluice_in_range", in_range)
        batch.persist()
        try:
            counts = {(row[0], bool(row[1])): int(row[2]) for row in
                      batch.groupBy(ROUTE_COLUMN, "_sluice_in_range").count().collect()}
            summary.batches += 1
            summary.input_rows += sum(counts.values())
            summary.rows_written += counts.get((GOOD_ROUTE, True), 0)
            summary.rows_outside_range += counts.get((GOOD_ROUTE, False), 0)
            summary.dead_letter_rows += counts.get((DEAD_LETTER_ROUTE, True), 0) + counts.get(
                (DEAD_LETTER_ROUTE, False), 0)
            if request.dry_run:
                return
            replayed = False
            to_write = {GOOD_ROUTE: counts.get((GOOD_ROUTE, True), 0),
                        DEAD_LETTER_ROUTE: counts.get((DEAD_LETTER_ROUTE, True), 0)
                        + counts.get((DEAD_LETTER_ROUTE, False), 0)}
            for target in targets:
                if not to_write[target.route] and not replaced[target.route]:
                    continue  # an append of nothing: no empty commit
                rows = batch.where(F.col(ROUTE_COLUMN) == target.route)
                if target.route == GOOD_ROUTE:
                    rows = rows.where(F.col("_sluice_in_range"))
                rows = rows.select(*[F.col(source).alias(name) for source, name in target.columns])
                info = {**metadata, "sluice.backfill.batchId": batch_id}
                write = _write_rs if resolved is DeltaEngine.RS else _write_jvm
                replayed |= not write(rows, target, batch_id, query_id, replaced[target.route], info,
                                      scratch / f"{batch_id}-{target.route}")
            if replayed:
                summary.replayed_batches.append(batch_id)
        finally:
            batch.unpersist()

    query = (routed.writeStream.foreachBatch(write_batch).queryName(f"backfill-{stream.name}")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    try:
        await_query(f"backfill-{stream.name}", query, lock)
    finally:
        if query.isActive:
            query.stop()
        if request.dry_run:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            shutil.rmtree(own / "staging", ignore_errors=True)
    error = query.exception()
    if lock.lost:
        summary.status, summary.error = "failed", "lost the stream's lock to another run during the backfill"
    elif error is not None:
        summary.status, summary.error = "failed", error_message(error)
    else:
        summary.status = "succeeded"


def _write_rs(rows: DataFrame, target: TableTarget, batch_id: int, query_id: str, replace: RowFilter | None,
              info: dict[str, Any], staging: Path) -> bool:
    """Stage the rows as Parquet with Spark, then commit them with delta-rs in one transaction: an append, or a
    overwrite of the rows ``replace`` selects. False when the table already holds this batch (a replay)."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    table = DeltaTable(target.path)
    committed = table.transaction_version(query_id)
    if committed is not None and committed >= batch_id:
        return False
    rows.write.mode("overwrite").parquet(str(staging))
    schema = pa.schema(table.schema().to_arrow())
    parts = sorted(str(p) for p in staging.glob("*.parquet"))
    scanner = ds.dataset(parts, format="parquet").scanner() if parts else None

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in scanner.to_batches() if scanner is not None else []:
            yield from pa.Table.from_batches([batch]).select(schema.names).cast(schema).to_batches()

    write_deltalake(
        target.path,
        pa.RecordBatchReader.from_batches(schema, batches()),
        mode="overwrite" if replace else "append",
        predicate=render(replace, DATAFUSION) if replace else None,
        partition_by=list(target.partition_by) or None,
        commit_properties=CommitProperties(custom_metadata=info,
                                           app_transactions=[Transaction(query_id, batch_id)]),
    )
    return True


def _write_jvm(rows: DataFrame, target: TableTarget, batch_id: int, query_id: str, replace: RowFilter | None,
               info: dict[str, Any], staging: Path) -> bool:
    """delta-spark's idempotent write: ``txnAppId``/``txnVersion`` skip a replayed batch, ``replaceWhere`` swaps
    the range in the same commit."""
    writer = (rows.write.format("delta").mode("overwrite" if replace else "append")
              .option("txnAppId", query_id).option("txnVersion", batch_id)
              .option("userMetadata", json.dumps(info)))
    if replace:
        writer = writer.option("replaceWhere", render(replace, SPARK_SQL))
    if target.partition_by:
        writer = writer.partitionBy(*target.partition_by)
    writer.save(target.path)
    return True
