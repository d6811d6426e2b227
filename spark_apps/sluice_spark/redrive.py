"""Run a redrive (see :mod:`sluice.operations.redrive`): the selected dead letters through the stream's current
definition, then at most one commit per table, each carrying the redrive's Delta transaction.

The selected rows are read at the frozen version of the dead-letter table, parsed from their raw record under the
current schema and drift policy, and routed by the same :func:`sluice_spark.steps.route.route` a run uses (the
quality split, the transform, the rules, the lookups). The routed rows are collected to the driver: a redrive is a
repair of what went wrong, not a bulk load. Then:

1. the stream's table gets the rows that now pass, with their original ``_source_file`` and ingestion time, in one
   append whose commit info names the redrive;
2. the dead-letter table gets one MERGE: a row that landed (or that a ``drop`` rule now drops) is marked with the
   redrive's run id in ``redriven_by``; a row that still fails takes its new reason.

Each commit carries the transaction ``sluice-redrive/<stream>/<run key>`` version 0, and a table that holds it is
skipped: a redrive killed between (or inside) the two commits and run again with its run id finishes, once. The
redrive holds the live stream's lock throughout, as a backfill does.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sluice.catalog import Catalog
from sluice.constants import (
    INGEST_TIME_COLUMN,
    KAFKA_KEY_COLUMN,
    KAFKA_TIMESTAMP_COLUMN,
    REDRIVE_MARKER,
    REDRIVEN_BY_COLUMN,
    SOURCE_FILE_COLUMN,
    CommitInfo,
    DeltaEngine,
    RunStatus,
)
from sluice.errors import SluiceError
from sluice.kinds.credentials import scrub_secrets
from sluice.kinds.kafka import KafkaSource
from sluice.limits import SOURCE_LOG_MAX_BYTES
from sluice.model.stream import StreamSpec
from sluice.operations.redrive import (
    DEAD_LETTER_COLUMNS,
    REDRIVE_ROOT,
    RedriveError,
    RedrivePlan,
    RedriveRequest,
    plan_redrive,
    redrive_folder,
    selection_sql,
)
from sluice.paths import Roots, join
from sluice.storage import runlog
from sluice.storage.delta import holds_batch, open_table, query, table_version
from sluice.storage.object_lock import waiting_lock
from sluice.storage.store import Folder, folder
from sluice.times import iso_utc
from sluice_spark import faults
from sluice_spark.drift.fields import parse_json_text
from sluice_spark.runner import maps_case, with_added_columns, write_run_log
from sluice_spark.session import activate, preload_case_mappings, resolve_engine
from sluice_spark.steps import patterns as steps
from sluice_spark.steps.route import route
from sluice_spark.targets import (
    DEAD_LETTER_ROUTE,
    FAILED_COLUMN,
    GOOD_ROUTE,
    NEW_COLUMNS_COLUMN,
    NEW_FIELDS_COLUMN,
    RAW_COLUMN,
    REASON_COLUMN,
    ROUTE_COLUMN,
    drift_failure,
    expectation_failure,
    failed_in,
    new_fields_in,
)
from sluice_spark.write.tables import _in_schema

log = logging.getLogger(__name__)

# Each selected dead letter's place in the selection, carried through the route to tie an outcome to its row.
ROW_COLUMN = "_sluice_redrive_row"
# The options of a JSON file source that its record parser takes (as sluice_spark.kinds.files reads them).
_JSON_OPTIONS = frozenset({"timestampFormat", "dateFormat", "timeZone"})
_IDENTITY = ("source_file", "raw_record", "reason", "ingested_at")


@dataclass
class RedriveSummary:
    """What one redrive selected and did. Selected = landed + still dead + dropped."""

    stream: str
    run_id: str
    dry_run: bool
    reason: str | None = None
    since: str | None = None
    until: str | None = None
    status: str = RunStatus.PENDING
    dead_letter_version: int | None = None
    selected: int = 0
    landed: int = 0
    still_dead: int = 0
    reasons_changed: int = 0
    dropped: int = 0
    # The reasons the rows that still fail have now, with their rows.
    new_reasons: dict[str, int] = field(default_factory=dict)
    sink_committed: bool = False
    dead_letter_committed: bool = False
    # Commits a previous attempt of this run had made already (a rerun after a crash).
    replayed: list[str] = field(default_factory=list)
    delta_version_before: int | None = None
    delta_version_after: int | None = None
    dead_letter_version_before: int | None = None
    dead_letter_version_after: int | None = None
    duration_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    retryable: bool = True

    @property
    def ok(self) -> bool:
        return self.status == RunStatus.SUCCEEDED

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=str)

    def to_line(self) -> str:
        return REDRIVE_MARKER + self.to_json()


def unfinished_runs(stream: StreamSpec, roots: Roots) -> list[str]:
    """The run keys of the stream's redrives that froze a plan and never finished."""
    root = folder(join(roots.checkpoints, f"{REDRIVE_ROOT}/{stream.name}"))
    return sorted(entry.name for entry in root.entries() if root.child(entry.name).exists("plan.json")
                  and not root.child(entry.name).exists("done.json"))


