"""The idempotent Delta table writers, one per engine: each writes a batch's rows into one table, once.

The writers know append, merge (upsert by keys, newest ``sequence_by`` wins), complete (rewrite) and replace (swap
the rows a :class:`~sluice.model.predicates.RowFilter` selects). Each commit carries the batch's transaction identifier
(app id = query id, version = batch id), so a replayed batch is skipped table by table:

- ``jvm``: delta-spark with ``txnAppId``/``txnVersion`` on writes and the same two SQL settings around a MERGE
  (delta-spark's documented idempotent writes); delta-spark itself skips a replay.
- ``rs``: delta-rs with ``app_transactions``, after :func:`sluice.storage.delta.holds_batch`, the one place that decides
  whether a table already holds a batch.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from sluice.constants import ADDED_COLUMN_KEY, CommitInfo, DeltaEngine, SinkMode
from sluice.model.predicates import DATAFUSION, SPARK_SQL, RowFilter, render
from sluice.model.types import quote
from sluice.storage.delta import commit_hooks, holds_batch
from sluice.storage.tableformat import DeltaTableFormat
from sluice_spark import faults
from sluice_spark.targets import TableTarget
from sluice_spark.write.columns import in_schema as _in_schema
from sluice_spark.write.columns import orderable as _orderable

log = logging.getLogger(__name__)


class DeltaTableWriter(ABC):
    """Writes one batch's rows into one table, once."""

    engine: DeltaEngine

    @abstractmethod
    def write(self, rows: DataFrame, target: TableTarget, *, query_id: str, batch_id: int, metadata: dict[str, Any],
              replace: RowFilter | None = None, staging: Path | None = None,
              added: Mapping[str, str] | None = None) -> bool:
        """Commit ``rows`` to ``target`` as its mode says, or as a replace of the rows ``replace`` selects. False when
        the table already holds this batch (a replay). ``staging``, when given, is a folder on storage the executors
        share, where appended rows are staged as Parquet instead of crossing to the driver. ``added`` are columns of
        ``rows`` (name: Spark SQL type) that the table gains in the same commit, marked as added by this batch
        (:data:`~sluice.constants.ADDED_COLUMN_KEY`)."""


def latest_per_key(rows: DataFrame, keys: Sequence[str], sequence_by: str | None) -> DataFrame:
    """One row per key: the one with the highest ``sequence_by``. A MERGE fails when two source rows match one
    target row, and a batch may carry several versions of a key. Versions with the same sequence are told apart by
    their other columns, so that a replay picks the same one; across batches, the later batch wins a tie."""
    if sequence_by is None:
        return rows  # an aggregate's update output has one row per key already
    others = [F.col(f"`{field.name}`").desc_nulls_last() for field in rows.schema.fields
              if field.name not in (*keys, sequence_by) and _orderable(field.dataType)]
    order = Window.partitionBy(*keys).orderBy(F.col(sequence_by).desc_nulls_last(), *others)
    return rows.withColumn("_sluice_rank", F.row_number().over(order)).where("_sluice_rank = 1").drop("_sluice_rank")


def _merge_condition(keys: Sequence[str], equal_null_safe: str) -> str:
    """Keys match when equal or both NULL (an aggregate's group may be NULL)."""
    # A declared name may hold a backtick (`a``b`): quoted, it stays a name and cannot end the condition's.
    return " AND ".join(f"(t.{quote(key)} {equal_null_safe} s.{quote(key)})" for key in keys)


def _newer(sequence_by: str | None) -> str | None:
    """A matched row is replaced only by a newer or equal version: a late, older version changes nothing."""
    if sequence_by is None:
        return None
    column = quote(sequence_by)
    return f"s.{column} >= t.{column} OR t.{column} IS NULL"


