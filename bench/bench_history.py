"""History benchmark: does a run cost more after months of runs? A one-file run of a stream with 1,000 runs behind
it, against the same one-file run of a fresh stream, with the Delta maintenance on its schedule.

The stream is the bundled ``events_bronze`` (its SQL transform, four expectations, the rs engine, the dead-letter
table), in one local SparkSession. Its history is built the way five-minute runs leave it, one file per batch:
``--runs`` files of 30 events, read with ``max_files_per_trigger: 1`` so that each file is one micro-batch, one
checkpoint batch and one Delta commit, in rounds of ``--maintain-every`` batches (288: a day of five-minute runs),
each followed by the nightly maintenance (``sluice.operations.maintenance.maintain``). Then, in rounds that
alternate the order and keep the best time of each side:

- ``aged``: one new file lands, and the aged stream runs;
- ``fresh``: a new stream (its own checkpoint and tables) runs over one file.

What grows with history and what keeps it flat: the checkpoint's offsets and commits (Spark keeps the last 100
batches), the file source's log (compacted every 10 batches by Spark, and it lists every file it has read), the
Delta log (a checkpoint every 10 commits, and maintenance's), the data files (compacted by maintenance) and the
landing folder's listing (1,000 files). The goal is aged / fresh <= 1.5. The last line is the result as JSON.

    python bench/bench_history.py [--runs 1000] [--maintain-every 288] [--rounds 3]
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from harness import best_of_rounds, local_spark, run_catalog
from pyspark.sql import SparkSession

from sluice.catalog import DEFAULT_CATALOG, Catalog, parse_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.operations.maintenance import maintain
from sluice.paths import Roots

STREAM = "events_bronze"
GOALS = {"aged_vs_fresh": 1.5}
START = dt.datetime(2026, 8, 1, tzinfo=dt.timezone.utc)


def stream_catalog(landing: str, *, files_per_batch: int | None = None) -> Catalog:
    """The bundled stream reading ``landing`` (relative to the landing root)."""
    bundled = yaml.safe_load(DEFAULT_CATALOG.read_text(encoding="utf-8"))
    stream = copy.deepcopy(next(entry for entry in bundled["streams"] if entry["name"] == STREAM))
    stream["source"]["path"] = landing
    if files_per_batch is not None:
        stream["trigger"] = {"max_files_per_trigger": files_per_batch}
    return parse_catalog({"version": 1, "streams": [stream]})


def run_once(spark: SparkSession, catalog: Catalog, roots: Roots) -> tuple[float, Any]:
    return run_catalog(spark, catalog, roots, STREAM)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--maintain-every", type=int, default=288)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-history-"))
    try:
        spark = local_spark()
        aged_roots = Roots(landing=str(work / "landing"), lake=str(work / "aged" / "lake"),
                           checkpoints=str(work / "aged" / "checkpoints"))
        producer = DemoProducer(work / "landing" / "aged", seed=3, malformed_rate=0.02)
        builder = stream_catalog("aged", files_per_batch=1)
        aged = stream_catalog("aged")
        moment, built, started = START, 0, time.perf_counter()
        while built < args.runs:
            chunk = min(args.maintain_every, args.runs - built)
            for _ in range(chunk):
                moment += dt.timedelta(minutes=5)
                producer.events_file(lines=30, now=moment)
            _, summary = run_once(spark, builder, aged_roots)
            built += summary.batches
            maintain(aged, aged_roots, [STREAM], run_id=f"nightly-{built}")
            print(f"history: {built} runs in {time.perf_counter() - started:.0f}s, maintained")

        def timed(side: str, round_index: int) -> float:
            if side == "aged":
                nonlocal moment
                moment += dt.timedelta(minutes=5)
                producer.events_file(lines=30, now=moment)
                elapsed, summary = run_once(spark, aged, aged_roots)
            else:
                name = f"fresh{round_index}"
                DemoProducer(work / "landing" / name, seed=round_index).events_file(lines=30, now=moment)
                fresh = stream_catalog(name)
                elapsed, summary = run_once(spark, fresh, Roots(landing=str(work / "landing"),
                                                                lake=str(work / name / "lake"),
                                                                checkpoints=str(work / name / "checkpoints")))
            if summary.batches != 1:
                raise SystemExit(f"{side}: expected one batch, ran {summary.batches}")
            return elapsed

        run_once(spark, *_warm_up(work))
        best = best_of_rounds(["aged", "fresh"], args.rounds, timed)
        ratio = best["aged"] / best["fresh"]
        print(f"a one-file run after {built} runs: {best['aged']:.2f}s; on a fresh stream: {best['fresh']:.2f}s; "
              f"{ratio:.2f}x (goal <= {GOALS['aged_vs_fresh']})")
        print(json.dumps({"ratios": {"aged_vs_fresh": round(ratio, 3)}, "goals": GOALS,
                          "seconds": {side: round(value, 2) for side, value in best.items()}, "history_runs": built}))
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _warm_up(work: Path) -> tuple[Catalog, Roots]:
    """A throwaway stream, so the first timed run does not pay for the JIT and the Python workers."""
    DemoProducer(work / "landing" / "warmup", seed=99).events_file(lines=30, now=START)
    return stream_catalog("warmup"), Roots(landing=str(work / "landing"), lake=str(work / "warmup" / "lake"),
                          checkpoints=str(work / "warmup" / "checkpoints"))


if __name__ == "__main__":
    main()