def _frozen_plan(own: Folder, request: RedriveRequest, stream: StreamSpec, roots: Roots) -> RedrivePlan:
    """The plan of this run id: made on the first attempt, read back on a rerun, so that a rerun selects the same
    rows. A new run is refused while another redrive of the stream is unfinished: both would select its rows."""
    if own.exists("plan.json"):
        plan = RedrivePlan.from_dict(json.loads(own.read_bounded_text("plan.json", SOURCE_LOG_MAX_BYTES)))
        if plan.request != request.to_dict():
            raise RedriveError("run_id", f"redrive run {request.run_id!r} already ran with other params "
                                         f"({plan.request}); start a new run")
        return plan
    others = [key for key in unfinished_runs(stream, roots) if key != request.run_key]
    if others:
        raise RedriveError("run_id", f"redrive {others[0]!r} of stream '{stream.name}' did not finish; run it again "
                                     f"with that run id (--run-id {others[0]}) to finish it before a new redrive")
    plan = plan_redrive(request, stream, roots)
    own.write_bytes("plan.json", json.dumps(plan.to_dict()).encode("utf-8"))  # whole or not at all
    return plan


def run_redrive(spark: SparkSession, catalog: Catalog, request: RedriveRequest, roots: Roots, *,
                engine: DeltaEngine | None = None, lock_wait_seconds: float = 600) -> RedriveSummary:
    """Plan and run one redrive under the live stream's lock; a dry run judges the rows and commits nothing."""
    stream = catalog.get(request.stream)
    activate(spark)
    summary = RedriveSummary(stream=stream.name, run_id=request.run_id, dry_run=request.dry_run,
                             reason=request.reason, since=request.to_dict()["since"],
                             until=request.to_dict()["until"])
    started, started_at = time.monotonic(), time.time()
    own = folder(redrive_folder(stream, roots, request))
    sink_path, dead_path = stream.sink_path(roots), stream.dead_letter_table_path(roots)
    with waiting_lock(stream.checkpoint_path(roots), stream.name, f"redrive/{request.run_id}", lock_wait_seconds):
        plan = plan_redrive(request, stream, roots) if request.dry_run else _frozen_plan(own, request, stream, roots)
        summary.dead_letter_version = plan.dead_letter_version
        summary.delta_version_before = summary.delta_version_after = table_version(sink_path)
        summary.dead_letter_version_before = summary.dead_letter_version_after = table_version(dead_path)
        try:
            selected = _selection(stream, roots, request, plan)
            summary.selected = selected.num_rows
            if selected.num_rows:
                if maps_case(stream):
                    preload_case_mappings(spark)
                good, marks = _judge(spark, stream, roots, selected, request, summary, engine)
                if not request.dry_run:
                    _commit(stream, roots, request, good, marks, summary)
            else:
                summary.notes.append("no dead letter to redrive")
            if not request.dry_run:
                own.write_bytes("done.json", json.dumps({"run_id": request.run_id}).encode("utf-8"))
            summary.status = RunStatus.SUCCEEDED
        except SluiceError as exc:
            summary.status, summary.error = RunStatus.FAILED, scrub_secrets(str(exc))
            summary.retryable = False
        summary.delta_version_after = table_version(sink_path)
        summary.dead_letter_version_after = table_version(dead_path)
        summary.duration_seconds = round(time.monotonic() - started, 3)
        if not request.dry_run:
            row = runlog.run_row(summary, kind="redrive", run_id=f"redrive/{request.run_id}",
                                 input_rows=summary.selected, output_rows=summary.landed,
                                 dead_letter_rows=summary.still_dead, dropped_rows=summary.dropped,
                                 started_at=iso_utc(started_at), ended_at=iso_utc(time.time()),
                                 note=runlog.json_text({"reason": request.reason, "since": summary.since,
                                                        "until": summary.until, "selected": summary.selected,
                                                        "landed": summary.landed, "still_dead": summary.still_dead,
                                                        "dropped": summary.dropped,
                                                        "dead_letter_version": plan.dead_letter_version}))
            write_run_log(roots, [row], [])
    return summary


