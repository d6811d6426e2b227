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
landing folder's listing (1,000 files). The goal is aged / fresh <= 1.5.

A third side, ``cleaned``, is the same stream with ``source.clean`` (delete, ``after: 1s``) and a longer history
(``--clean-runs``, 10,000 by default: five-minute runs for five weeks): each run deletes the files it read, so the
landing folder's listing stays the size of one run's files, and the clean keeps the checkpoint's file source log
to Spark's ``maxFileAge`` horizon (7 days: 2,016 entries), which every query start reads. Its goal is
``after_10000_vs_fresh`` <= 1.2. The last line is the result as JSON.

The clock: a history is built hundreds of times faster than the five-minute runs it stands for, and the landed files
carry the simulated clock's times. What Delta ages by the wall clock (its remove tombstones, which a log checkpoint
keeps for ``delta.deletedFileRetentionDuration``, 7 days, and its commit files, kept for ``delta.logRetentionDuration``,
30 days) is scaled the same way: before each nightly maintenance the build sets both retentions on the side's tables
to the production defaults divided by the round's measured speed-up (:func:`scale_retentions`), so the aged tables
hold a week of tombstones and a month of commits, as a production table does after five weeks. (Without it, a history
built in an hour kept every tombstone of its five weeks: 16,637 checkpoint actions for 38 live files.) The simulated
clock stops with the build, so the build ends by setting the production retentions back: otherwise the wall clock
between the build and a measurement counted hundreds of times over, and the first commit of a measurement two hours
after the build expired the month of commits, and its next log checkpoint the week of tombstones (8,471
``_delta_log`` files and 2,731 checkpoint actions down to 27 and 70, measured).

Building a history takes time (0.3-0.5 s a one-file batch: 10,000 take over an hour), so ``--work DIR`` keeps the
built histories in DIR and reuses them (growing them to ``--runs``/``--clean-runs`` when they are shorter), and
``--rounds 0`` only builds. Without ``--work``, a temporary folder is removed at the end.

    python bench/bench_history.py [--runs 1000] [--clean-runs 10000] [--maintain-every 288] [--rounds 3] [--lock FILE]
                                  [--work DIR]
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import fcntl
import json
import os
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
GOALS = {"aged_vs_fresh": 1.5, "after_10000_vs_fresh": 1.2}
START = dt.datetime(2026, 8, 1, tzinfo=dt.timezone.utc)
# Delta's defaults for what it ages by the wall clock: remove tombstones in log checkpoints, and commit files.
PRODUCTION_RETENTIONS = {"delta.deletedFileRetentionDuration": dt.timedelta(days=7),
                         "delta.logRetentionDuration": dt.timedelta(days=30)}


def stream_catalog(landing: str, *, files_per_batch: int | None = None, clean: bool = False) -> Catalog:
    """The bundled stream reading ``landing`` (relative to the landing root), deleting what it read with ``clean``."""
    bundled = yaml.safe_load(DEFAULT_CATALOG.read_text(encoding="utf-8"))
    stream = copy.deepcopy(next(entry for entry in bundled["streams"] if entry["name"] == STREAM))
    stream["source"]["path"] = landing
    stream["sink"]["engine"] = "rs"  # as the docstring says: the bundled stream's `auto` is jvm where the jars load
    if clean:
        stream["source"]["clean"] = {"action": "delete", "after": "1s"}
    if files_per_batch is not None:
        stream["trigger"] = {"max_files_per_trigger": files_per_batch}
    return parse_catalog({"version": 1, "streams": [stream]})


def run_once(spark: SparkSession, catalog: Catalog, roots: Roots) -> tuple[float, Any]:
    return run_catalog(spark, catalog, roots, STREAM)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--clean-runs", type=int, default=10000, help="the history of the side with source.clean")
    parser.add_argument("--maintain-every", type=int, default=288)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lock", type=Path, help="a file to flock before the timed rounds, so that jobs sharing the "
                        "machine and the lock (tests, other benches) wait while the history bench measures")
    parser.add_argument("--work", type=Path, help="keep the built histories in this folder and reuse them when "
                        "present (rounds 0: only build); by default a temporary folder, removed at the end")
    args = parser.parse_args()
    if args.work:
        work = args.work.resolve()
        work.mkdir(parents=True, exist_ok=True)
        for scratch in (*work.glob("fresh*"), work / "warmup", *(work / "landing").glob("fresh*"),
                        work / "landing" / "warmup"):
            shutil.rmtree(scratch, ignore_errors=True)  # the fresh sides of an earlier invocation
    else:
        work = Path(tempfile.mkdtemp(prefix="sluice-bench-history-"))
    try:
        spark = local_spark()
        moment = START
        histories = {}
        for side, runs in (("aged", args.runs), ("cleaned", args.clean_runs)):
            if runs:
                histories[side] = History(work, side, clean=side == "cleaned")
                moment = max(moment, histories[side].build(spark, runs, args.maintain_every))
        if args.rounds == 0:
            print(json.dumps({"history_runs": {side: history.built for side, history in histories.items()}}))
            spark.stop()
            return

        def timed(side: str, round_index: int) -> float:
            nonlocal moment
            moment += dt.timedelta(minutes=5)
            if side in histories:
                elapsed, summary = histories[side].run(spark, max(moment, histories[side].moment))
            else:
                name = f"fresh{round_index}"
                land(DemoProducer(work / "landing" / name, seed=round_index), moment)
                fresh = stream_catalog(name)
                elapsed, summary = run_once(spark, fresh, Roots(landing=str(work / "landing"),
                                                                lake=str(work / name / "lake"),
                                                                checkpoints=str(work / name / "checkpoints")))
            if summary.batches != 1:
                raise SystemExit(f"{side}: expected one batch, ran {summary.batches}")
            return elapsed

        if args.lock:
            lock = args.lock.open("a")
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the process ends
        run_once(spark, *_warm_up(work))
        built = {side: history.built for side, history in histories.items()}  # the timed runs add to it
        best = best_of_rounds([*histories, "fresh"], args.rounds, timed)
        names = {"aged": "aged_vs_fresh", "cleaned": "after_10000_vs_fresh"}
        ratios = {names[side]: round(best[side] / best["fresh"], 3) for side in histories}
        for side in histories:
            print(f"a one-file run after {built[side]} runs ({side}): {best[side]:.2f}s; on a fresh stream: "
                  f"{best['fresh']:.2f}s; {ratios[names[side]]:.2f}x (goal <= {GOALS[names[side]]})")
        print(json.dumps({"ratios": ratios, "goals": {key: GOALS[key] for key in ratios},
                          "seconds": {side: round(value, 2) for side, value in best.items()},
                          "history_runs": built,
                          "landing_files": {side: history.landing_files() for side, history in histories.items()}}))
        spark.stop()
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


