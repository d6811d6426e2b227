"""``python -m sluice health [--stream NAME ...]``: each stream's checkpoint report; exit 1 when any is FAIL."""

from __future__ import annotations

import argparse
import json
import sys

from sluice.catalog import load_catalog
from sluice.errors import SluiceError, printable
from sluice.operations.health import Health, check_stream
from sluice.paths import Roots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice health", description="Check streams' checkpoints.")
    parser.add_argument("--stream", action="append", help="default: every stream of the catalog")
    parser.add_argument("--catalog", help="default: SLUICE_CATALOG or the bundled catalog")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON lines")
    args = parser.parse_args(argv)
    try:
        catalog = load_catalog(args.catalog)
        streams = [catalog.get(name) for name in args.stream] if args.stream else list(catalog)
    except SluiceError as exc:
        print(f"error: {printable(str(exc))}", file=sys.stderr)
        return 2
    roots = Roots.from_env()
    failed = False
    for stream in streams:
        report = check_stream(stream, roots)
        failed = failed or report.status is Health.FAIL
        print(json.dumps(report.to_dict(), default=str) if args.json else report.describe())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