def _selection(stream: StreamSpec, roots: Roots, request: RedriveRequest, plan: RedrivePlan) -> Any:
    """The selected dead letters, as the dead-letter table held them at the plan's version (an Arrow table)."""
    import pyarrow as pa

    if plan.dead_letter_version is None or plan.rows == 0:
        return pa.table({name: pa.array([], pa.string()) for name in DEAD_LETTER_COLUMNS})
    where = selection_sql(request, marked=plan.marked, ingested_until=plan.ingested_until)
    columns = ", ".join(f'"{name}"' for name in DEAD_LETTER_COLUMNS)
    rows = query(stream.dead_letter_table_path(roots), f"SELECT {columns} FROM t WHERE {where}",
                 version=plan.dead_letter_version)
    return rows


def _judge(spark: SparkSession, stream: StreamSpec, roots: Roots, selected: Any, request: RedriveRequest,
           summary: RedriveSummary, engine: DeltaEngine | None) -> tuple[Any, Any]:
    """Route the selected rows through the stream's current definition, on the driver. Returns the rows to append to
    the stream's table (Arrow, the table's columns) and the dead-letter rows to update (Arrow: the identity of each
    row, whether it is done, and its new reason)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    stream = with_added_columns(stream, roots)
    source = stream.source
    indexed = selected.append_column(ROW_COLUMN, pa.array(range(selected.num_rows), pa.int64()))
    frame = spark.createDataFrame(indexed.select(["raw_record", "source_file", ROW_COLUMN]))
    keep = {SOURCE_FILE_COLUMN: F.col("source_file"), ROW_COLUMN: F.col(ROW_COLUMN)}
    if isinstance(source, KafkaSource):
        # The dead letter keeps the record's topic, partition and offset; its key and timestamp are not kept.
        keep |= {KAFKA_KEY_COLUMN: F.lit(None).cast("string"), KAFKA_TIMESTAMP_COLUMN: F.lit(None).cast("timestamp")}
    options = {key: value for key, value in source.options.items() if key in _JSON_OPTIONS}
    parsed = parse_json_text(frame, F.col("raw_record"), source.read_schema, source.schema_evolution, options, keep)
    resolved = resolve_engine(spark, engine or stream.sink.engine, stream.locations(roots))
    dimensions = [(spec, steps.read_dimension(spark, spec, roots, resolved)) for spec in stream.patterns.lookup]
    routed = route(parsed, stream, dimensions=dimensions)
    rows = routed.frame.toArrow()
    if NEW_FIELDS_COLUMN in rows.column_names:
        fields: dict[str, int] = {}
        origins: dict[str, None] = {}
        new_fields_in(rows, NEW_FIELDS_COLUMN, SOURCE_FILE_COLUMN, fields, origins)
        if fields:
            raise drift_failure(0, fields, list(origins))
    if FAILED_COLUMN in rows.column_names:
        failed: dict[str, int] = {}
        example = failed_in(rows, FAILED_COLUMN, RAW_COLUMN, failed)
        if failed:
            raise expectation_failure(0, failed, example)
    if NEW_COLUMNS_COLUMN in rows.column_names and rows.column(NEW_COLUMNS_COLUMN).null_count < rows.num_rows:
        raise RedriveError("stream", f"stream '{stream.name}': redriven rows bring new fields that add_new_columns "
                                     "would add to the table; a redrive adds no column. Run the stream first, or "
                                     "declare the fields in source.schema")
    route_values = rows.column(ROUTE_COLUMN)
    good = rows.filter(pc.equal(route_values, GOOD_ROUTE))
    dead = rows.filter(pc.equal(route_values, DEAD_LETTER_ROUTE))
    # The original ingestion time: a redriven row is the row the stream would have written then.
    original_time = selected.column("ingested_at")
    good_rows = good.column(ROW_COLUMN)
    data_columns = [name for name in routed.data_columns if name not in (ROW_COLUMN, INGEST_TIME_COLUMN)]
    landed = good.select(data_columns).append_column(
        INGEST_TIME_COLUMN, pc.take(original_time, good_rows).cast(good.schema.field(INGEST_TIME_COLUMN).type))
    new_reason: dict[int, str] = dict(zip(dead.column(ROW_COLUMN).to_pylist(), dead.column(REASON_COLUMN).to_pylist(),
                                          strict=True))
    landed_rows = set(good_rows.to_pylist())
    old = selected.to_pylist()
    marks: dict[tuple[Any, ...], dict[str, Any]] = {}
    for index, row in enumerate(old):
        if index in new_reason:
            summary.still_dead += 1
            summary.new_reasons[new_reason[index]] = summary.new_reasons.get(new_reason[index], 0) + 1
            if new_reason[index] == row["reason"]:
                continue  # nothing changes for it
            summary.reasons_changed += 1
            outcome = {"done": False, "new_reason": new_reason[index]}
        elif index in landed_rows:
            summary.landed += 1
            outcome = {"done": True, "new_reason": None}
        else:  # a drop rule dropped it: done with, as a run would be
            summary.dropped += 1
            outcome = {"done": True, "new_reason": None}
        marks.setdefault(tuple(row[name] for name in _IDENTITY), {**{n: row[n] for n in _IDENTITY}, **outcome})
    schema = pa.schema([selected.schema.field(name) for name in _IDENTITY] + [
        pa.field("done", pa.bool_()), pa.field("new_reason", pa.string()), pa.field(REDRIVEN_BY_COLUMN, pa.string())])
    updates = pa.Table.from_pylist([{**mark, REDRIVEN_BY_COLUMN: request.run_id} for mark in marks.values()],
                                   schema=schema)
    return landed, updates


def _commit(stream: StreamSpec, roots: Roots, request: RedriveRequest, landed: Any, updates: Any,
            summary: RedriveSummary) -> None:
    """The stream's table, then the dead-letter table: one commit each at most, each with the redrive's transaction,
    each skipped when the table holds it already."""
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    metadata: dict[str, Any] = {CommitInfo.STREAM: stream.name, CommitInfo.REDRIVE_RUN: request.run_id}
    sink = open_table(stream.sink_path(roots))
    if holds_batch(sink, request.app_id, 0):
        summary.replayed.append("sink")
    elif landed.num_rows:
        faults.reach("before_commit", 0)
        properties = CommitProperties(custom_metadata={**metadata, CommitInfo.RECORDS: landed.num_rows},
                                      app_transactions=[Transaction(request.app_id, 0)])
        write_deltalake(sink, _in_schema(landed, pa.schema(sink.schema().to_arrow())), mode="append",
                        partition_by=list(sink.metadata().partition_columns) or None, commit_properties=properties)
        summary.sink_committed = True
    faults.reach("between_commits", 0)
    dead = _marked_table(stream.dead_letter_table_path(roots))
    if holds_batch(dead, request.app_id, 0):
        summary.replayed.append("dead_letter")
    elif updates.num_rows:
        properties = CommitProperties(custom_metadata={**metadata, CommitInfo.RECORDS: updates.num_rows},
                                      app_transactions=[Transaction(request.app_id, 0)])
        same = " AND ".join(f'(t."{name}" IS NOT DISTINCT FROM s."{name}")' for name in _IDENTITY)
        (dead.merge(updates, f'{same} AND (t."{REDRIVEN_BY_COLUMN}" IS NULL)', source_alias="s", target_alias="t",
                    commit_properties=properties)
         .when_matched_update({REDRIVEN_BY_COLUMN: f's."{REDRIVEN_BY_COLUMN}"'}, predicate="s.done")
         .when_matched_update({"reason": "s.new_reason"}, predicate="NOT s.done")
         .execute())
        summary.dead_letter_committed = True
    faults.reach("after_commit", 0)


def _marked_table(path: str) -> Any:
    """The dead-letter table, with the ``redriven_by`` column (added, as a nullable string, on the first redrive)."""
    from deltalake import Field
    from deltalake.schema import PrimitiveType

    table = open_table(path)
    if REDRIVEN_BY_COLUMN not in [item.name for item in table.schema().fields]:
        table.alter.add_columns([Field(REDRIVEN_BY_COLUMN, PrimitiveType("string"), nullable=True)])
        table = open_table(path)
    return table
