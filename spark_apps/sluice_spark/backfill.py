"""Run a backfill: a bounded availableNow query over the planned files, with its own checkpoint.

The query reads exactly the planned files (a Hadoop glob of their paths) through the stream's own source, quality
split and transform, so backfilled rows are the rows the stream would have written. Each micro-batch is
committed in ``foreachBatch``: once per table, with the backfill's query id and batch id as the Delta
transaction, so that a retried backfill (same run id, same frozen plan, same checkpoint) never writes a batch twice.
``replace`` runs as one batch and swaps the range in one commit per table (``replaceWhere``). A cdc table's changes
are applied by its cdc writer in both modes, never swapped (:mod:`sluice.operations.backfill`).

A Delta source's range is read the same way, through the stream's own source with ``startingVersion`` and
``endingVersion`` set to the planned versions: only ``sluice_delta`` takes an ending version (delta-spark's
streaming source has none), so it reads the range on both engines; a jvm stream still writes through delta-spark.

A Kafka source's range is read through the stream's own source too, assigned the planned partitions from their first
planned offset, with the records outside the planned offsets dropped as they are read (Spark's Kafka source takes
an ending offset in batch queries only): the query reads to each partition's end offset at its start.

The backfill holds the live stream's lock from planning to the last commit: it never writes while the stream
writes, and the stream never writes while it does.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sluice.catalog import Catalog
from sluice.constants import (
    BACKFILL_MARKER,
    CommitInfo,
    DeltaEngine,
    RunStatus,
    SchemaEvolution,
)
from sluice.kinds.credentials import scrub_secrets
from sluice.kinds.iceberg import IcebergSink, IcebergSource
from sluice.limits import SOURCE_LOG_MAX_BYTES
from sluice.model.stream import StreamSpec, TriggerSpec
from sluice.operations.backfill import BackfillError, BackfillPlan, BackfillRequest, plan_backfill
from sluice.paths import Roots, join
from sluice.storage import runlog
from sluice.storage.checkpoint import ensure_query_id
from sluice.storage.clean import BACKFILL_DONE, BACKFILL_ROOT
from sluice.storage.delta import table_version
from sluice.storage.lock import HeldLock
from sluice.storage.object_lock import waiting_lock
from sluice.storage.store import Folder, LocalFolder, folder
from sluice.times import iso_utc
from sluice_spark import faults
from sluice_spark.kinds.iceberg import ensure_iceberg_table
from sluice_spark.rs.iceberg_source import ENDING_SEQUENCE, STARTING_SEQUENCE
from sluice_spark.runner import (
    await_query,
    batch_rows,
    build_routed_frame,
    create_tables,
    error_message,
    feeds_changes,
    is_permanent,
    maps_case,
    sink_targets,
    tables_to_create,
    with_added_columns,
    write_run_log,
)
from sluice_spark.session import activate, preload_case_mappings, require_hadoop_connector, resolve_engine
from sluice_spark.steps.quality import expectation_counts
from sluice_spark.targets import DEAD_LETTER_ROUTE, GOOD_ROUTE, RAW_COLUMN, ROUTE_COLUMN
from sluice_spark.write.batches import BatchRouter

log = logging.getLogger(__name__)

# Whether a good row's event time is in the backfill's range: only those are written.
IN_RANGE_COLUMN = "_sluice_in_range"
_GLOB_SPECIAL = "\\{}[]*?,^"
# The scheme and bucket of an object-store URI (s3a://bucket), which Hadoop's glob takes as they are.
_STORE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/]*")


@dataclass
class BackfillSummary:
    """What one backfill read and wrote. Rows read = rows written + rows outside the range + dead-letter rows."""

    stream: str
    run_id: str
    mode: str
    select_by: str
    start: str | None
    end: str | None
    dry_run: bool
    reason: str | None = None
    status: str = RunStatus.PENDING
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
    # Rows an expectation dropped (read, counted, written nowhere), and the counts per expectation.
    rows_dropped: int = 0
    expectations: list[dict[str, Any]] = field(default_factory=list)
    replayed_batches: list[int] = field(default_factory=list)
    # A Delta source's range: its first and last version, and the files, bytes and records of each.
    versions: dict[str, Any] | None = None
    # A Kafka source's range: the offsets per partition (first, last, selected, read), as planned.
    offsets: dict[str, Any] | None = None
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
        return self.status == RunStatus.SUCCEEDED

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

    store = _STORE.match(paths[0])
    root = store.group(0) if store else ""  # s3a://bucket: a path's folders start after it
    if any(not path.startswith(f"{root}/") for path in paths):
        raise BackfillError("start", f"the planned files lie on more than one store ({paths[0]}, ...)")
    base = os.path.commonpath([os.path.dirname(path[len(root):]) for path in paths])
    relative = sorted(os.path.relpath(path[len(root):], base) for path in paths)
    return f"{escape(root + base).rstrip('/')}/{{{','.join(escape(path) for path in relative)}}}"


def _frozen_plan(own: Folder, request: BackfillRequest, stream: StreamSpec, roots: Roots) -> BackfillPlan:
    """The plan of this run id: made and written on the first attempt, read back on a retry, so that a retry
    reads the same files and its batches line up with the ones already committed."""
    if own.exists("plan.json"):
        # Bounded like a source log, which lists files as the plan does: a FIFO or a giant planted there must not
        # hang or exhaust the driver.
        plan = BackfillPlan.from_dict(json.loads(own.read_bounded_text("plan.json", SOURCE_LOG_MAX_BYTES)))
        if plan.request != request.to_dict():
            raise BackfillError("run_id", f"backfill run {request.run_id!r} already ran with other params "
                                          f"({plan.request}); start a new run")
        return plan
    plan = plan_backfill(request, stream, roots)
    own.write_bytes("plan.json", json.dumps(plan.to_dict()).encode("utf-8"))  # whole or not at all
    return plan


def run_backfill(spark: SparkSession, catalog: Catalog, request: BackfillRequest, roots: Roots, *,
                 engine: DeltaEngine | None = None, lock_wait_seconds: float = 600) -> BackfillSummary:
    """Plan and run one backfill under the live stream's lock; a dry run plans and counts, and writes nothing."""
    stream = catalog.get(request.stream)
    activate(spark)
    summary = BackfillSummary(stream=stream.name, run_id=request.run_id, mode=request.mode,
                              select_by=request.select_by, start=request.start.isoformat() if request.start else None,
                              end=request.end.isoformat() if request.end else None, dry_run=request.dry_run,
                              reason=request.reason)
    started, started_at = time.monotonic(), time.time()
    live, own = stream.checkpoint_path(roots), folder(backfill_checkpoint(stream, roots, request))
    if not request.dry_run:
        require_hadoop_connector(spark, own.uri, f"stream '{stream.name}': backfill checkpoint")
    if stream.source.landing is not None:
        require_hadoop_connector(spark, stream.source_path(roots), f"stream '{stream.name}': landing folder")
    with waiting_lock(live, stream.name, f"backfill/{request.run_id}", lock_wait_seconds) as lock:
        plan = plan_backfill(request, stream, roots) if request.dry_run else _frozen_plan(own, request, stream, roots)
        summary.files, summary.file_bytes = len(plan.files), plan.bytes
        summary.pending_files, summary.held_files = plan.pending_files, plan.held_files
        summary.rows_replaced, summary.dead_letter_rows_replaced = (plan.rows_to_replace,
                                                                     plan.dead_letter_rows_to_replace)
        summary.sample_files = [f.path for f in plan.files[:50]]
        summary.notes = list(plan.notes)
        summary.versions = plan.versions
        summary.offsets = plan.offsets
        summary.delta_version_before = summary.delta_version_after = _sink_version(stream, roots)
        summary.dead_letter_version_before = table_version(stream.dead_letter_table_path(roots))
        summary.dead_letter_version_after = summary.dead_letter_version_before
        batches: list[dict[str, Any]] = []
        if plan.files or plan.versions or (plan.offsets and plan.offsets["read"]):
            if maps_case(stream):
                preload_case_mappings(spark)
            batches = _run_query(spark, stream, roots, request, plan, summary, own, lock, engine)
        else:
            summary.status = RunStatus.SUCCEEDED
            summary.notes.append("no offset to read: nothing to do" if plan.offsets else
                                 "no file to read: nothing to do")
        summary.delta_version_after = _sink_version(stream, roots)
        summary.dead_letter_version_after = table_version(stream.dead_letter_table_path(roots))
        summary.duration_seconds = round(time.monotonic() - started, 3)
        if summary.error:  # it reaches the run log, XCom and the task log
            summary.error = scrub_secrets(summary.error)
        if not request.dry_run:
            run_id = f"backfill/{request.run_id}"
            row = runlog.run_row(summary, kind="backfill", run_id=run_id, output_rows=summary.rows_written,
                                 dropped_rows=summary.rows_dropped, started_at=iso_utc(started_at),
                                 ended_at=iso_utc(time.time()),
                                 note=runlog.json_text({"mode": summary.mode, "select_by": summary.select_by,
                                                        "start": summary.start, "end": summary.end,
                                                        "versions": _version_bounds(plan),
                                                        "offsets": (plan.offsets or {}).get("partitions"),
                                                        "reason": summary.reason, "files": summary.files}))
            write_run_log(roots, [row], [{**batch, "run_id": run_id} for batch in batches])
            if summary.ok:  # its plan no longer holds landing files back from source.clean
                own.write_bytes(BACKFILL_DONE, b"")
    return summary


