"""``python -m sluice warm run --stream NAME ... | ping``: warm mode from the command line (see :mod:`sluice.warm`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from sluice.constants import DeltaEngine
from sluice.errors import SluiceError
from sluice.paths import Roots
from sluice.warm import BUNDLED_CATALOG, WarmAddress, WarmServerGone, ping, run


def main(argv: list[str] | None = None) -> int:
    """A run on the warm server, with the address and token from ``SLUICE_WARM_ADDRESS`` and ``SLUICE_WARM_TOKEN``,
    the catalog and roots from the environment as for every command. Prints the summary line as ``stream_runner.py``
    does and exits as it does: 0, 1 when a stream failed, 2 when refused, 3 when the server is gone (retryable)."""
    parser = argparse.ArgumentParser(prog="python -m sluice warm", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="run streams on the warm server")
    run_parser.add_argument("--stream", action="append", required=True, dest="streams")
    run_parser.add_argument("--catalog", default=os.environ.get("SLUICE_CATALOG") or str(BUNDLED_CATALOG))
    run_parser.add_argument("--run-id")
    run_parser.add_argument("--engine", choices=[engine.value for engine in DeltaEngine])
    run_parser.add_argument("--summary-file")
    commands.add_parser("ping", help="check that the warm server answers")
    args = parser.parse_args(argv)
    try:
        address = WarmAddress.from_env()
        if args.command == "ping":
            print(json.dumps(ping(address), sort_keys=True))
            return 0
        summary = run(address, args.streams, catalog=args.catalog, roots=Roots.from_env(), run_id=args.run_id,
                      engine=args.engine, on_log=lambda line: print(line, file=sys.stderr, flush=True))
    except WarmServerGone as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 3
    except SluiceError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 2
    if args.summary_file:
        Path(args.summary_file).write_text(summary.to_json() + "\n", encoding="utf-8")
    print(summary.to_line(), flush=True)
    return 0 if summary.ok else 1
