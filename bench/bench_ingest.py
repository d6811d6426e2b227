"""Ingest benchmark: Sluice's Delta sink against Spark's built-in Parquet sink, in the same run.

Both sides read the same JSON files with the same declared schema through an availableNow file stream, and both
write date-partitioned files. The baseline is Spark's Parquet file sink. Sluice's side is the full bronze stream:
dead-letter split, transform, and the exactly-once Delta commit (engine ``rs``). Rounds alternate the order, and
the best time of each side is kept, because these machines are shared and noisy. The goal is a ratio <= 1.10.

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

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sluice.catalog import parse_catalog
from sluice.demo_producer import EVENT_SCHEMA
from sluice.paths import Roots
from sluice_spark.runner import run_streams
from sluice_spark.session import configure_sluice, register_data_sources


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


def run_parquet_baseline(spark: SparkSession, landing: Path, out: Path) -> float:
    from sluice.schema import parse_schema

    schema = parse_schema(EVENT_SCHEMA, stream=None).ddl(nullable_only=True)
    started = time.perf_counter()
    frame = spark.readStream.schema(schema).json(str(landing)).withColumn(
        "event_type", F.lower(F.trim("event_type"))
    ).withColumn("event_date", F.to_date("event_time")).withColumn("_ingested_at", F.current_timestamp())
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
    catalog = parse_catalog({"version": 1, "streams": [{
        "name": "bench_events",
        "source": {"type": "files", "format": "json", "path": str(landing), "schema": EVENT_SCHEMA},
        "transform": "bronze_events",
        "sink": {"path": str(out / "table"), "partition_by": ["event_date"], "engine": "rs"},
        "checkpoint": str(out / "checkpoint"),
        "schedule": "@hourly",
    }]})
    roots = Roots(landing=str(landing), lake=str(out), checkpoints=str(out))
    started = time.perf_counter()
    summary = run_streams(spark, catalog, ["bench_events"], roots)
    elapsed = time.perf_counter() - started
    stream = summary.streams[0]
    if stream.status != "succeeded":
        raise SystemExit(f"Sluice run failed: {stream.error}")
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
        spark = configure_sluice(SparkSession.builder).master("local[2]").config("spark.ui.enabled", "false") \
            .getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        register_data_sources(spark)
        # Warm the JIT and the Python workers for both sides before anything is timed.
        run_parquet_baseline(spark, landing, work / "warmup-parquet")
        run_sluice(spark, landing, work / "warmup-sluice")

        baseline, sluice = [], []
        for round_index in range(args.rounds):
            order = ("parquet", "sluice") if round_index % 2 == 0 else ("sluice", "parquet")
            for side in order:
                out = work / f"{side}-{round_index}"
                if side == "parquet":
                    baseline.append(run_parquet_baseline(spark, landing, out))
                else:
                    elapsed, rows = run_sluice(spark, landing, out)
                    if rows != args.rows // args.files * args.files:
                        raise SystemExit(f"Sluice wrote {rows} rows, expected {args.rows}")
                    sluice.append(elapsed)
            print(f"round {round_index + 1}: parquet {baseline[-1]:.2f}s, sluice delta {sluice[-1]:.2f}s")
        ratio = min(sluice) / min(baseline)
        print(json.dumps({"rows": args.rows, "parquet_best_s": round(min(baseline), 2),
                          "sluice_delta_best_s": round(min(sluice), 2), "ratio": round(ratio, 3),
                          "goal": 1.10, "met": ratio <= 1.10}))
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
