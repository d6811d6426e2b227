"""Lag-check benchmark: a stream whose file-source log holds 100,000 files, with 1,000 new files in the landing zone.

It times the check a sensor poll or a monitor tick makes (``sluice.lag.store.check_against_history``: list the
landing zone, read the compacted source log, stat only the unread files, read the newest event time from the
sink's file statistics, read the lag history; no JVM) and, in the same run, the start of a local SparkSession in
a fresh process: what a check that asked Spark would pay before reading anything. The goal is a lag check
under 1 second.

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
from sluice.cli.demo_producer import EVENT_SCHEMA
from sluice.lag.observe import check
from sluice.lag.store import LagStore, check_against_history
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
                                       "batchId": index * 1_000 // recorded}))
    log = next((checkpoint / "sources" / "0").glob("*.compact"))
    log.write_text("v1\n" + "\n".join(entries) + "\n")


def build_sink(path: str, days: int) -> None:
    """A bronze table with one file per event date, as a year of daily partitions leaves it."""
    import datetime as dt

    import pyarrow as pa
    from deltalake import write_deltalake

    start = dt.datetime(2025, 11, 22, tzinfo=dt.timezone.utc)
    times = [start + dt.timedelta(days=day, hours=12) for day in range(days)]
    write_deltalake(path, pa.table({"event_id": [f"e{day}" for day in range(days)],
                                    "event_time": pa.array(times, pa.timestamp("us", tz="UTC")),
                                    "event_date": [t.date().isoformat() for t in times]}),
                    partition_by=["event_date"])


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
            "backfill": {"event_time_column": "event_time"},
        }]})
        roots = Roots(landing=str(work / "landing"), lake=str(work / "lake"), checkpoints=str(work / "checkpoints"))
        stream = catalog.get("bench_events")
        checkpoint = Path(stream.checkpoint_path(roots))
        started = time.perf_counter()
        build_checkpoint(checkpoint, 1_000, 1)  # batches 0..999, all committed
        build_landing(Path(stream.source_path(roots)), checkpoint, args.recorded, args.new)
        build_sink(stream.sink_path(roots), days=365)
        store = LagStore.for_roots(roots)
        for _ in range(stream.alerts.stall_observations):
            store.record(check(stream, roots))
        print(f"built {args.recorded:,} recorded + {args.new:,} new files in {time.perf_counter() - started:.1f}s")

        timings = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            report = check_against_history(stream, roots)
            timings.append(time.perf_counter() - started)
        assert report.observation.backlog.files == args.new, report.observation.backlog
        lag_check = statistics.median(timings)
        spark_start = spark_session_start_seconds()
        print(f"lag check (median of {args.repeat}): {lag_check:.3f}s  status={report.status.value} "
              f"files={report.observation.backlog.files} bytes={report.observation.backlog.bytes} "
              f"newest event={report.observation.newest_event_time}")
        print(f"SparkSession start (fresh process): {spark_start:.2f}s")
        print(f"ratio lag check / Spark start: {lag_check / spark_start:.3f}  (goal: lag check under 1 s: "
              f"{'met' if lag_check < 1 else 'NOT met'})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
