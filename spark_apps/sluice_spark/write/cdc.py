"""A feed of changes applied to a Delta table by key, in sequence order (``sink.mode: cdc``), on both engines.

A change is a row of the batch: an upsert, or a delete when the sink's ``delete_when`` holds for it. Whatever order
the changes arrive in, across and within batches, the table ends as if they had been applied in ``sequence_by``
order (a delete wins a tie with an upsert of the same sequence):

- type 1: the newest row per key. A late, older change changes nothing; a delete removes the row.
- type 2: every version of a key, valid from ``__start_at`` to ``__end_at`` (NULL: current). A change is placed in
  history where its sequence puts it; a change to a column outside ``track_history_columns`` updates its version in
  place. The versions of the keys a batch touches are rebuilt from their history, the tombstones and the batch,
  and merged by (keys, ``__start_at``).

A delete must be remembered, or an older upsert arriving after it brings the key back. The remembered deletes are a
Delta table of their own, ``_sluice_tombstones`` inside the table's folder (Delta readers and VACUUM leave a folder
whose name starts with ``_`` alone): keys, sequence, and when Sluice recorded it; a tombstone older than the sink's
``delete_retention`` is dropped. Both tables take the batch's transaction id (query id, batch id), the table first,
so a replayed batch commits to neither, and a batch killed between the two commits completes the second on replay.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from sluice.constants import (
    CDC_END_COLUMN,
    CDC_START_COLUMN,
    CDC_TOMBSTONES,
    DEBEZIUM_OP_COLUMN,
    CommitInfo,
    DeltaEngine,
)
from sluice.model.predicates import DATAFUSION
from sluice.model.sinks import CdcSpec
from sluice.model.types import quote
from sluice.storage.delta import ensure_table, holds_batch, open_table, table_version
from sluice_spark import faults
from sluice_spark.targets import TableTarget
from sluice_spark.write.columns import in_schema, orderable

log = logging.getLogger(__name__)

TOMBSTONES = CDC_TOMBSTONES
DELETE_COLUMN = "_sluice_delete"
_TOMB_SEQUENCE = "_sluice_sequence"
_TOMB_AT = "_sluice_deleted_at"
_ACTION = "_sluice_action"
_ORIGIN = "_sluice_origin"
_ROW_SEQUENCE = "_sluice_row_sequence"
# The most touched keys a type 2 batch on rs names in the filter of its read of the table (a longer IN list costs
# DataFusion more to plan than the whole table costs to read).
_KEY_FILTER_MAX = 10_000


def tombstones_path(path: str) -> str:
    return f"{path.rstrip('/')}/{TOMBSTONES}"


@dataclass(frozen=True)
class CdcResult:
    """What a batch did to the table (None where the engine does not say)."""

    inserted: int | None = None
    updated: int | None = None
    deleted: int | None = None
    versions_closed: int | None = None


def flagged(rows: DataFrame, target: TableTarget) -> DataFrame:
    """The batch's changes, each marked as a delete or not, without the columns the table does not take."""
    cdc = target.cdc or CdcSpec()
    if DEBEZIUM_OP_COLUMN in rows.columns:  # a truncate let through (envelope_truncate: ignore) changes no row
        rows = rows.where(F.col(DEBEZIUM_OP_COLUMN).isNull() | (F.col(DEBEZIUM_OP_COLUMN) != "t"))
    is_delete = F.coalesce(F.expr(cdc.delete_when), F.lit(False)) if cdc.delete_when else F.lit(False)
    kept = [name for name in rows.columns if name not in cdc.except_columns]
    return rows.select(*[F.col(quote(name)) for name in kept], is_delete.alias(DELETE_COLUMN))


