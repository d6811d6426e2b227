"""One write path for every micro-batch Sluice commits: the stream runner's, the backfill's and the Kafka sink's.

A routed batch carries a route value per row (good rows, dead letters) and, for fan-out tables, a flag column.
:class:`BatchRouter` is the ``foreachBatch`` function of every query that does not take the rs engine's append-only
data source: it selects each :class:`TableTarget`'s rows and hands them to the engine's idempotent writer
(:mod:`sluice_spark.write.tables`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice.constants import SOURCE_FILE_COLUMN, DeltaEngine
from sluice.model.predicates import RowFilter
from sluice.model.stream import StreamSpec
from sluice.paths import Roots
from sluice.storage.delta import commit_metadata
from sluice_spark import faults
from sluice_spark.drift.added import add_columns, refuse_drift
from sluice_spark.targets import (
    DEAD_LETTER_ROUTE,
    FAILED_COLUMN,
    GOOD_ROUTE,
    NEW_COLUMNS_COLUMN,
    NEW_FIELDS_COLUMN,
    TableTarget,
    drift_failure,
    expectation_failure,
    failed_in,
    new_fields_in,
    tally_failures,
)
from sluice_spark.write.tables import RsTableWriter, table_writer

CommitInfoOf = Callable[[int, int], dict[str, Any]]


@dataclass
class SinkRequest:
    """What a sink kind's writer (:mod:`sluice_spark.kinds`) is given to build a stream query's sink: the routed
    frame, the stream, its Delta tables (:func:`sluice_spark.runner.sink_targets`), the good rows' columns, the
    engine, the pinned query id, the commit info of its run, and where to count what it sends to a sink that has no
    commit log to count from (Kafka)."""

    frame: DataFrame
    stream: StreamSpec
    targets: list[TableTarget]
    data_columns: list[str]
    engine: DeltaEngine
    query_id: str
    commit_info: dict[str, Any]
    sent: dict[int, int] = field(default_factory=dict)
    # A small run (:func:`sluice_spark.runner.collects_on_driver`): its batches are collected to the driver.
    collect: bool = False
    # Where the writer records the columns ``add_new_columns`` added, with their types.
    added_columns: dict[str, str] = field(default_factory=dict)
    # The run's roots: where a sink outside the lake's Delta tables finds its catalog (an Iceberg sink's).
    roots: Roots | None = None
    # The delta-rs tables the run loaded when it created them, by path (:func:`sluice_spark.runner.create_tables`).
    tables: dict[str, Any] = field(default_factory=dict)


def sink_and_dead_letter(targets: Sequence[TableTarget]) -> tuple[TableTarget | None, TableTarget]:
    """The stream's own table (None for a sink that is not a Delta table) and its dead-letter table, among its
    targets."""
    by_role = {(target.route, target.flag is None): target for target in targets}
    return by_role.get((GOOD_ROUTE, True)), by_role[(DEAD_LETTER_ROUTE, True)]


def stream_commit_info(base: Mapping[str, Any], *, stream: str, query_id: str) -> CommitInfoOf:
    """The commit info of a stream's batch (by batch id and route), with the keys that tie it to the stream's query
    (:func:`sluice.storage.delta.commit_metadata`): health, repair and the run summary read them."""
    return lambda batch_id, route: commit_metadata(dict(base), stream=stream, query_id=query_id, batch_id=batch_id,
                                                   route=route)


class BatchStopped(Exception):
    """A batch's Spark job was cancelled because its query is stopping (a warm run whose client went away)."""


# Spark's words when it cancels a stopping query's jobs, and the interruptions it counts as a stop (the end of
# StreamExecution.PROXY_ERROR).
_STOPPED_JOB = re.compile(r"\[SPARK_JOB_CANCELLED\][^\n]*")
_INTERRUPTED = re.compile(r"java\.lang\.InterruptedException|java\.io\.InterruptedIOException|"
                          r"java\.nio\.channels\.ClosedByInterruptException")


@contextlib.contextmanager
def briefly_stopped() -> Iterator[None]:
    """Raise a stopping query's cancelled job as one short line. A foreachBatch error goes back to the JVM as its
    Python traceback, chained Py4J errors and their Java stack traces included (tens of KB), and Spark first matches
    it against a regex that recurses once per character (StreamExecution.PROXY_ERROR, ``(.|\\r\\n|\\r|\\n)*``): the
    stream thread's stack overflows, and the thread dies with a StackOverflowError instead of stopping. One line that
    names Spark's exception, the cancel and the query's run id (its job group) is what Spark's check reads as a stop.
    """
    try:
        yield
    except Exception as exc:
        text = str(exc)
        stopped, interrupted = _STOPPED_JOB.search(text), _INTERRUPTED.search(text)
        if stopped is not None:
            raise BatchStopped(f"org.apache.spark.SparkException: {stopped.group(0)}") from None
        if interrupted is not None and "py4j" in type(exc).__module__:
            raise BatchStopped("py4j.protocol.Py4JJavaError: An error occurred while calling the JVM: "
                               f"{interrupted.group(0)}") from None
        raise


