"""``python -m sluice maintain [--stream NAME ...]``: compact, vacuum, checkpoint and clean the Delta tables of the
named streams, or of every stream and the run log (see :mod:`sluice.operations.maintenance`); the report as JSON."""

from __future__ import annotations

import argparse
import json
import sys

from sluice.catalog import load_catalog
from sluice.errors import SluiceError, printable
from sluice.operations.maintenance import maintain
from sluice.paths import Roots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice maintain", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--stream", action="append", default=[], help="a catalog stream (repeat); default: all, and "
                                                                      "the run log")
    parser.add_argument("--vacuum-retention-hours", type=float,
                        help="keep removed files this long; default and minimum: each table's "
                             "delta.deletedFileRetentionDuration (7 days when unset)")
    parser.add_argument("--dry-run", action="store_true", help="report what would be vacuumed; change nothing")
    parser.add_argument("--catalog", help="default: SLUICE_CATALOG or the bundled catalog")
    args = parser.parse_args(argv)
    try:
        catalog = load_catalog(args.catalog)
        roots = Roots.from_env()
        catalog.check_roots(roots)
        report = maintain(catalog, roots, args.stream, vacuum_retention_hours=args.vacuum_retention_hours,
                          dry_run=args.dry_run)
    except SluiceError as exc:
        print(f"refused: {printable(str(exc))}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
