"""Ingest benchmark: Sluice's Delta sink against Spark's built-in Parquet sink, in the same run.

Every side reads the same JSON files with the same declared schema through an availableNow file stream and writes
date-partitioned files. Three sides:

- ``parquet``: the bronze stream's own frame (dead-letter split, transform, ingestion columns) into Spark's
  Parquet file sink. This is the baseline of the goal.
- ``sluice``: the whole bronze stream as it runs in production: the same frame into Sluice's exactly-once Delta
  sink (engine ``rs``), with the Delta commits, the dead-letter table and the run summary.
- ``plain``: a bare JSON -> Parquet stream with no quality split and no ingestion columns: what the bronze
  features cost on top of Spark's minimum.

Rounds alternate the order and the best time of each side is kept, because these machines are shared and noisy.
Two goals: ``sluice_vs_parquet`` (the Delta sink against Spark's Parquet sink, the same frame) <= 1.10, and
``bronze_vs_plain`` (the whole bronze stream against the bare JSON -> Parquet stream: what the data contract and the
sink cost together on top of Spark's minimum) <= 1.3. The last line is the result as JSON, with ``ratios`` and
``goals`` of the same keys.

    python bench/bench_ingest.py --rows 1000000
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from harness import best_of_rounds, local_spark, run_catalog
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sluice.catalog import Catalog, parse_catalog
from sluice.cli.demo_producer import EVENT_SCHEMA
from sluice.model.schema import parse_schema
from sluice.paths import Roots
from sluice_spark.runner import build_routed_frame

#: Each ratio's goal; the features' own ratio is printed without one (null).
GOALS = {"sluice_vs_parquet": 1.10, "bronze_vs_plain": 1.3, "bronze_features_vs_plain": None}



def write_events(folder: Path, rows: int, files: int) -> None:
    generator = random.Random(1)
    folder.mkdir(parents=True)
    per_file = rows // files
    for index in range(files):
        lines = []
        for _ in range(per_file):
            kind = generator.choice(("click", "click", "click", "purchase", "session_start"))
            event = {
                "event_id": str(uuid.UUID(int=generator.getrandbits(128))),
                "event_type": kind,
                "user_id": f"u{generator.randrange(10_000):05d}",
                "session_id": f"s{generator.randrange(100_000)}",
                "page": "/product/espresso-grinder" if kind == "click" else None,
                "amount": round(generator.uniform(1, 500), 2) if kind == "purchase" else None,
                "currency": "EUR" if kind == "purchase" else None,
                "event_time": f"2026-11-{generator.randrange(1, 8):02d}T{generator.randrange(24):02d}:00:00Z",
            }
            lines.append(json.dumps(event))
        (folder / f"events-{index:04d}.json").write_text("\n".join(lines) + "\n")


def bench_catalog(landing: Path, out: Path) -> tuple[Catalog, Roots]:
    catalog = parse_catalog({"version": 1, "streams": [{
        "name": "bench_events",
        "source": {"type": "files", "format": "json", "path": str(landing), "schema": EVENT_SCHEMA},
        "transform": "bronze_events",
        "sink": {"path": str(out / "table"), "partition_by": ["event_date"], "engine": "rs"},
        "checkpoint": str(out / "checkpoint"),
        "schedule": "@hourly",
    }]})
    return catalog, Roots(landing=str(landing), lake=str(out), checkpoints=str(out))


def run_parquet(spark: SparkSession, landing: Path, out: Path, *, plain: bool) -> float:
    started = time.perf_counter()
    if plain:
        schema = parse_schema(EVENT_SCHEMA, stream=None).ddl(nullable_only=True)
        frame = spark.readStream.schema(schema).json(str(landing)).withColumn(
            "event_type", F.lower(F.trim("event_type"))
        ).withColumn("event_date", F.to_date("event_time"))
    else:
        catalog, roots = bench_catalog(landing, out)
        routed, data_columns = build_routed_frame(spark, catalog.get("bench_events"), roots)
        frame = routed.select(*data_columns)
    query = (
        frame.writeStream.format("parquet")
        .partitionBy("event_date")
        .option("path", str(out / "table"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - started


def run_sluice(spark: SparkSession, landing: Path, out: Path) -> tuple[float, int]:
    catalog, roots = bench_catalog(landing, out)
    elapsed, stream = run_catalog(spark, catalog, roots)
    return elapsed, stream.output_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    try:
        landing = work / "landing"
        started = time.perf_counter()
        write_events(landing, args.rows, args.files)
        print(f"wrote {args.rows:,} JSON rows in {args.files} files in {time.perf_counter() - started:.1f}s")
        spark = local_spark()
        # Warm the JIT and the Python workers for every side before anything is timed.
        run_parquet(spark, landing, work / "warmup-plain", plain=True)
        run_parquet(spark, landing, work / "warmup-parquet", plain=False)
        run_sluice(spark, landing, work / "warmup-sluice")

        def timed(side: str, round_index: int) -> float:
            out = work / f"{side}-{round_index}"
            if side != "sluice":
                return run_parquet(spark, landing, out, plain=side == "plain")
            elapsed, rows = run_sluice(spark, landing, out)
            if rows != args.rows // args.files * args.files:
                raise SystemExit(f"Sluice wrote {rows} rows, expected {args.rows}")
            return elapsed

        best = best_of_rounds(["plain", "parquet", "sluice"], args.rounds, timed)
        ratios = {"sluice_vs_parquet": best["sluice"] / best["parquet"],
                  "bronze_vs_plain": best["sluice"] / best["plain"],
                  "bronze_features_vs_plain": best["parquet"] / best["plain"]}
        print(json.dumps({"rows": args.rows, "best_seconds": {k: round(v, 2) for k, v in best.items()},
                          "ratios": {key: round(value, 3) for key, value in ratios.items()}, "goals": GOALS}))
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
