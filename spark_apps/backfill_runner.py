"""spark-submit entry point: run one backfill of a catalog stream (see ``sluice.operations.backfill``).

    spark-submit spark_apps/backfill_runner.py --catalog include/sluice/streams.yaml --stream events_bronze \
        --start 2026-11-01T00:00:00Z --end 2026-11-02T00:00:00Z --mode replace [--select-by event_time] \
        [--dry-run] [--max-files-per-trigger N] [--reason TEXT] --run-id ID \
        --landing-root data/landing --lake-root data/lake --checkpoint-root data/checkpoints [--summary-file F]

The params are validated again here, with the same rules as in the DAG. Prints ``SLUICE_BACKFILL_SUMMARY {json}``
on stdout, writes the same JSON to ``--summary-file``, and exits 0 (done), 1 (failed) or 2 (refused).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from sluice.catalog import load_catalog
from sluice.constants import BACKFILL_MARKER, DeltaEngine, RunStatus
from sluice.errors import SluiceError, printable
from sluice.operations.backfill import parse_request
from sluice.paths import Roots
from sluice.storage.lock import LockHeld


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="backfill_runner", description=__doc__.split("\n\n")[0])
    parser.add_argument("--catalog", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--start")
    parser.add_argument("--end")
    parser.add_argument("--start-version", type=int)
    parser.add_argument("--end-version", type=int)
    parser.add_argument("--timezone")
    parser.add_argument("--mode", default="append")
    parser.add_argument("--select-by")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--max-files-per-trigger", type=int)
    parser.add_argument("--reason")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--landing-root", required=True)
    parser.add_argument("--lake-root", required=True)
    parser.add_argument("--checkpoint-root", required=True)
    parser.add_argument("--engine", choices=[engine.value for engine in DeltaEngine])
    parser.add_argument("--lock-wait-seconds", type=float, default=600)
    parser.add_argument("--summary-file")
    return parser.parse_args(argv)


def emit(line_json: str, summary_file: str | None) -> None:
    from sluice.kinds.credentials import scrub_secrets

    line_json = scrub_secrets(line_json)  # an error may quote a credential; the line reaches XCom and the task log
    if summary_file:
        path = Path(summary_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line_json + "\n", encoding="utf-8")
    sys.stdout.flush()  # alone on a fresh buffer, the line reaches the pipe in one write
    print(BACKFILL_MARKER + line_json, flush=True)


def main(argv: list[str] | None = None) -> int:
    import json

    from sluice_spark.session import configure_sluice, preload_session_classes

    preload_session_classes()  # the session's slowest class, on the other core while the catalog loads
    from sluice_spark.backfill import run_backfill

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a line per connection, a preload's among them
    args = parse_args(argv)
    params = {"stream": args.stream, "start": args.start, "end": args.end, "timezone": args.timezone,
              "mode": args.mode, "select_by": args.select_by, "dry_run": args.dry_run,
              "max_files_per_trigger": args.max_files_per_trigger, "reason": args.reason,
              "start_version": args.start_version, "end_version": args.end_version}
    roots = Roots(landing=args.landing_root, lake=args.lake_root, checkpoints=args.checkpoint_root)
    try:
        catalog = load_catalog(args.catalog)
        request = parse_request(params, catalog, run_id=args.run_id)
        catalog.check_roots(roots)
    except SluiceError as exc:
        emit(json.dumps({"stream": args.stream, "status": RunStatus.REFUSED, "error": str(exc), "retryable": False}),
             args.summary_file)
        print(f"sluice: {printable(str(exc))}", file=sys.stderr)
        return 2
    spark = configure_sluice(SparkSession.builder.appName(f"sluice-backfill:{request.stream}")).getOrCreate()
    try:
        engine = DeltaEngine(args.engine) if args.engine else None
        try:
            summary = run_backfill(spark, catalog, request, roots, engine=engine,
                                   lock_wait_seconds=args.lock_wait_seconds)
        except SluiceError as exc:
            emit(json.dumps({"stream": request.stream, "status": RunStatus.FAILED, "error": str(exc),
                             "retryable": isinstance(exc, LockHeld)}), args.summary_file)
            return 1
        emit(summary.to_json(), args.summary_file)
        return 0 if summary.ok else 1
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
