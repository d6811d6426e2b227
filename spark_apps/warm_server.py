"""spark-submit entry point of warm mode: one resident Spark driver that runs catalog streams on request.

    SLUICE_WARM_TOKEN=... spark-submit spark_apps/warm_server.py --catalog include/sluice/streams.yaml \
        --landing-root data/landing --lake-root data/lake --checkpoint-root data/checkpoints \
        [--host 127.0.0.1] [--port 15041]

Prints ``SLUICE_WARM_READY host:port app-id`` once it serves, and serves until SIGTERM (which cancels the runs in
flight). Clients: the stream DAGs' run tasks when the Airflow connection ``sluice_warm`` is defined, and
``python -m sluice warm run --stream NAME``. See :mod:`sluice.warm`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys

from pyspark.sql import SparkSession

from sluice.catalog import load_catalog
from sluice.errors import SluiceError
from sluice.kinds.credentials import airflow_environment
from sluice.paths import Roots
from sluice.warm import DEFAULT_PORT, REQUEST_DEADLINE_SECONDS, TOKEN_ENV, require_token


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="warm_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--catalog", required=True, help="path of the stream catalog (YAML), read again per run")
    parser.add_argument("--landing-root", required=True)
    parser.add_argument("--lake-root", required=True)
    parser.add_argument("--checkpoint-root", required=True)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    parser.add_argument("--request-deadline", type=float, default=REQUEST_DEADLINE_SECONDS,
                        help="seconds a connection has to prove itself and send its request (default: %(default)g)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from sluice_spark.session import configure_sluice
    from sluice_spark.warm import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a line per callback connection, in every run's log
    args = parse_args(argv)
    roots = Roots(landing=args.landing_root, lake=args.lake_root, checkpoints=args.checkpoint_root)
    try:
        # Out of this process's environment, and so out of what its threads' subprocesses inherit. The JVM (and the
        # Python workers it starts) keep the one spark-submit gave them: run the server as a user of its own.
        token = require_token(os.environ.pop(TOKEN_ENV, None))
        catalog = load_catalog(args.catalog)
        catalog.check_roots(roots)
        # The streams' connections from Airflow's, before the Spark workers inherit the environment.
        os.environ.update(airflow_environment(catalog))
    except SluiceError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 2
    spark = configure_sluice(SparkSession.builder.appName("sluice-warm")).getOrCreate()
    try:
        serve(spark, host=args.host, port=args.port, token=token, catalog=os.path.abspath(args.catalog), roots=roots,
              request_deadline=args.request_deadline)
    finally:
        with contextlib.suppress(Exception):  # a SIGTERM to the whole process group stops the JVM as well
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
