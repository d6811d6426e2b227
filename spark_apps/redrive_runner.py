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
import sys

from sluice.constants import REDRIVE_MARKER
from sluice.operations.redrive import parse_request
from sluice_spark import jobs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = jobs.job_arguments("redrive_runner", __doc__.split("\n\n")[0])
    parser.add_argument("--reason")
    parser.add_argument("--since")
    parser.add_argument("--until")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from sluice_spark.redrive import run_redrive

    args = parse_args(argv)
    params = {"stream": args.stream, "reason": args.reason, "since": args.since, "until": args.until,
              "timezone": args.timezone, "dry_run": args.dry_run}
    return jobs.run_job(args, params, name="redrive", marker=REDRIVE_MARKER, parse_request=parse_request,
                        run=run_redrive)


if __name__ == "__main__":
    sys.exit(main())