def _ranked(rows: DataFrame, partition: Sequence[str], sequence_by: str) -> DataFrame:
    """One change per ``partition``: the highest sequence; at a tie a delete, then the highest other columns (so
    that a replay picks the same one)."""
    others = [F.col(quote(field.name)).desc_nulls_last() for field in rows.schema.fields
              if field.name not in (*partition, sequence_by, DELETE_COLUMN) and orderable(field.dataType)]
    order = Window.partitionBy(*[F.col(quote(k)) for k in partition]).orderBy(
        F.col(quote(sequence_by)).desc_nulls_last(), F.col(DELETE_COLUMN).desc(), *others)
    return rows.withColumn("_sluice_rank", F.row_number().over(order)).where("_sluice_rank = 1").drop("_sluice_rank")


def _read_delta(spark: Any, path: str, engine: DeltaEngine, where: str | None = None) -> DataFrame:
    """A Delta table as a DataFrame: delta-spark's reader on jvm; on rs, the rows delta-rs reads (tombstones and the
    touched keys' versions are small), only those ``where`` (DataFusion SQL) holds for when given."""
    if engine is DeltaEngine.JVM:
        return spark.read.format("delta").load(path)
    from sluice.storage.delta import query, read_table

    table = read_table(path) if where is None else query(path, f"SELECT * FROM t WHERE {where}")
    return spark.createDataFrame(table) if table.num_rows else spark.createDataFrame([], _spark_schema(spark, path))


def key_filter(touched: Sequence[Sequence[Any]], keys: Sequence[str], types: Sequence[Any]) -> str | None:
    """A DataFusion filter that keeps the rows of the touched keys and skips files whose statistics (or partition
    values) hold none of them: each key column IN the values it takes among the touched keys. A superset when there
    are several key columns (the left semi join after it is exact). None, to read the whole table, when a key
    column is not an integer or a string, or the values are too many for one statement."""
    from pyspark.sql.types import IntegralType, StringType

    if not touched or len(touched) > _KEY_FILTER_MAX:
        return None
    parts = []
    for index, (name, data_type) in enumerate(zip(keys, types, strict=True)):
        values = sorted({row[index] for row in touched if row[index] is not None})
        if isinstance(data_type, IntegralType):
            literals = [str(int(value)) for value in values]
        elif isinstance(data_type, StringType):
            literals = [DATAFUSION.string(str(value)) for value in values]
        else:
            return None
        parts.append(f"{DATAFUSION.identifier(name)} IN ({', '.join(literals)})" if literals else "FALSE")
    return " AND ".join(parts)


def _spark_schema(spark: Any, path: str) -> Any:
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(pa.schema(open_table(path).schema().to_arrow()))


def _ensure_tombstones(path: str, rows: DataFrame, target: TableTarget) -> None:
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(rows.select(*[quote(k) for k in target.keys],
                                        F.col(quote(target.sequence_by or "")).alias(_TOMB_SEQUENCE)).schema,
                            timezone="UTC")
    ensure_table(path, pa.schema([*arrow, pa.field(_TOMB_AT, pa.timestamp("us", tz="UTC"))]), (),
                 name=f"{path.rstrip('/').rsplit('/', 2)[-2]}_tombstones")


def _tombstones(rows: DataFrame, target: TableTarget) -> DataFrame | None:
    """The remembered deletes (keys, sequence) of the keys in ``rows``; None when nothing was ever deleted. The
    tombstone table is Sluice's own and small: delta-rs reads and writes it on both engines."""
    path = tombstones_path(target.path)
    _ensure_tombstones(path, rows, target)
    if table_version(path) == 0:  # created, never written
        return None
    stones = _read_delta(rows.sparkSession, path, DeltaEngine.RS).drop(_TOMB_AT)
    return stones.join(rows.select(*[quote(k) for k in target.keys]).distinct(), list(target.keys), "left_semi")