def _sink_version(stream: StreamSpec, roots: Roots) -> int | None:
    """The sink's Delta version; None for a sink that is no Delta table (an Iceberg table's snapshots are its
    commits)."""
    return None if stream.sink.table is None else table_version(stream.sink_path(roots))


def _range_text(request: BackfillRequest, plan: BackfillPlan) -> str:
    """The range the commits record: the versions or offsets the plan resolved it to."""
    if plan.versions is not None:
        return f"versions [{plan.versions['first']}, {plan.versions['last']}]"
    if plan.offsets is not None:
        return "offsets " + ", ".join(f"{key} [{part['first']}, {part['last']}]"
                                      for key, part in plan.offsets["partitions"].items())
    return request.range_text


def _version_bounds(plan: BackfillPlan) -> list[int] | None:
    return None if plan.versions is None else [plan.versions["first"], plan.versions["last"]]


def _bounded(stream: StreamSpec, plan: BackfillPlan) -> StreamSpec:
    """A Delta source's stream reading exactly the planned versions, an Iceberg source's the planned snapshots, a
    Kafka source's the planned offsets (its own options otherwise)."""
    if plan.offsets is not None:
        return replace(stream, source=replace(stream.source, options=kafka_range_options(
            stream.source.options, plan.offsets["read"], one_batch=plan.sink_filter is not None)))
    if plan.versions is None:
        return stream
    if isinstance(stream.source, IcebergSource):  # the snapshots by sequence number (sluice.operations.iceberg_range)
        options = {**stream.source.options, STARTING_SEQUENCE: str(plan.versions["first"]),
                   ENDING_SEQUENCE: str(plan.versions["last"])}
        return replace(stream, source=replace(stream.source, options=options))
    options = {**stream.source.options, "startingVersion": str(plan.versions["first"]),
               "endingVersion": str(plan.versions["last"])}
    options.pop("startingTimestamp", None)
    return replace(stream, source=replace(stream.source, options=options))


