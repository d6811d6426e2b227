"""``python -m sluice jvm-archive [--force]``: record the Spark driver's class-data-sharing archive for this machine
(see :mod:`sluice.operations.jvm`). ``make venv`` runs it after the install.

The training run is a real Sluice run: the bundled catalog's two bronze streams (JSON and CSV, the rs Delta engine)
over a few demo files in a temporary folder, through ``spark-submit spark_apps/stream_runner.py`` on ``local[2]``.
Exits 0 with the archive's path on stdout, 1 with the reason on stderr (runs then start without an archive, only
slower). Run it again after upgrading Java or reinstalling pyspark: the archive is named by both.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

from sluice.catalog import DEFAULT_CATALOG
from sluice.cli.demo_producer import DemoProducer
from sluice.errors import SluiceError
from sluice.operations.jvm import build_archive, run_group, spark_submit, submit_env
from sluice.operations.loopback import driver_env, submit_args
from sluice.paths import Roots

TRAINING_STREAMS = ("events_bronze", "orders_bronze")
TRAINING_MASTER = "local[2]"


def stream_runner() -> Path:
    spec = find_spec("sluice_spark")
    if spec is None or spec.origin is None:
        raise RuntimeError("cannot locate the sluice_spark package; install the project")
    return Path(spec.origin).parent.parent / "stream_runner.py"


def train(options: list[str], timeout: float) -> str:
    """One small run of the training streams, with ``options`` given to the driver's JVM, within ``timeout``
    seconds; returns what it printed."""
    with tempfile.TemporaryDirectory(prefix="sluice-jvm-training-") as folder:
        roots = Roots(landing=f"{folder}/landing", lake=f"{folder}/lake", checkpoints=f"{folder}/checkpoints")
        DemoProducer(roots.landing, seed=11).produce(files=2, lines=300)
        env = {**os.environ, **submit_env(options), **driver_env(TRAINING_MASTER), "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable}
        done = run_group(
            [spark_submit(), "--master", TRAINING_MASTER, *submit_args(TRAINING_MASTER), "--conf",
             "spark.ui.enabled=false", str(stream_runner()),
             "--catalog", str(DEFAULT_CATALOG), *(f"--stream={name}" for name in TRAINING_STREAMS), *roots.as_args()],
            env=env, timeout=timeout, cwd=folder)
        if done.returncode != 0:
            raise RuntimeError(f"the training run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        return done.stdout + done.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice jvm-archive", description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="record it again even when a usable one exists")
    args = parser.parse_args(argv)
    try:
        archive = build_archive(train, force=args.force)
    except (RuntimeError, OSError, SluiceError) as exc:
        print(f"sluice: no driver archive: {exc}", file=sys.stderr)
        return 1
    print(archive)
    return 0