class CdcApplier:
    """Applies one batch of changes to one table with one engine (see the module's docstring)."""

    def __init__(self, engine: DeltaEngine) -> None:
        self.engine = engine

    def write(self, rows: DataFrame, target: TableTarget, *, query_id: str, batch_id: int,
              metadata: dict[str, Any]) -> CdcResult | None:
        """Apply the batch; None when both tables already hold it (a replay)."""
        seq = target.sequence_by
        assert seq is not None and target.keys, "a cdc target has keys and a sequence"
        cdc = target.cdc or CdcSpec()
        held_table = holds_batch(open_table(target.path), query_id, batch_id)
        changes = flagged(rows, target)
        if cdc.scd_type == 1:
            changes = _ranked(changes, target.keys, seq)
        else:
            changes = _ranked(changes, (*target.keys, seq), seq)
        changes = changes.persist()  # read twice (the table's merge, the tombstones'), computed once
        try:
            return self._apply(rows, changes, target, query_id=query_id, batch_id=batch_id, metadata=metadata,
                               held_table=held_table)
        finally:
            changes.unpersist()

    def _apply(self, rows: DataFrame, changes: DataFrame, target: TableTarget, *, query_id: str, batch_id: int,
               metadata: dict[str, Any], held_table: bool) -> CdcResult | None:
        cdc = target.cdc or CdcSpec()
        stones_path = tombstones_path(target.path)
        offered = rows.count()
        result = None
        if not held_table:
            faults.reach("before_commit", batch_id)
            meta = {**metadata, CommitInfo.RECORDS: offered}
            if cdc.scd_type == 1:
                result = self._type1(changes, target, query_id, batch_id, meta)
            else:
                result = self._type2(changes, target, query_id, batch_id, meta)
        else:
            log.warning("Batch %s of %s is already in %s; skipping its replay", batch_id, query_id, target.path)
        faults.reach("between_commits", batch_id)
        self._remember(changes, target, stones_path, query_id, batch_id, metadata)
        return result if not held_table else None

    # -- type 1 ----------------------------------------------------------------------------------------------------

    def _type1(self, changes: DataFrame, target: TableTarget, query_id: str, batch_id: int,
               metadata: dict[str, Any]) -> CdcResult:
        seq = target.sequence_by or ""
        stones = _tombstones(changes, target)
        live = changes
        if stones is not None:  # a change no newer than the key's remembered delete was overtaken by it
            latest = stones.groupBy(*[quote(k) for k in target.keys]).agg(F.max(_TOMB_SEQUENCE).alias("_stone"))
            live = (changes.join(F.broadcast(latest), list(target.keys), "left")
                    .where(F.col("_stone").isNull() | (F.col(quote(seq)) > F.col("_stone"))).drop("_stone"))
        columns = [name for name in changes.columns if name != DELETE_COLUMN]
        on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in target.keys)
        newer = f"s.{quote(seq)} >= t.{quote(seq)}"
        values = {quote(name): f"s.{quote(name)}" for name in columns}
        deleted, kept = f"s.{DELETE_COLUMN} AND {newer}", f"NOT s.{DELETE_COLUMN} AND {newer}"
        if self.engine is DeltaEngine.JVM:
            metrics = _jvm_merge(live, target.path, on, query_id, batch_id, metadata, lambda merge: (
                merge.whenMatchedDelete(condition=deleted).whenMatchedUpdate(condition=kept, set=values)
                .whenNotMatchedInsert(condition=f"NOT s.{DELETE_COLUMN}", values=values)))
        else:
            metrics = _rs_merge(live, target.path, on, query_id, batch_id, metadata, lambda merge: (
                merge.when_matched_delete(predicate=deleted).when_matched_update(values, predicate=kept)
                .when_not_matched_insert(values, predicate=f"NOT s.{DELETE_COLUMN}")))
        return CdcResult(metrics.get("inserted"), metrics.get("updated"), metrics.get("deleted"))

    # -- type 2 ----------------------------------------------------------------------------------------------------

    def _type2(self, changes: DataFrame, target: TableTarget, query_id: str, batch_id: int,
               metadata: dict[str, Any]) -> CdcResult:
        keys, seq = list(target.keys), target.sequence_by or ""
        spark = changes.sparkSession
        columns = [name for name in changes.columns if name != DELETE_COLUMN]
        touched = changes.select(*[quote(k) for k in keys]).distinct()
        where = None
        if self.engine is DeltaEngine.RS:  # delta-rs reads on the driver: only the files that may hold those keys
            where = key_filter(touched.limit(_KEY_FILTER_MAX + 1).collect(), keys,
                               [touched.schema[k].dataType for k in keys])
        table = _read_delta(spark, target.path, self.engine, where)
        old = table.join(touched, keys, "left_semi").localCheckpoint()
        # The history as changes: each version an upsert at its start; a version that ends where no other starts
        # was ended by a delete; the tombstones are the other deletes.
        starts = old.select(*[quote(k) for k in keys], F.col(CDC_START_COLUMN).alias("_next"))
        ended = (old.where(F.col(CDC_END_COLUMN).isNotNull())
                 .join(starts, [*[old[quote(k)] == starts[quote(k)] for k in keys],
                                old[CDC_END_COLUMN] == starts["_next"]], "left_anti")
                 .select(*[quote(k) for k in keys], F.col(CDC_END_COLUMN).alias(_TOMB_SEQUENCE)))
        remembered = _tombstones(changes, target)
        stones = ended if remembered is None else remembered.unionByName(ended)
        typed = {field.name: field.dataType for field in changes.schema.fields}
        as_deletes = stones.select(*[F.col(quote(name)) if name in keys
                                     else (F.col(_TOMB_SEQUENCE).cast(typed[name]) if name == seq
                                           else F.lit(None).cast(typed[name])).alias(name) for name in columns],
                                   F.lit(True).alias(DELETE_COLUMN), F.lit(1).alias(_ORIGIN))
        # A version's own sequence is its last change's (an in-place update's), kept beside its start's.
        versions = old.select(*[F.col(quote(name)) for name in columns if name != seq],
                              F.col(CDC_START_COLUMN).cast(typed[seq]).alias(seq),
                              F.lit(False).alias(DELETE_COLUMN), F.lit(1).alias(_ORIGIN),
                              F.col(quote(seq)).alias(_ROW_SEQUENCE))
        as_deletes = as_deletes.withColumn(_ROW_SEQUENCE, F.col(quote(seq)))
        events = (changes.withColumn(_ORIGIN, F.lit(0)).withColumn(_ROW_SEQUENCE, F.col(quote(seq)))
                  .unionByName(versions).unionByName(as_deletes))
        # One change per key and sequence: a delete, then the newest (a version updated in place after its start
        # holds a later change than its opening one, which a backfill may apply again), then the batch's change (a
        # new version of a start replaces it).
        order = Window.partitionBy(*[quote(k) for k in keys], quote(seq)).orderBy(
            F.col(DELETE_COLUMN).desc(), F.col(_ROW_SEQUENCE).desc_nulls_last(), F.col(_ORIGIN))
        events = events.withColumn("_r", F.row_number().over(order)).where("_r = 1").drop("_r", _ORIGIN)
        rebuilt = _versions(events, keys, seq, _tracked(target, columns)).localCheckpoint()
        closed = (rebuilt.where(F.col(CDC_END_COLUMN).isNotNull()).alias("n")
                  .join(old.alias("o"), [*[F.col(f"n.{quote(k)}") == F.col(f"o.{quote(k)}") for k in keys],
                                         F.col(f"n.{CDC_START_COLUMN}") == F.col(f"o.{CDC_START_COLUMN}")], "left")
                  .where(F.col(f"o.{CDC_END_COLUMN}").isNull()).count())
        gone = old.join(rebuilt.select(*[quote(k) for k in keys], CDC_START_COLUMN), [*keys, CDC_START_COLUMN],
                        "left_anti")
        source = (rebuilt.withColumn(_ACTION, F.lit("u"))
                  .unionByName(gone.select(*rebuilt.columns).withColumn(_ACTION, F.lit("d"))))
        on = " AND ".join([*(f"t.{quote(k)} = s.{quote(k)}" for k in keys),
                           f"t.{CDC_START_COLUMN} = s.{CDC_START_COLUMN}"])
        values = {quote(name): f"s.{quote(name)}" for name in rebuilt.columns}
        metadata = {**metadata, CommitInfo.VERSIONS_CLOSED: closed}
        if self.engine is DeltaEngine.JVM:
            metrics = _jvm_merge(source, target.path, on, query_id, batch_id, metadata, lambda merge: (
                merge.whenMatchedDelete(condition=f"s.{_ACTION} = 'd'")
                .whenMatchedUpdate(condition=f"s.{_ACTION} = 'u'", set=values)
                .whenNotMatchedInsert(condition=f"s.{_ACTION} = 'u'", values=values)))
        else:
            metrics = _rs_merge(source, target.path, on, query_id, batch_id, metadata, lambda merge: (
                merge.when_matched_delete(predicate=f"s.{_ACTION} = 'd'")
                .when_matched_update(values, predicate=f"s.{_ACTION} = 'u'")
                .when_not_matched_insert(values, predicate=f"s.{_ACTION} = 'u'")))
        return CdcResult(metrics.get("inserted"), metrics.get("updated"), metrics.get("deleted"), closed)

    # -- the tombstones ----------------------------------------------------------------------------------------------

    def _remember(self, changes: DataFrame, target: TableTarget, path: str, query_id: str, batch_id: int,
                  metadata: dict[str, Any]) -> None:
        """Record the batch's deletes, and forget the ones past the retention, in the batch's commit (once)."""
        _ensure_tombstones(path, changes, target)
        if holds_batch(open_table(path), query_id, batch_id):
            return
        deletes = changes.where(F.col(DELETE_COLUMN)).select(
            *[quote(k) for k in target.keys], F.col(quote(target.sequence_by or "")).alias(_TOMB_SEQUENCE),
            F.current_timestamp().alias(_TOMB_AT)).toArrow()
        if deletes.num_rows == 0:
            return
        cdc = target.cdc or CdcSpec()
        horizon = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(time.time() - cdc.delete_retention_seconds))
        on = " AND ".join([*(f"t.{quote(k)} = s.{quote(k)}" for k in target.keys),
                           f"t.{_TOMB_SEQUENCE} = s.{_TOMB_SEQUENCE}"])
        expired = f"t.{_TOMB_AT} < TIMESTAMP '{horizon}'"
        _rs_merge(deletes, path, on, query_id, batch_id, {**metadata, CommitInfo.RECORDS: 0}, lambda merge: (
            merge.when_not_matched_insert_all().when_not_matched_by_source_delete(predicate=expired)))


