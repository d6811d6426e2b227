"""spark-submit entry point: run one or more catalog streams with trigger(availableNow=True).

    spark-submit spark_apps/stream_runner.py --catalog include/sluice/streams.yaml --stream events_bronze \
        --landing-root data/landing --lake-root data/lake --checkpoint-root data/checkpoints \
        [--summary-file out.json] [--run-id ID] [--engine auto|jvm|rs]

Prints one line ``SLUICE_RUN_SUMMARY {json}`` on stdout, writes the same JSON to ``--summary-file``, and exits
non-zero when any stream failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pyspark.sql import SparkSession

from sluice.constants import DeltaEngine, RunStatus
from sluice.errors import SluiceError
from sluice.paths import Roots
from sluice.summary import PhaseClock, RunSummary, StreamRunSummary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="stream_runner", description=__doc__.split("\n\n")[0])
    parser.add_argument("--catalog", required=True, help="path of the stream catalog (YAML)")
    parser.add_argument("--stream", action="append", required=True, dest="streams",
                        help="a catalog stream to run; repeat to run several in one application")
    parser.add_argument("--landing-root", required=True)
    parser.add_argument("--lake-root", required=True)
    parser.add_argument("--checkpoint-root", required=True)
    parser.add_argument("--summary-file", help="also write the run summary JSON here")
    parser.add_argument("--run-id", help="recorded in every Delta commit of this run (default: a new uuid)")
    parser.add_argument("--engine", choices=[engine.value for engine in DeltaEngine],
                        help="override the catalog's sink.engine for every stream")
    return parser.parse_args(argv)


def emit(summary: RunSummary, summary_file: str | None) -> None:
    from sluice.kinds.credentials import scrub_secrets
    from sluice_spark.runner import scrubbed

    summary = scrubbed(summary)
    if summary_file:
        path = Path(summary_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(scrub_secrets(summary.to_json()) + "\n", encoding="utf-8")
    sys.stdout.flush()  # alone on a fresh buffer, the line reaches the pipe in one write
    print(scrub_secrets(summary.to_line()), flush=True)


def main(argv: list[str] | None = None) -> int:
    clock = PhaseClock()
    from sluice_spark.session import activate, configure_sluice, preload_session_classes

    preload_session_classes()  # the session's slowest class, on the other core while the catalog loads
    from sluice.catalog import load_catalog

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a line per connection, a preload's among them
    args = parse_args(argv)
    roots = Roots(landing=args.landing_root, lake=args.lake_root, checkpoints=args.checkpoint_root)
    try:
        catalog = load_catalog(args.catalog)
        catalog.select(args.streams)  # refuse unknown streams, and overlapping folders, before a SparkContext starts
        catalog.check_roots(roots)
    except SluiceError as exc:
        emit(RunSummary(None, [StreamRunSummary(stream=name, status=RunStatus.FAILED, error=str(exc), retryable=False)
                               for name in args.streams]), args.summary_file)
        print(f"sluice: {exc}", file=sys.stderr)
        return 2
    clock.lap("catalog")
    # The SparkContext starts on a thread while the runner's modules import (pyspark's functions, delta-rs, pyarrow:
    # half a second of Python): the JVM builds it on the other core. Only once the catalog is checked, so that a
    # refused run starts no application.
    builder = configure_sluice(SparkSession.builder.appName(f"sluice:{','.join(args.streams)}"))
    with ThreadPoolExecutor(1, thread_name_prefix="sluice-session") as pool:
        starting = pool.submit(builder.getOrCreate)
        from sluice_spark.runner import run_or_refuse
        spark = starting.result()
    activate(spark)  # the JVM keeps its active session per thread: the one that built it was the pool's
    clock.lap("session")
    try:
        engine = DeltaEngine(args.engine) if args.engine else None
        summary = run_or_refuse(spark, catalog, args.streams, roots, run_id=args.run_id, engine=engine, clock=clock)
        emit(summary, args.summary_file)
        for stream in summary.streams:
            logging.info("stream %s: %s", stream.stream, json.dumps(stream.__dict__, default=str))
        return 0 if summary.ok else 1
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
