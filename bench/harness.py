"""What every Spark benchmark shares: a local session with Sluice's data sources, and rounds that alternate the order
of the sides and keep the best time of each, because these machines are shared and noisy."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from sluice.operations.jars import spark_conf
from sluice.operations.jvm import driver_java_options, submit_env
from sluice.operations.loopback import driver_conf, driver_env
from sluice_spark.session import configure_sluice, register_data_sources


def local_spark() -> SparkSession:
    """A local session with the jars `make venv` resolved and their Delta settings, as Sluice's runs have them, on
    loopback only, and with the driver JVM options of a large run, as the operators start a local driver
    (:mod:`sluice.operations.loopback`, :func:`sluice.operations.jvm.driver_java_options`)."""
    master = "local[2]"
    builder = configure_sluice(SparkSession.builder).master(master).config("spark.ui.enabled", "false")
    for key, value in {**spark_conf(), **driver_conf(master)}.items():
        builder = builder.config(key, value)
    # read by the JVM that getOrCreate launches
    os.environ.update({**driver_env(master), **submit_env(driver_java_options(small=False))})
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register_data_sources(spark)
    return spark


def best_of_rounds(sides: Sequence[str], rounds: int, run: Callable[[str, int], float]) -> dict[str, float]:
    """Run every side once per round (``run(side, round_index)`` returns its seconds), forwards in even rounds and
    backwards in odd ones; the best time of each side."""
    times: dict[str, list[float]] = {side: [] for side in sides}
    for round_index in range(rounds):
        for side in sides if round_index % 2 == 0 else list(reversed(sides)):
            times[side].append(run(side, round_index))
        print(f"round {round_index + 1}: " + ", ".join(f"{side} {times[side][-1]:.2f}s" for side in sides))
    return {side: min(values) for side, values in times.items()}


def run_catalog(spark: SparkSession, catalog: Any, roots: Any, name: str = "bench_events") -> tuple[float, Any]:
    """Run one stream of a catalog through Sluice's runner: its seconds and its run summary (it must succeed)."""
    from sluice_spark.runner import run_streams

    started = time.perf_counter()
    summary = run_streams(spark, catalog, [name], roots)
    elapsed = time.perf_counter() - started
    stream = summary.streams[0]
    if stream.status != "succeeded":
        raise SystemExit(f"Sluice run failed: {stream.error}")
    return elapsed, stream


def run_files_stream(spark: SparkSession, landing: Path, out: Path, *, schema: dict[str, str], file_format: str,
                     policy: str, options: dict[str, Any] | None = None) -> tuple[float, dict[str, Any]]:
    """A bronze stream over the files in ``landing`` under the drift ``policy``, on the rs engine: its seconds and its
    counts."""
    from sluice.catalog import parse_catalog
    from sluice.paths import Roots

    stream = {
        "name": "bench_events",
        "source": {"type": "files", "format": file_format, "path": str(landing), "schema": schema,
                   "options": options or {}, "schema_evolution": policy},
        "sink": {"path": str(out / "table"), "engine": "rs"},
        "checkpoint": str(out / "checkpoint"),
        "schedule": "@hourly",
    }
    catalog = parse_catalog({"version": 1, "streams": [stream]})
    elapsed, result = run_catalog(spark, catalog, Roots(landing=str(landing), lake=str(out), checkpoints=str(out)))
    return elapsed, {"input": result.input_rows, "written": result.output_rows,
                     "dead_letter": result.dead_letter_rows, "rescued": result.rescued_rows}


def compare_sides(doc: str, prefix: str, sides: tuple[str, ...], write: Callable[[Path, int, int], None],
                  run: Callable[[SparkSession, Path, Path, str], tuple[float, dict[str, Any]]],
                  check: Callable[[dict[str, dict[str, Any]], int], None], goal: float | dict[str, float]) -> None:
    """A benchmark of sides over the same written files (``--rows`` in ``--files``): every side warmed up once,
    then ``--rounds`` alternating rounds; ``check`` sees each side's counts of its last run. The last line is the
    result as JSON, with the ratio ``<side>_vs_<first>`` of every other side and its goal (``goal``, or ``goal[side]``
    for more than two sides)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        landing = work / "landing"
        started = time.perf_counter()
        write(landing, args.rows, args.files)
        print(f"wrote {args.rows:,} JSON rows in {args.files} files in {time.perf_counter() - started:.1f}s")
        spark = local_spark()
        for side in sides:  # warm the JIT and the Python workers before anything is timed
            run(spark, landing, work / f"warmup-{side}", side)
        counts: dict[str, dict[str, Any]] = {}

        def timed(side: str, round_index: int) -> float:
            elapsed, counts[side] = run(spark, landing, work / f"{side}-{round_index}", side)
            return elapsed

        best = best_of_rounds(sides, args.rounds, timed)
        check(counts, args.rows // args.files * args.files)
        print(", ".join(f"{side} side: {counts[side]}" for side in sides))
        goals = goal if isinstance(goal, dict) else {sides[1]: goal}
        print(json.dumps({"rows": args.rows, "best_seconds": {k: round(v, 2) for k, v in best.items()},
                          "ratios": {f"{side}_vs_{sides[0]}": round(best[side] / best[sides[0]], 3) for side in goals},
                          "goals": {f"{side}_vs_{sides[0]}": value for side, value in goals.items()}}))
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
