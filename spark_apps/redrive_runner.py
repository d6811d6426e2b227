"""spark-submit entry point: redrive the dead letters of a catalog stream (see ``sluice.operations.redrive``).

    spark-submit spark_apps/redrive_runner.py --catalog include/sluice/streams.yaml --stream events_bronze \
        [--reason TEXT] [--since 2026-11-01T00:00:00Z] [--until 2026-11-02T00:00:00Z] [--timezone ZONE] \
        [--dry-run] --run-id ID --landing-root data/landing --lake-root data/lake --checkpoint-root data/checkpoints \
        [--summary-file F]

The params are validated again here, with the same rules as in the DAG. Prints ``SLUICE_REDRIVE_SUMMARY {json}`` on
stdout, writes the same JSON to ``--summary-file``, and exits 0 (done), 1 (failed) or 2 (refused).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from sluice.catalog import load_catalog
from sluice.constants import REDRIVE_MARKER, DeltaEngine, RunStatus
from sluice.errors import SluiceError, printable
from sluice.operations.redrive import parse_request
from sluice.paths import Roots
from sluice.storage.lock import LockHeld


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="redrive_runner", description=__doc__.split("\n\n")[0])
    parser.add_argument("--catalog", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--reason")
    parser.add_argument("--since")
    parser.add_argument("--until")
    parser.add_argument("--timezone")
    parser.add_argument("--dry-run", action="store_true")
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
    sys.stdout.flush()
    print(REDRIVE_MARKER + line_json, flush=True)


def main(argv: list[str] | None = None) -> int:
    from sluice_spark.redrive import run_redrive
    from sluice_spark.session import configure_sluice

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    args = parse_args(argv)
    params = {"stream": args.stream, "reason": args.reason, "since": args.since, "until": args.until,
              "timezone": args.timezone, "dry_run": args.dry_run}
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
    spark = configure_sluice(SparkSession.builder.appName(f"sluice-redrive:{request.stream}")).getOrCreate()
    try:
        engine = DeltaEngine(args.engine) if args.engine else None
        try:
            summary = run_redrive(spark, catalog, request, roots, engine=engine,
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