class BatchRouter:
    """The ``foreachBatch`` function that writes each micro-batch into its tables, table by table, once.

    ``before`` sees the persisted batch first (the Kafka sink sends its good rows, the backfill counts); when it
    returns False the batch writes nothing (a dry run). ``replace`` maps a route to the rows its table gives up in
    the same commit. ``commit_info`` gives each commit's metadata by batch id and route (see
    :func:`stream_commit_info`). Batches a table already held are listed in ``replayed``. A batch with rows that
    broke a ``fail`` expectation (:data:`~sluice_spark.targets.FAILED_COLUMN`) raises before anything is written;
    ``example_column`` holds what the error shows of the first such row. With ``collect`` (the rs engine, appends
    only, a small batch), the batch is collected to the driver once and cut into its tables there, each table
    brought up to date from ``tables`` (delta-rs tables the run loaded before, by path) rather than loaded again.
    """

    def __init__(self, targets: Sequence[TableTarget], *, engine: DeltaEngine, route_column: str, query_id: str,
                 commit_info: CommitInfoOf, replace: Mapping[int, RowFilter | None] | None = None,
                 staging: Path | None = None, before: Callable[[DataFrame, int], bool] | None = None,
                 example_column: str | None = None, collect: bool = False,
                 added: dict[str, str] | None = None, tables: Mapping[str, Any] | None = None) -> None:
        self.targets = list(targets)
        self.tables = dict(tables or {})
        self.added = added
        self.collect = collect
        self.example_column = example_column
        self.writer = table_writer(engine)
        self.route_column = route_column
        self.query_id = query_id
        self.commit_info = commit_info
        self.replace = dict(replace or {})
        self.staging = staging
        self.before = before
        self.replayed: list[int] = []

    def rows_of(self, batch: DataFrame, target: TableTarget) -> DataFrame:
        """The rows of a routed batch that go to ``target``, with the table's column names."""
        selected = F.col(self.route_column) == target.route
        if target.flag:
            selected = selected & F.col(target.flag)
        return batch.where(selected).select(*[F.col(source).alias(name) for source, name in target.columns])

    def refuse_failed(self, batch: DataFrame, batch_id: int) -> None:
        """Raise when rows of the batch broke a ``fail`` expectation: it must commit nowhere."""
        failed = batch.where(F.col(FAILED_COLUMN).isNotNull())
        counted = {row[0]: int(row[1]) for row in failed.groupBy(FAILED_COLUMN).count().collect()}
        if counted:
            example = failed.select(self.example_column).first() if self.example_column else None
            raise expectation_failure(batch_id, tally_failures(counted, {}), example[0] if example else None)

    def _sink(self) -> TableTarget:
        """The stream's own table: the one ``add_new_columns`` adds columns to."""
        return next(target for target in self.targets if target.route == GOOD_ROUTE)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        with briefly_stopped():
            self._write(batch, batch_id)

    def _write(self, batch: DataFrame, batch_id: int) -> None:
        if self.collect:
            self._write_collected(batch, batch_id)
            return
        batch.persist()
        try:
            if NEW_FIELDS_COLUMN in batch.columns:
                refuse_drift(batch, batch_id)
            if FAILED_COLUMN in batch.columns:
                self.refuse_failed(batch, batch_id)
            if self.before is not None and not self.before(batch, batch_id):
                return
            added: dict[str, str] = {}
            if self.added is not None and NEW_COLUMNS_COLUMN in batch.columns:
                batch, added = add_columns(batch, batch_id, sink=self._sink(), route_column=self.route_column,
                                            added=self.added)
            replayed = False
            for target in self.targets:
                metadata = self.commit_info(batch_id, target.route)
                staging = self.staging / f"{batch_id}-{target.route}" if self.staging is not None else None
                widened = added if target.route == GOOD_ROUTE else {}  # one table: no fan-out adds columns
                if widened:
                    target = dataclasses.replace(target, columns=(*target.columns, *((n, n) for n in widened)))
                replayed |= not self.writer.write(self.rows_of(batch, target), target, query_id=self.query_id,
                                                  batch_id=batch_id, metadata=metadata,
                                                  replace=self.replace.get(target.route), staging=staging,
                                                  added=widened)
                faults.reach("between_commits", batch_id)
            faults.reach("after_commit", batch_id)
            if self.added is not None:
                self.added.update(added)  # committed with its batch's rows
            if replayed:
                self.replayed.append(batch_id)
        finally:
            batch.unpersist()

    def _write_collected(self, batch: DataFrame, batch_id: int) -> None:
        """A small batch, appended on the rs engine: collected to the driver once as Arrow (one Spark job, no Python
        worker), refused if a row broke a ``fail`` rule, then cut into its tables' rows and appended."""
        assert isinstance(self.writer, RsTableWriter)
        rows = batch.toArrow()
        if NEW_FIELDS_COLUMN in rows.column_names:
            fields: dict[str, int] = {}
            origins: dict[str, None] = {}
            origin = SOURCE_FILE_COLUMN if SOURCE_FILE_COLUMN in rows.column_names else None
            new_fields_in(rows, NEW_FIELDS_COLUMN, origin, fields, origins)
            if fields:
                raise drift_failure(batch_id, fields, list(origins))
        if FAILED_COLUMN in rows.column_names:
            failed: dict[str, int] = {}
            example = failed_in(rows, FAILED_COLUMN, self.example_column, failed)
            if failed:
                raise expectation_failure(batch_id, failed, example)
        faults.reach("before_commit", batch_id)
        replayed = False
        for target in self.targets:
            mask = target.selects(rows.column(self.route_column), rows.column(target.flag) if target.flag else None)
            selected = rows.filter(mask).select([source for source, _ in target.columns])
            replayed |= not self.writer.append_arrow(
                selected.rename_columns(target.table_columns), target, query_id=self.query_id, batch_id=batch_id,
                metadata=self.commit_info(batch_id, target.route), loaded=self.tables.get(target.path))
            faults.reach("between_commits", batch_id)
        faults.reach("after_commit", batch_id)
        if replayed:
            self.replayed.append(batch_id)