class RsTableWriter(DeltaTableWriter):
    """delta-rs on the driver: appends, rewrites and replaces with ``write_deltalake``, upserts with ``merge``."""

    engine = DeltaEngine.RS

    def write(self, rows: DataFrame, target: TableTarget, *, query_id: str, batch_id: int, metadata: dict[str, Any],
              replace: RowFilter | None = None, staging: Path | None = None,
              added: Mapping[str, str] | None = None) -> bool:
        import pyarrow as pa
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        if target.mode is SinkMode.CDC and replace is None:
            return _apply_changes(self.engine, rows, target, query_id=query_id, batch_id=batch_id, metadata=metadata)
        table = DeltaTable(target.path)
        if holds_batch(table, query_id, batch_id):
            log.warning("Batch %s of %s is already in %s; skipping its replay", batch_id, query_id, target.path)
            return False
        offered = rows.count()  # a merge's superseded versions count as processed, for the row reconciliation
        if offered == 0 and target.mode is SinkMode.APPEND and replace is None:
            return True  # nothing to append: no empty commit
        schema = pa.schema(table.schema().to_arrow())
        if added:
            schema = _with_added(schema, added, f"{query_id}:{batch_id}", rows)
        properties = CommitProperties(custom_metadata={**metadata, CommitInfo.RECORDS: offered},
                                      app_transactions=[Transaction(query_id, batch_id)])
        if target.mode is SinkMode.MERGE:
            # Spark's Arrow types as the table has them.
            data = _in_schema(latest_per_key(rows, target.keys, target.sequence_by).toArrow(), schema)
            merger = table.merge(data, _merge_condition(target.keys, "IS NOT DISTINCT FROM"), source_alias="s",
                                 target_alias="t", commit_properties=properties,
                                 post_commithook_properties=commit_hooks(table))
            merger.when_matched_update_all(predicate=_newer(target.sequence_by)).when_not_matched_insert_all().execute()
            return True
        data = _staged(rows, schema, staging) if staging is not None else _in_schema(rows.toArrow(), schema)
        partition_by = list(target.partition_by) or None
        if replace is not None or target.mode is SinkMode.COMPLETE:
            write_deltalake(table, data, mode="overwrite", partition_by=partition_by, commit_properties=properties,
                            predicate=render(replace, DATAFUSION) if replace is not None else None,
                            schema_mode="merge" if added else None, post_commithook_properties=commit_hooks(table))
        else:
            write_deltalake(table, data, mode="append", partition_by=partition_by, commit_properties=properties,
                            schema_mode="merge" if added else None, post_commithook_properties=commit_hooks(table))
        return True

    @staticmethod
    def append_arrow(rows: Any, target: TableTarget, *, query_id: str, batch_id: int,
                     metadata: dict[str, Any], loaded: Any = None) -> bool:
        """Append an Arrow table already on the driver (a small batch collected once, see :class:`BatchRouter`),
        through the table-format seam, with the same once-only transaction as :meth:`write`. False when the table
        already held the batch. ``loaded``: the table as the run loaded it before, brought up to date for the
        check instead of loaded again."""
        return DeltaTableFormat(target.path, partition_by=target.partition_by, loaded=loaded).commit_batch(
            rows, query_id=query_id, batch_id=batch_id, metadata=metadata)


def _with_added(schema: Any, added: Mapping[str, str], marker: str, rows: DataFrame) -> Any:
    """The table's Arrow schema and the ``added`` columns (in their Arrow types as Spark gives them), each marked
    with the batch that adds it; a column the table has already (an earlier batch of this run added it) keeps its
    place."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    types = {field.name: field.dataType for field in rows.schema.fields}
    fields = [pa.field(name, to_arrow_type(types[name], timezone="UTC"), metadata={ADDED_COLUMN_KEY: marker})
              for name in added if name not in schema.names]
    return pa.schema([*schema, *fields])


def _staged(rows: DataFrame, schema: Any, staging: Path) -> Any:
    """Rows written as Parquet by the executors into ``staging``, read back as one Arrow stream in the table's
    schema: a large batch never has to fit in the driver's memory."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    rows.write.mode("overwrite").parquet(str(staging))
    parts = sorted(str(path) for path in staging.glob("*.parquet"))
    scanner = ds.dataset(parts, format="parquet").scanner() if parts else None

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in scanner.to_batches() if scanner is not None else []:
            yield from _in_schema(pa.Table.from_batches([batch]), schema).to_batches()

    return pa.RecordBatchReader.from_batches(schema, batches())


