"""Delta sinks for a routed stream: the stream's table, its dead-letter table and any fan-out tables, each written
exactly once per micro-batch.

Appends on ``rs`` go through :mod:`sluice_spark.delta_rs_sink`, which writes Parquet on the executors. Everything
else runs in ``foreachBatch`` with the batch's transaction identifier (app id = query id, version = batch id) on
every commit, so a replayed batch is skipped table by table:

- ``jvm``: delta-spark with ``txnAppId``/``txnVersion`` on writes, and the same two SQL settings around a MERGE
  (delta-spark's documented idempotent writes);
- ``rs``: delta-rs ``write_deltalake``/``DeltaTable.merge`` with ``app_transactions``, after checking the table's
  recorded transaction version. The batch crosses to the driver as Arrow: merge and complete mode are meant for
  upserts and aggregates, whose batches are small next to a bronze append.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

from sluice.constants import COMMIT_INFO_RECORDS, DeltaEngine, SinkMode
from sluice.delta import commit_metadata
from sluice_spark import faults
from sluice_spark.delta_rs_sink import DATA_SOURCE_NAME, TableTarget, encode_targets

log = logging.getLogger(__name__)

# Spark's output mode for each way a table is written.
OUTPUT_MODES = {SinkMode.APPEND: "append", SinkMode.MERGE: "update", SinkMode.COMPLETE: "complete"}


def delta_writer(
    frame: DataFrame,
    *,
    engine: DeltaEngine,
    targets: Sequence[TableTarget],
    route_column: str,
    query_id: str,
    stream: str,
    commit_info: dict[str, Any],
    mode: SinkMode = SinkMode.APPEND,
) -> DataStreamWriter:
    """A ``DataStreamWriter`` (without trigger or checkpoint) that routes ``frame`` into ``targets``."""
    if engine is DeltaEngine.RS and all(target.mode is SinkMode.APPEND for target in targets):
        return (
            frame.writeStream.format(DATA_SOURCE_NAME)
            .outputMode(OUTPUT_MODES[mode])
            .option("targets", encode_targets(targets))
            .option("routeColumn", route_column)
            .option("queryId", query_id)
            .option("stream", stream)
            .option("commitInfo", json.dumps(commit_info))
        )

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        try:
            for target in targets:
                selected = F.col(route_column) == target.route
                if target.flag:
                    selected = selected & F.col(target.flag)
                rows = batch.where(selected).select(*[F.col(source).alias(name) for source, name in target.columns])
                metadata = commit_metadata(commit_info, stream=stream, query_id=query_id, batch_id=batch_id,
                                           route=target.route)
                write_target(rows, target, engine=engine, query_id=query_id, batch_id=batch_id, metadata=metadata)
                faults.reach("between_commits", batch_id)
        finally:
            batch.unpersist()

    return frame.writeStream.foreachBatch(write_batch).outputMode(OUTPUT_MODES[mode])


def latest_per_key(rows: DataFrame, keys: Sequence[str], sequence_by: str | None) -> DataFrame:
    """One row per key: the one with the highest ``sequence_by``. A MERGE fails when two source rows match one
    target row, and a batch may carry several versions of a key. Versions with the same sequence are told apart by
    their other columns, so that a replay picks the same one; across batches, the later batch wins a tie."""
    if sequence_by is None:
        return rows  # an aggregate's update output has one row per key already
    others = [F.col(f"`{name}`").desc_nulls_last() for name in rows.columns if name not in (*keys, sequence_by)]
    order = Window.partitionBy(*keys).orderBy(F.col(sequence_by).desc_nulls_last(), *others)
    return rows.withColumn("_sluice_rank", F.row_number().over(order)).where("_sluice_rank = 1").drop("_sluice_rank")


def _merge_condition(keys: Sequence[str], equal_null_safe: str) -> str:
    """Keys match when equal or both NULL (an aggregate's group may be NULL)."""
    return " AND ".join(f"(t.`{key}` {equal_null_safe} s.`{key}`)" for key in keys)


def _newer(sequence_by: str | None) -> str | None:
    """A matched row is replaced only by a newer or equal version: a late, older version changes nothing."""
    return None if sequence_by is None else f"s.`{sequence_by}` >= t.`{sequence_by}` OR t.`{sequence_by}` IS NULL"


def write_target(rows: DataFrame, target: TableTarget, *, engine: DeltaEngine, query_id: str, batch_id: int,
                 metadata: dict[str, Any]) -> None:
    """Write one batch's rows of one table as its mode says, once: a batch whose transaction the table already
    records is skipped."""
    if engine is DeltaEngine.JVM:
        _write_jvm(rows, target, query_id, batch_id, metadata)
    else:
        _write_rs(rows, target, query_id, batch_id, metadata)


def _write_rs(rows: DataFrame, target: TableTarget, query_id: str, batch_id: int, metadata: dict[str, Any]) -> None:
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    table = DeltaTable(target.path)
    committed = table.transaction_version(query_id)
    if committed is not None and committed >= batch_id:
        log.warning("Batch %s of %s is already in %s (txn version %s); skipping its replay",
                    batch_id, query_id, target.path, committed)
        return
    offered = rows.count()  # a merge's superseded versions count as processed, for the row reconciliation
    if offered == 0 and target.mode is not SinkMode.COMPLETE:
        return
    if target.mode is SinkMode.MERGE:
        rows = latest_per_key(rows, target.keys, target.sequence_by)
    data = rows.toArrow().cast(pa.schema(table.schema().to_arrow()))  # Spark's Arrow types as the table has them
    properties = CommitProperties(custom_metadata={**metadata, COMMIT_INFO_RECORDS: offered},
                                  app_transactions=[Transaction(query_id, batch_id)])
    if target.mode is SinkMode.MERGE:
        condition = _merge_condition(target.keys, "IS NOT DISTINCT FROM")
        merger = table.merge(data, condition, source_alias="s", target_alias="t", commit_properties=properties)
        merger.when_matched_update_all(predicate=_newer(target.sequence_by)).when_not_matched_insert_all().execute()
    else:
        write_deltalake(table, data, mode="overwrite" if target.mode is SinkMode.COMPLETE else "append",
                        partition_by=list(target.partition_by) or None, commit_properties=properties)


def _write_jvm(rows: DataFrame, target: TableTarget, query_id: str, batch_id: int, metadata: dict[str, Any]) -> None:
    if target.mode is not SinkMode.MERGE:
        writer = (
            rows.write.format("delta")
            .mode("overwrite" if target.mode is SinkMode.COMPLETE else "append")
            .option("txnAppId", query_id)
            .option("txnVersion", batch_id)
            .option("userMetadata", json.dumps(metadata))
        )
        if target.partition_by:
            writer = writer.partitionBy(*target.partition_by)
        writer.save(target.path)
        return
    from delta.tables import DeltaTable

    spark = rows.sparkSession
    offered = rows.count()
    if offered == 0:
        return
    settings = {"spark.databricks.delta.write.txnAppId": query_id,
                "spark.databricks.delta.write.txnVersion": str(batch_id),
                "spark.databricks.delta.commitInfo.userMetadata": json.dumps(
                    {**metadata, COMMIT_INFO_RECORDS: offered})}
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
