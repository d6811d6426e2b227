"""Delta sinks for a routed stream: the stream's table, its dead-letter table and any fan-out tables, each written
exactly once per micro-batch.

Appends on ``rs`` go through :mod:`sluice_spark.delta_rs_sink`, which writes Parquet on the executors. Everything
else runs in ``foreachBatch`` through :class:`sluice_spark.writers.BatchRouter`. On ``rs`` such a batch crosses to
the driver as Arrow: merge and complete mode are meant for upserts and aggregates, whose batches are small next to
a bronze append.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.streaming import DataStreamWriter

from sluice.constants import DeltaEngine, SinkMode
from sluice_spark.delta_rs_datasource import DATA_SOURCE_NAME
from sluice_spark.targets import TableTarget, encode_targets
from sluice_spark.writers import BatchRouter, stream_commit_info

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

    router = BatchRouter(targets, engine=engine, route_column=route_column, query_id=query_id,
                         commit_info=stream_commit_info(commit_info, stream=stream, query_id=query_id))
    return frame.writeStream.foreachBatch(router).outputMode(OUTPUT_MODES[mode])