class History:
    """One aged stream: its landing folder, roots and the runs built behind it."""

    def __init__(self, work: Path, side: str, *, clean: bool) -> None:
        self.landing = work / "landing" / side
        self.roots = Roots(landing=str(work / "landing"), lake=str(work / side / "lake"),
                           checkpoints=str(work / side / "checkpoints"))
        self.builder = stream_catalog(side, files_per_batch=1, clean=clean)
        self.catalog = stream_catalog(side, clean=clean)
        self.side, self.built, self.moment = side, 0, START
        self.state = work / side / "history.json"  # what --work reuses: the runs built and the clock they reached
        if self.state.exists():
            saved = json.loads(self.state.read_text(encoding="utf-8"))
            self.built, self.moment = saved["built"], dt.datetime.fromisoformat(saved["moment"])
        # seeded by the runs built, so that a reused history's new events do not repeat its old ones' ids
        self.producer = DemoProducer(self.landing, seed=3 + self.built, malformed_rate=0.02)
        self.producer.sequence = self.built

    def build(self, spark: SparkSession, runs: int, maintain_every: int) -> dt.datetime:
        """``runs`` one-file batches, in rounds of ``maintain_every`` each followed by the nightly maintenance, with
        Delta's retentions scaled to the round's speed-up over the clock it simulates."""
        started = time.perf_counter()
        while self.built < runs:
            round_started, simulated_from = time.perf_counter(), self.moment
            for _ in range(min(maintain_every, runs - self.built)):
                self.moment += dt.timedelta(minutes=5)
                land(self.producer, self.moment)
            _, summary = run_once(spark, self.builder, self.roots)
            self.built += summary.batches
            speed_up = (self.moment - simulated_from).total_seconds() / (time.perf_counter() - round_started)
            scale_retentions(Path(self.roots.lake), speed_up)
            maintain(self.catalog, self.roots, [STREAM], run_id=f"nightly-{self.built}")
            self.save()
            print(f"{self.side} history: {self.built} runs in {time.perf_counter() - started:.0f}s, maintained, "
                  f"{self.landing_files()} landing files", flush=True)
        scale_retentions(Path(self.roots.lake), 1.0)  # the simulated clock stops here; the wall clock runs on
        return self.moment

    def run(self, spark: SparkSession, moment: dt.datetime) -> tuple[float, Any]:
        self.moment = moment
        land(self.producer, moment)
        result = run_once(spark, self.catalog, self.roots)
        self.built += result[1].batches
        self.save()
        return result

    def save(self) -> None:
        self.state.write_text(json.dumps({"built": self.built, "moment": self.moment.isoformat()}), encoding="utf-8")

    def landing_files(self) -> int:
        return sum(1 for _ in self.landing.rglob("*.json"))


def land(producer: DemoProducer, moment: dt.datetime) -> None:
    """One file of 30 events, written at ``moment``: its modification time is the simulated clock's, so that a history
    spans the weeks it stands for (Spark's ``maxFileAge`` horizon follows the files' times) although it is built in
    an hour. What ages by the wall clock (Delta's retentions) follows through :func:`scale_retentions`."""
    for path in producer.events_file(lines=30, now=moment).files:
        os.utime(path, (moment.timestamp(), moment.timestamp()))


def scale_retentions(lake: Path, speed_up: float) -> None:
    """Set Delta's wall-clock retentions on every table under ``lake`` (the stream's, its dead letters', the run
    log's) to the production defaults divided by ``speed_up``, the simulated seconds per real second of the build."""
    from deltalake import DeltaTable

    properties = {key: f"interval {max(1, round(retention.total_seconds() / speed_up))} seconds"
                  for key, retention in PRODUCTION_RETENTIONS.items()}
    for log in sorted(lake.rglob("_delta_log")):
        table = DeltaTable(str(log.parent))
        if any(table.metadata().configuration.get(key) != value for key, value in properties.items()):
            table.alter.set_table_properties(properties)


def _warm_up(work: Path) -> tuple[Catalog, Roots]:
    """A throwaway stream, so the first timed run does not pay for the JIT and the Python workers."""
    DemoProducer(work / "landing" / "warmup", seed=99).events_file(lines=30, now=START)
    return stream_catalog("warmup"), Roots(landing=str(work / "landing"), lake=str(work / "warmup" / "lake"),
                          checkpoints=str(work / "warmup" / "checkpoints"))


if __name__ == "__main__":
    main()