def _tracked(target: TableTarget, columns: list[str]) -> list[str]:
    """The columns whose change opens a new version: the named ones, or every column but keys and sequence."""
    cdc = target.cdc or CdcSpec()
    if cdc.track_history_columns:
        return list(cdc.track_history_columns)
    return [name for name in columns if name not in (*target.keys, target.sequence_by)]


def _versions(events: DataFrame, keys: list[str], seq: str, tracked: list[str]) -> DataFrame:
    """The versions of each key from its changes (one per sequence), walked in sequence order: an upsert opens a
    version when nothing is open or a tracked column differs (else it updates the open one); a delete closes it."""
    by_key = Window.partitionBy(*[quote(k) for k in keys]).orderBy(quote(seq))
    tracked_now = F.struct(*[F.col(quote(name)) for name in tracked]) if tracked else F.lit(0)
    deleted = F.col(DELETE_COLUMN)
    previous_deleted = F.lag(deleted).over(by_key)
    previous_tracked = F.lag(tracked_now).over(by_key)
    opens = ~deleted & (previous_deleted.isNull() | previous_deleted | ~tracked_now.eqNullSafe(previous_tracked))
    walked = events.withColumn("_opens", opens)
    walked = walked.withColumn("_version", F.sum(F.col("_opens").cast("int")).over(
        by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
    boundary = F.when(F.col("_opens") | deleted, F.col(quote(seq)))
    walked = walked.withColumn("_end", F.min(boundary).over(by_key.rowsBetween(1, Window.unboundedFollowing)))
    spans = walked.where("_opens").select(*[quote(k) for k in keys], "_version",
                                         F.col(quote(seq)).alias(CDC_START_COLUMN), F.col("_end").alias(CDC_END_COLUMN))
    last = Window.partitionBy(*[quote(k) for k in keys], "_version").orderBy(F.col(_ROW_SEQUENCE).desc())
    rows = (walked.where(~deleted & (F.col("_version") > 0))
            .withColumn("_r", F.row_number().over(last)).where("_r = 1")
            .withColumn(seq, F.col(_ROW_SEQUENCE)))
    data = [name for name in events.columns if name not in (DELETE_COLUMN, _ROW_SEQUENCE)]
    return rows.join(spans, [*keys, "_version"]).select(*[quote(name) for name in data], CDC_START_COLUMN,
                                                       CDC_END_COLUMN)


def _merge_metrics(raw: dict[str, Any]) -> dict[str, int]:
    names = {"inserted": ("numTargetRowsInserted", "num_target_rows_inserted"),
             "updated": ("numTargetRowsUpdated", "num_target_rows_updated"),
             "deleted": ("numTargetRowsDeleted", "num_target_rows_deleted")}
    return {what: int(raw[key]) for what, options in names.items() for key in options if key in raw}


def _jvm_merge(source: DataFrame, path: str, on: str, query_id: str, batch_id: int, metadata: dict[str, Any],
               clauses: Any) -> dict[str, int]:
    """A delta-spark MERGE under the batch's transaction id (delta-spark skips a replay), and its metrics (read with
    delta-rs from the commit the MERGE made, under the stream's lock the table's latest: delta-spark's
    ``history(1)`` would start a Spark job over the log for the same JSON)."""
    from delta.tables import DeltaTable

    spark = source.sparkSession
    settings = {"spark.databricks.delta.write.txnAppId": query_id,
                "spark.databricks.delta.write.txnVersion": str(batch_id),
                "spark.databricks.delta.commitInfo.userMetadata": json.dumps(metadata)}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        table = DeltaTable.forPath(spark, path)
        clauses(table.alias("t").merge(source.alias("s"), on)).execute()
        [entry] = open_table(path).history(1)
        return _merge_metrics(dict(entry.get("operationMetrics") or {}))
    finally:
        for key in settings:
            spark.conf.unset(key)


def _rs_merge(source: DataFrame | Any, path: str, on: str, query_id: str, batch_id: int, metadata: dict[str, Any],
              clauses: Any) -> dict[str, int]:
    """A delta-rs merge of the source's rows (collected as Arrow, in the table's types) under the batch's
    transaction id, and its metrics."""
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, Transaction

    table = DeltaTable(path)
    data = source if isinstance(source, pa.Table) else source.toArrow()
    schema = pa.schema(table.schema().to_arrow())
    extra = [data.schema.field(name) for name in data.column_names if name not in schema.names]
    data = in_schema(data, pa.schema([*schema, *extra]))
    properties = CommitProperties(custom_metadata=metadata, app_transactions=[Transaction(query_id, batch_id)])
    merger = table.merge(data, on, source_alias="s", target_alias="t", commit_properties=properties)
    return _merge_metrics(clauses(merger).execute())


_APPLIERS = {DeltaEngine.RS: CdcApplier(DeltaEngine.RS), DeltaEngine.JVM: CdcApplier(DeltaEngine.JVM)}


def cdc_applier(engine: DeltaEngine) -> CdcApplier:
    return _APPLIERS[engine]
