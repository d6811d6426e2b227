"""``python -m sluice redrive --stream NAME``: send a stream's dead letters again through its current definition,
exactly once (see :mod:`sluice.operations.redrive`); a dry run by default counts what would land.

The params are checked here first, without Spark (a refusal names the field and exits 2); then one local Spark
application (``spark_apps/redrive_runner.py``) runs the redrive on the deployment's roots (``SLUICE_*_ROOT``). A redrive
that was interrupted is finished by running it again with its ``--run-id``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

from sluice.catalog import DEFAULT_CATALOG, load_catalog
from sluice.constants import REDRIVE_MARKER
from sluice.errors import SluiceError, printable
from sluice.operations.redrive import parse_request
from sluice.paths import Roots

MASTER = "local[2]"


def redrive_runner() -> Path:
    spec = find_spec("sluice_spark")
    if spec is None or spec.origin is None:
        raise RuntimeError("cannot locate the sluice_spark package; install the project")
    return Path(spec.origin).parent.parent / "redrive_runner.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice redrive", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stream", required=True)
    parser.add_argument("--reason", help="only dead letters whose reason starts with this text")
    parser.add_argument("--since", help="only dead letters ingested at or after this ISO 8601 time")
    parser.add_argument("--until", help="only dead letters ingested before this ISO 8601 time")
    parser.add_argument("--timezone", help="the IANA zone of --since and --until without an offset")
    parser.add_argument("--dry-run", action="store_true", help="judge the rows and report; commit nothing")
    parser.add_argument("--run-id", help="the redrive's id (default: cli-<UTC time>); give an unfinished one's to "
                                         "finish it")
    parser.add_argument("--catalog", help="default: SLUICE_CATALOG or the bundled catalog")
    args = parser.parse_args(argv)
    run_id = args.run_id or time.strftime("cli-%Y%m%dT%H%M%SZ", time.gmtime())
    catalog_path = args.catalog or os.environ.get("SLUICE_CATALOG") or str(DEFAULT_CATALOG)
    params = {"stream": args.stream, "reason": args.reason, "since": args.since, "until": args.until,
              "timezone": args.timezone, "dry_run": args.dry_run}
    try:
        request = parse_request(params, load_catalog(catalog_path), run_id=run_id)
    except SluiceError as exc:
        print(f"refused: {printable(str(exc))}", file=sys.stderr)
        return 2
    from sluice.operations.jars import submit_args
    from sluice.operations.jvm import spark_submit
    from sluice.operations.loopback import driver_env
    from sluice.operations.loopback import submit_args as loopback_args

    command = [spark_submit(), "--master", MASTER, *submit_args(), *loopback_args(MASTER), "--conf",
               "spark.ui.enabled=false", str(redrive_runner()), "--catalog", catalog_path, *request.to_args(),
               *Roots.from_env().as_args()]
    env = {**os.environ, **driver_env(MASTER), "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith(REDRIVE_MARKER)]
    if not lines:
        print(done.stderr[-4000:], file=sys.stderr)
        return done.returncode or 1
    summary = json.loads(lines[-1][len(REDRIVE_MARKER):])
    print(json.dumps(summary, indent=2, sort_keys=True))
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
