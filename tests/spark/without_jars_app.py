"""A Spark application without Sluice's JVM jars, for tests/spark/test_jvm_engine.py: each feature that needs them,
refused; prints one JSON line of the messages."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from sluice.catalog import parse_catalog
from sluice.constants import DeltaEngine
from sluice.errors import SluiceError
from sluice.paths import Roots
from sluice_spark.runner import run_streams
from sluice_spark.session import configure_sluice, resolve_engine


def refusal(spark: SparkSession, streams: list[dict], roots: Roots) -> str:
    catalog = parse_catalog({"version": 1, "streams": [{**stream, "schedule": "@daily"} for stream in streams]})
    try:
        summary = run_streams(spark, catalog, [streams[0]["name"]], roots)
    except SluiceError as exc:
        return str(exc)
    return f"not refused: {summary}"


def main(folder: str) -> None:
    root = Path(folder)
    roots = Roots(landing=str(root / "landing"), lake=str(root / "lake"), checkpoints=str(root / "checkpoints"))
    (root / "landing" / "orders").mkdir(parents=True)
    (root / "landing" / "orders" / "part-0.json").write_text('{"order_id": "o1"}\n')
    spark = configure_sluice(SparkSession.builder).getOrCreate()
    files = {"type": "files", "format": "json", "path": "orders", "schema": {"order_id": "string"}}
    kafka = {"type": "kafka", "format": "json", "options": {"subscribe": "t"}, "schema": {"order_id": "string"}}
    delta = {"path": "bronze/orders", "engine": "rs"}
    outcome = {
        "kafka_source": refusal(spark, [{"name": "a", "source": kafka, "sink": delta}], roots),
        "s3a_checkpoint": refusal(spark, [{"name": "c", "source": files, "sink": delta}],
                                  Roots(roots.landing, roots.lake, "s3a://nowhere/checkpoints")),
        "jvm_engine": refusal(spark, [{"name": "d", "source": files, "sink": {**delta, "engine": "jvm"}}], roots),
        "auto_engine": resolve_engine(spark, DeltaEngine.AUTO, [roots.lake]).value,
        "tables_created": sorted(str(path.parent) for path in (root / "lake").rglob("_delta_log")),
    }
    print(json.dumps(outcome), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