def kafka_range_options(options: Mapping[str, str], read: list[dict[str, Any]], *, one_batch: bool) -> dict[str, str]:
    """A Kafka source's options for a range: the planned partitions assigned, each from its first planned offset,
    and the planned ranges for the reader to keep (:data:`sluice_spark.kinds.kafka.RANGES_OPTION`). ``one_batch``
    (replace) drops the per-trigger limits."""
    from sluice_spark.kinds.kafka import RANGES_OPTION

    dropped = {"subscribe", "subscribePattern", "assign", "startingOffsets", "startingOffsetsByTimestamp"}
    if one_batch:
        dropped |= {"maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"}
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    for part in read:
        topic, partition = part["topic"], int(part["partition"])
        if partition not in assign.setdefault(topic, []):
            assign[topic].append(partition)
        first = starting.setdefault(topic, {}).get(str(partition))
        starting[topic][str(partition)] = int(part["first"]) if first is None else min(first, int(part["first"]))
    return {**{key: value for key, value in options.items() if key not in dropped}, "assign": json.dumps(assign),
            "startingOffsets": json.dumps(starting), RANGES_OPTION: json.dumps(read)}


def _run_query(spark: SparkSession, stream: StreamSpec, roots: Roots, request: BackfillRequest, plan: BackfillPlan,
               summary: BackfillSummary, own: Folder, lock: HeldLock,
               engine: DeltaEngine | None) -> list[dict[str, Any]]:
    """Run the backfill's query; its batches, as the run log keeps them."""
    stream = _bounded(with_added_columns(stream, roots), plan)
    routed, data_columns = build_routed_frame(
        spark, stream, roots, path=hadoop_glob([f.path for f in plan.files]) if plan.files else None,
        trigger=TriggerSpec(max_files_per_trigger=request.max_files_per_trigger),
    )
    targets = sink_targets(stream, roots, data_columns)
    resolved = resolve_engine(spark, engine or stream.sink.engine, stream.locations(roots))
    iceberg = None
    if not request.dry_run:  # as for a run (see sluice_spark.runner.prepare_stream)
        create_tables(stream, routed, tables_to_create(targets, resolved, change_feed=feeds_changes(stream)))
        if isinstance(stream.sink, IcebergSink):
            iceberg = ensure_iceberg_table(stream, roots, routed, data_columns)
    column = plan.event_time_column
    in_range = (F.col(column) >= F.lit(request.start)) & (F.col(column) < F.lit(request.end)) if column \
        else F.lit(True)
    scratch: Path | None
    if request.dry_run:
        scratch = Path(tempfile.mkdtemp(prefix="sluice-backfill-dry-run-"))
        checkpoint, query_id = str(scratch / "checkpoint"), "dry-run"
    else:
        # Executors stage a replaced table's rows beside the checkpoint; on an object store the driver collects
        # them instead, as a run does.
        scratch = own.child("staging").path if isinstance(own, LocalFolder) else None
        checkpoint, query_id = own.child("stream").uri, ensure_query_id(own.child("stream"))
        summary.query_id, summary.checkpoint = query_id, own.uri
    metadata: dict[str, Any] = {CommitInfo.STREAM: stream.name, CommitInfo.BACKFILL_RUN: request.run_id,
                CommitInfo.BACKFILL_QUERY: query_id, CommitInfo.BACKFILL_MODE: request.mode,
                CommitInfo.BACKFILL_RANGE: _range_text(request, plan),
                CommitInfo.BACKFILL_REASON: request.reason or ""}

    iceberg_replayed: list[int] = []

    def count(batch: DataFrame, batch_id: int) -> bool:
        counts = {(row[0], bool(row[1])): int(row[2]) for row in
                  batch.groupBy(ROUTE_COLUMN, IN_RANGE_COLUMN).count().collect()}
        summary.batches += 1
        summary.input_rows += sum(counts.values())
        summary.rows_written += counts.get((GOOD_ROUTE, True), 0)
        summary.rows_outside_range += counts.get((GOOD_ROUTE, False), 0)
        summary.dead_letter_rows += sum(rows for (route, _), rows in counts.items() if route == DEAD_LETTER_ROUTE)
        if iceberg is not None:  # the good rows first, as a run commits them: a replay is skipped by the table
            write_iceberg(batch, batch_id)
        return not request.dry_run

    def write_iceberg(batch: DataFrame, batch_id: int) -> None:
        """An Iceberg sink's rows of the range, collected on the driver (a backfill's replace is one batch): one
        overwrite of the plan's filter under ``replace``, one append otherwise."""
        assert iceberg is not None
        good = batch.where((F.col(ROUTE_COLUMN) == GOOD_ROUTE) & F.col(IN_RANGE_COLUMN)).select(*data_columns)
        rows = good.toArrow()
        properties = {**metadata, CommitInfo.BACKFILL_BATCH: batch_id}
        faults.reach("before_commit", batch_id)
        if plan.sink_filter is not None:
            committed = iceberg.replace_batch(rows, plan.sink_filter, query_id=query_id, batch_id=batch_id,
                                              metadata=properties)
        else:
            committed = iceberg.commit_batch(rows, query_id=query_id, batch_id=batch_id, metadata=properties)
        if not committed:  # a retry's replay of a batch the table took before the crash
            iceberg_replayed.append(batch_id)
        faults.reach("between_commits", batch_id)

    # The good rows outside the range are read and counted, never written; dead letters are kept whatever their time.
    good = [replace(target, flag=IN_RANGE_COLUMN) if target.route == GOOD_ROUTE else target for target in targets]
    router = BatchRouter(good, engine=resolved, route_column=ROUTE_COLUMN, query_id=query_id,
                         commit_info=lambda batch_id, _route: {**metadata, CommitInfo.BACKFILL_BATCH: batch_id},
                         staging=scratch,
                         replace={GOOD_ROUTE: plan.sink_filter, DEAD_LETTER_ROUTE: plan.dead_letter_filter},
                         before=count, example_column=RAW_COLUMN,
                         added={} if stream.source.schema_evolution is SchemaEvolution.ADD_NEW_COLUMNS else None)
    query = (routed.withColumn(IN_RANGE_COLUMN, in_range).writeStream.foreachBatch(router)
             .queryName(f"backfill-{stream.name}").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    try:
        await_query(f"backfill-{stream.name}", query, lock)
    finally:
        if query.isActive:
            query.stop()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    summary.replayed_batches = sorted({*router.replayed, *iceberg_replayed})
    summary.expectations, summary.rows_dropped = expectation_counts(query.recentProgress, stream)
    summary.input_rows += summary.rows_dropped
    error = query.exception()
    if lock.lost:
        summary.status, summary.error = RunStatus.FAILED, "lost the stream's lock to another run during the backfill"
    elif error is not None:
        summary.status, summary.error = RunStatus.FAILED, error_message(error)
        summary.retryable = not is_permanent(error)
    else:
        summary.status = RunStatus.SUCCEEDED
    return batch_rows(stream.name, request.run_id, query)
