"""Lag-check benchmark: a stream whose file-source log holds 100,000 files, with 1,000 new files in the landing zone.

It times ``sluice.lag.check`` (list the landing zone, read the compacted source log, stat only the unread files;
no JVM) and, in the same run, the start of a local SparkSession in a fresh process: what a check that asked Spark
would pay before reading anything. The goal is a lag check under 1 second.

    python bench/bench_lag.py
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench_health import build_checkpoint, spark_session_start_seconds

from sluice.catalog import parse_catalog
from sluice.demo_producer import EVENT_SCHEMA
from sluice.lag import check
from sluice.paths import Roots


def build_landing(landing: Path, checkpoint: Path, recorded: int, new: int, per_folder: int = 1000) -> None:
    """``recorded`` files named in the checkpoint's compacted source log, and ``new`` files it does not hold."""
    entries = []
    for index in range(recorded + new):
        folder = landing / f"day={index // per_folder:04d}"
        if index % per_folder == 0:
            folder.mkdir(parents=True)
        path = folder / f"part-{index:06d}.json"
        path.write_bytes(b'{"event_id": "e"}\n')
        if index < recorded:
            entries.append(json.dumps({"path": f"file://{path}", "timestamp": int(time.time() * 1000),
                                       "batchId": index // 10}))
    log = next((checkpoint / "sources" / "0").glob("*.compact"))
    log.write_text("v1\n" + "\n".join(entries) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recorded", type=int, default=100_000)
    parser.add_argument("--new", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sluice-bench-lag-"))
    try:
        catalog = parse_catalog({"version": 1, "streams": [{
            "name": "bench_events",
            "source": {"type": "files", "format": "json", "path": "events", "schema": EVENT_SCHEMA,
                       "options": {"pathGlobFilter": "*.json"}},
            "transform": "bronze_events",
            "sink": {"path": "bronze/events", "partition_by": ["event_date"]},
            "checkpoint": "bronze/events",
            "schedule": "@hourly",
            "alerts": {"warn_files": 100, "critical_files": 10_000},
        }]})
        roots = Roots(landing=str(work / "landing"), lake=str(work / "lake"), checkpoints=str(work / "checkpoints"))
        stream = catalog.get("bench_events")
        checkpoint = Path(stream.checkpoint_path(roots))
        started = time.perf_counter()
        build_checkpoint(checkpoint, 1_000, 1)
        build_landing(Path(stream.source_path(roots)), checkpoint, args.recorded, args.new)
        print(f"built {args.recorded:,} recorded + {args.new:,} new files in {time.perf_counter() - started:.1f}s")

        timings = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            report = check(stream, roots)
            timings.append(time.perf_counter() - started)
        assert report.observation.backlog.files == args.new, report.observation.backlog
        lag_check = statistics.median(timings)
        spark_start = spark_session_start_seconds()
        print(f"lag check (median of {args.repeat}): {lag_check:.3f}s  status={report.status.value} "
              f"files={report.observation.backlog.files} bytes={report.observation.backlog.bytes}")
        print(f"SparkSession start (fresh process): {spark_start:.2f}s")
        print(f"ratio lag check / Spark start: {lag_check / spark_start:.3f}  (goal: lag check under 1 s: "
              f"{'met' if lag_check < 1 else 'NOT met'})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
