"""``python -m sluice repair <action> --stream NAME``: one explicit checkpoint repair (see
:mod:`sluice.operations.repair`), its result as JSON."""

from __future__ import annotations

import argparse
import json
import sys

from sluice.catalog import load_catalog
from sluice.errors import SluiceError, printable
from sluice.operations import repair
from sluice.operations.repair import ACTIONS, run_action
from sluice.paths import Roots


def main(argv: list[str] | None = None) -> int:
    description = (repair.__doc__ or "").split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m sluice repair", description=description)
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--version", type=int, help="reset: the sink table's Delta version to resume after")
    parser.add_argument("--catalog", help="default: SLUICE_CATALOG or the bundled catalog")
    args = parser.parse_args(argv)
    try:
        stream = load_catalog(args.catalog).get(args.stream)
        result = run_action(args.action, stream, Roots.from_env(), version=args.version)
    except SluiceError as exc:
        print(f"refused: {printable(str(exc))}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
