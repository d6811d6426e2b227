"""A stream made ready to start: its query id pinned, its routed frame built, its tables created."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from sluice.constants import DeltaEngine, SinkMode
from sluice.kinds import sink_table_format
from sluice.lag.observe import text_append_backlog
from sluice.limits import DRIVER_WRITE_MAX_BYTES
from sluice.model.sql import SqlTransform
from sluice.model.stream import StreamSpec, TriggerSpec
from sluice.model.transforms import TRANSFORMS
from sluice.paths import Roots
from sluice.storage.checkpoint import ensure_query_id
from sluice.storage.delta import table_version
from sluice.storage.notified import NotifiedRead, plan_read
from sluice.summary import StreamRunSummary
from sluice_spark import faults, kinds
from sluice_spark.drift.fields import reads_by_header
from sluice_spark.kinds import read_stream
from sluice_spark.runner.tables import (
    create_tables,
    feeds_changes,
    sink_targets,
    tables_to_create,
    with_added_columns,
)
from sluice_spark.session import refuse_script_transforms, stream_engine
from sluice_spark.steps import patterns as steps
from sluice_spark.steps.route import route
from sluice_spark.targets import TableTarget
from sluice_spark.write.batches import sink_and_dead_letter


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
    # What a stream with ``source.notifications`` reads: the notified files, or its landing folder listed.
    notified: NotifiedRead | None = None
    roots: Roots | None = None
    # The delta-rs tables the run created or checked, by path: its commits and its summary bring them up to date
    # rather than load them again (a load costs more as a table's history grows).
    tables: dict[str, Any] = field(default_factory=dict)


def build_routed_frame(spark: SparkSession, stream: StreamSpec, roots: Roots, *, path: str | None = None,
                       trigger: TriggerSpec | None = None,
                       engine: DeltaEngine = DeltaEngine.RS) -> tuple[DataFrame, list[str]]:
    """The stream's source, its lookup tables and its joined source, read and routed (:func:`route`): one frame
    carrying a route column, and the data columns of the stream's table. ``path`` and ``trigger`` override the
    source's (see ``read_stream``); ``engine`` reads lookup tables.
    """
    patterns = stream.patterns
    dimensions = [(spec, steps.read_dimension(spark, spec, roots, engine)) for spec in patterns.lookup]
    joined = None if patterns.join is None else steps.read_joined(spark, stream, patterns.join, roots)
    routed = route(read_stream(spark, stream, roots, path=path, trigger=trigger), stream, dimensions=dimensions,
                   joined=joined)
    if isinstance(stream.transform, SqlTransform) or stream.expectations or patterns.fan_out:
        refuse_script_transforms(routed.frame, stream=stream.name)  # the catalog's SQL is in the plan: nothing ran yet
    return routed.frame, routed.data_columns


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
    resolved = stream_engine(spark, stream, roots, engine)
    notified = (plan_read(stream, roots, after_journal=lambda: faults.reach("notified_journaled"))
                if getattr(stream.source, "notifications", None) is not None else None)
    routed, data_columns = build_routed_frame(spark, stream, roots, engine=resolved,
                                              path=None if notified is None else notified.path)
    targets = sink_targets(stream, roots, data_columns)
    kinds.sink(stream).check(spark, stream)
    tables = create_tables(stream, routed, tables_to_create(targets, resolved, change_feed=feeds_changes(stream)))
    collect = collects_on_driver(stream, roots, resolved, targets)
    sink, dead = sink_and_dead_letter(targets)

    def version(path: str) -> int | None:
        return int(tables[path].version()) if path in tables else table_version(path)

    summary = StreamRunSummary(
        stream=stream.name,
        query_id=query_id,
        run_id=run_id,
        engine=resolved.value,
        delta_version_before=None if sink is None else version(sink.path),
        dead_letter_version_before=version(dead.path),
        snapshot_id_before=sink_snapshot_id(stream, roots),
    )
    summary.write_path = "driver" if collect else None
    summary.notified = None if notified is None else notified.to_dict()
    return PreparedStream(stream, query_id, resolved, routed, targets, checkpoint, summary, data_columns=data_columns,
                          collect=collect, notified=notified, roots=roots, tables=tables)


def sink_snapshot_id(stream: StreamSpec, roots: Roots) -> int | None:
    """An Iceberg sink's current snapshot id, the run summary's; None for a sink whose commits have none (Delta,
    Kafka)."""
    if stream.sink.table is not None:
        return None
    table = sink_table_format(stream, roots)
    return None if table is None else table.snapshot_id()


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
