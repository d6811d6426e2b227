"""spark-submit entry point: run one backfill of a catalog stream (see ``sluice.operations.backfill``).

    spark-submit spark_apps/backfill_runner.py --catalog include/sluice/streams.yaml --stream events_bronze \
        --start 2026-11-01T00:00:00Z --end 2026-11-02T00:00:00Z --mode replace [--select-by event_time] \
        [--start-version N --end-version M (a Delta source)] [--offsets JSON (a Kafka source)] \
        [--dry-run] [--max-files-per-trigger N] [--reason TEXT] --run-id ID \
        --landing-root data/landing --lake-root data/lake --checkpoint-root data/checkpoints [--summary-file F]

The params are validated again here, with the same rules as in the DAG. Prints ``SLUICE_BACKFILL_SUMMARY {json}``
on stdout, writes the same JSON to ``--summary-file``, and exits 0 (done), 1 (failed) or 2 (refused).
"""

from __future__ import annotations

import argparse
import sys

from sluice.constants import BACKFILL_MARKER
from sluice.operations.backfill import parse_request
from sluice_spark import jobs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = jobs.job_arguments("backfill_runner", __doc__.split("\n\n")[0])
    parser.add_argument("--start")
    parser.add_argument("--end")
    parser.add_argument("--start-version", type=int)
    parser.add_argument("--end-version", type=int)
    parser.add_argument("--offsets", help='a Kafka source\'s offsets, e.g. {"0": [10, 50], "1": [0, 20]}')
    parser.add_argument("--mode", default="append")
    parser.add_argument("--select-by")
    parser.add_argument("--max-files-per-trigger", type=int)
    parser.add_argument("--reason")
    return parser.parse_args(argv)


def emit(line_json: str, summary_file: str | None) -> None:
    jobs.emit(BACKFILL_MARKER, line_json, summary_file)


def main(argv: list[str] | None = None) -> int:
    from sluice_spark.session import preload_session_classes

    preload_session_classes()  # the session's slowest class, on the other core while the catalog loads
    from sluice_spark.backfill import run_backfill

    args = parse_args(argv)
    params = {"stream": args.stream, "start": args.start, "end": args.end, "timezone": args.timezone,
              "mode": args.mode, "select_by": args.select_by, "dry_run": args.dry_run,
              "max_files_per_trigger": args.max_files_per_trigger, "reason": args.reason,
              "start_version": args.start_version, "end_version": args.end_version, "offsets": args.offsets}
    return jobs.run_job(args, params, name="backfill", marker=BACKFILL_MARKER, parse_request=parse_request,
                        run=run_backfill)


if __name__ == "__main__":
    sys.exit(main())
