"""Delta sinks for a routed stream: the stream's table plus its dead-letter table, written exactly once.

``rs`` writes through :mod:`sluice_spark.delta_rs_sink`. ``jvm`` uses delta-spark in ``foreachBatch`` with
``txnAppId``/``txnVersion``, delta-spark's documented idempotent multi-table write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

from sluice.constants import DeltaEngine
from sluice.delta import commit_metadata
from sluice_spark.delta_rs_sink import DATA_SOURCE_NAME, TableTarget, encode_targets


def delta_writer(
    frame: DataFrame,
    *,
    engine: DeltaEngine,
    targets: Sequence[TableTarget],
    route_column: str,
    query_id: str,
    stream: str,
    commit_info: dict[str, Any],
) -> DataStreamWriter:
    """A ``DataStreamWriter`` (without trigger or checkpoint) that routes ``frame`` into ``targets``."""
    if engine is DeltaEngine.RS:
        return (
            frame.writeStream.format(DATA_SOURCE_NAME)
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
                rows = batch.where(F.col(route_column) == target.route).select(
                    *[F.col(source).alias(name) for source, name in target.columns]
                )
                metadata = commit_metadata(commit_info, stream=stream, query_id=query_id, batch_id=batch_id,
                                           route=target.route)
                writer = (
                    rows.write.format("delta")
                    .mode("append")
                    .option("txnAppId", query_id)
                    .option("txnVersion", batch_id)
                    .option("userMetadata", json.dumps(metadata))
                )
                if target.partition_by:
                    writer = writer.partitionBy(*target.partition_by)
                writer.save(target.path)
        finally:
            batch.unpersist()

    return frame.writeStream.foreachBatch(write_batch)
