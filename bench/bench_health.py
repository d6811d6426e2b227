"""Health-check benchmark: a checkpoint with 10,000 batches and a file-source log of 100,000 entries.

It times ``sluice.operations.health.check_stream`` (plain files and delta-rs, no JVM) and, in the same run, the
start of a local SparkSession in a fresh process: the cost a JVM-based check would pay before reading anything.
The goal is a health check under 1 second.

    python bench/bench_health.py
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sluice.catalog import parse_catalog
from sluice.cli.demo_producer import EVENT_SCHEMA
from sluice.operations.health import check_stream
from sluice.paths import Roots

BATCH_METADATA = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1_795_000_000_000, "conf": {
    "spark.sql.shuffle.partitions": "4", "spark.sql.streaming.stateStore.providerClass":
    "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"}})


def build_checkpoint(root: Path, batches: int, files_per_batch: int) -> None:
    """Spark's layout: metadata, offsets/N and commits/N with their .crc files, and a compacted file-source log."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "sources" / "0").mkdir(parents=True)
    (root / "metadata").write_text('{"id":"6f1c2b1e-0d1b-4a47-9a51-3c8e2f1f0b7a"}')
    for batch in range(batches):
        (root / "offsets" / str(batch)).write_text(f'v1\n{BATCH_METADATA}\n{{"logOffset":{batch}}}')
        (root / "offsets" / f".{batch}.crc").write_bytes(b"crc")
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
        (root / "commits" / f".{batch}.crc").write_bytes(b"crc")
    # Spark compacts the source log every 10 batches; the last compact file holds every entry so far.
    with (root / "sources" / "0" / f"{batches - 1}.compact").open("w") as log:
        log.write("v1\n")
        for batch in range(batches):
            for index in range(files_per_batch):
                log.write(json.dumps({"path": f"file:///landing/events/b{batch:05d}-{index}.json",
                                      "timestamp": 1_795_000_000_000 + batch, "batchId": batch}) + "\n")


def spark_session_start_seconds() -> float:
    probe = ("import time; t = time.perf_counter(); from pyspark.sql import SparkSession; "
             "s = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate(); "
             "print(time.perf_counter() - t); s.stop()")
    output = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return float(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--files-per-batch", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sluice-bench-health-"))
    try:
        catalog = parse_catalog({"version": 1, "streams": [{
            "name": "bench_events",
            "source": {"type": "files", "format": "json", "path": "events", "schema": EVENT_SCHEMA},
            "transform": "bronze_events",
            "sink": {"path": "bronze/events", "partition_by": ["event_date"]},
            "checkpoint": "bronze/events",
            "schedule": "@hourly",
        }]})
        roots = Roots(landing=str(work / "landing"), lake=str(work / "lake"), checkpoints=str(work / "checkpoints"))
        stream = catalog.get("bench_events")
        started = time.perf_counter()
        build_checkpoint(Path(stream.checkpoint_path(roots)), args.batches, args.files_per_batch)
        print(f"built a checkpoint of {args.batches:,} batches and {args.batches * args.files_per_batch:,} "
              f"source-log entries in {time.perf_counter() - started:.1f}s")

        timings = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            report = check_stream(stream, roots)
            timings.append(time.perf_counter() - started)
        assert report.facts["batches_retained"] == args.batches, report.facts
        spark_start = spark_session_start_seconds()
        best, median = min(timings), statistics.median(timings)
        print(json.dumps({"batches": args.batches, "source_log_entries": args.batches * args.files_per_batch,
                          "status": report.status.value, "health_check_best_s": round(best, 4),
                          "health_check_median_s": round(median, 4), "spark_session_start_s": round(spark_start, 2),
                          "ratio_check_vs_spark_start": round(median / spark_start, 4), "goal_s": 1.0,
                          "met": median < 1.0}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