class JvmTableWriter(DeltaTableWriter):
    """delta-spark: idempotent writes by ``txnAppId``/``txnVersion``, ``replaceWhere`` for a replace."""

    engine = DeltaEngine.JVM

    def write(self, rows: DataFrame, target: TableTarget, *, query_id: str, batch_id: int, metadata: dict[str, Any],
              replace: RowFilter | None = None, staging: Path | None = None,
              added: Mapping[str, str] | None = None) -> bool:
        if target.mode is SinkMode.CDC and replace is None:
            return _apply_changes(self.engine, rows, target, query_id=query_id, batch_id=batch_id, metadata=metadata)
        faults.reach("before_commit", batch_id)
        if target.mode is SinkMode.MERGE:
            return self._merge(rows, target, query_id=query_id, batch_id=batch_id, metadata=metadata)
        overwrite = replace is not None or target.mode is SinkMode.COMPLETE
        if added:  # Delta keeps a column's metadata: the mark of the batch that added it
            marker = {ADDED_COLUMN_KEY: f"{query_id}:{batch_id}"}
            rows = rows.withColumns({name: F.col(name).alias(name, metadata=marker) for name in added})
        writer = (
            rows.write.format("delta")
            .mode("overwrite" if overwrite else "append")
            .option("txnAppId", query_id)
            .option("txnVersion", batch_id)
            .option("userMetadata", json.dumps(metadata))
        )
        if added:
            writer = writer.option("mergeSchema", "true")
        if replace is not None:
            writer = writer.option("replaceWhere", render(replace, SPARK_SQL))
        if target.partition_by:
            writer = writer.partitionBy(*target.partition_by)
        writer.save(target.path)
        return True

    @staticmethod
    def _merge(rows: DataFrame, target: TableTarget, *, query_id: str, batch_id: int,
               metadata: dict[str, Any]) -> bool:
        from delta.tables import DeltaTable

        spark = rows.sparkSession
        offered = rows.count()
        if offered == 0:
            return True
        settings = {"spark.databricks.delta.write.txnAppId": query_id,
                    "spark.databricks.delta.write.txnVersion": str(batch_id),
                    "spark.databricks.delta.commitInfo.userMetadata": json.dumps(
                        {**metadata, CommitInfo.RECORDS: offered})}
        for key, value in settings.items():
            spark.conf.set(key, value)
        try:
            source = latest_per_key(rows, target.keys, target.sequence_by)
            target_table = DeltaTable.forPath(spark, target.path).alias("t")
            (target_table.merge(source.alias("s"), _merge_condition(target.keys, "<=>"))
             .whenMatchedUpdateAll(condition=_newer(target.sequence_by)).whenNotMatchedInsertAll().execute())
        finally:
            for key in settings:
                spark.conf.unset(key)
        return True


def _apply_changes(engine: DeltaEngine, rows: DataFrame, target: TableTarget, *, query_id: str, batch_id: int,
                   metadata: dict[str, Any]) -> bool:
    """A cdc table's batch: its changes applied in sequence order (:mod:`sluice_spark.write.cdc`)."""
    from sluice_spark.write.cdc import cdc_applier

    return cdc_applier(engine).write(rows, target, query_id=query_id, batch_id=batch_id,
                                     metadata=metadata) is not None


_WRITERS: dict[DeltaEngine, DeltaTableWriter] = {DeltaEngine.RS: RsTableWriter(), DeltaEngine.JVM: JvmTableWriter()}


def table_writer(engine: DeltaEngine) -> DeltaTableWriter:
    """The idempotent writer of a resolved engine (``rs`` or ``jvm``)."""
    try:
        return _WRITERS[engine]
    except KeyError:
        raise ValueError(f"no Delta writer for engine {engine.value!r}; resolve 'auto' first") from None
