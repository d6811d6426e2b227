"""Group benchmark: five small streams in one Spark application against five applications, one per stream.

Five copies of the bundled ``events_bronze`` stream (its SQL transform, four expectations, the rs Delta engine),
each over its own landing folder with one file of 1,000 events, run by ``spark-submit spark_apps/stream_runner.py``
with ``--master local[*]``, as the group DAG (``group:`` in the catalog) and the ingest DAGs run them:

- ``one_app``: one application with the five ``--stream`` arguments: one JVM start, five queries, each with its
  own lock, checkpoint and summary;
- ``five_apps``: five applications one after another, one stream each.

Every round starts from fresh checkpoints and tables. Rounds alternate the order and keep the best time of each
side, because these machines are shared and noisy. The goal is one_app / five_apps <= 0.4. The last line is the
result as JSON.

    python bench/bench_multi.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from harness import best_of_rounds

from sluice.catalog import DEFAULT_CATALOG
from sluice.cli.demo_producer import DemoProducer
from sluice.constants import SUMMARY_MARKER

PROJECT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STREAMS = [f"small_{index}" for index in range(1, 6)]
GOALS = {"one_app_vs_five_apps": 0.4}


def write_world(folder: Path) -> Path:
    """Five landing folders of one file each, and the catalog of five copies of the bundled bronze stream."""
    bundled = yaml.safe_load(DEFAULT_CATALOG.read_text(encoding="utf-8"))
    template = next(entry for entry in bundled["streams"] if entry["name"] == "events_bronze")
    streams = []
    for index, name in enumerate(STREAMS):
        DemoProducer(folder / "landing" / name, seed=index, malformed_rate=0.01).events_file(
            lines=1000, now=dt.datetime(2026, 11, 23, 9, index, tzinfo=dt.timezone.utc))
        stream = copy.deepcopy(template)
        stream.update(name=name, group="small", checkpoint=f"bronze/{name}",
                      dead_letter={"path": f"bronze/_dead_letter/{name}"})
        stream["source"]["path"] = name
        stream["sink"]["path"] = f"bronze/{name}"
        streams.append(stream)
    catalog = folder / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"version": 1, "streams": streams}), encoding="utf-8")
    return catalog


def submit(catalog: Path, landing: Path, root: Path, names: list[str]) -> list[dict[str, object]]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        [str(BIN / "spark-submit"), "--master", "local[*]", str(PROJECT / "spark_apps" / "stream_runner.py"),
         "--catalog", str(catalog), *(f"--stream={name}" for name in names), "--landing-root", str(landing),
         "--lake-root", str(root / "lake"), "--checkpoint-root", str(root / "checkpoints")],
        env=env, capture_output=True, text=True)
    line = next((line for line in reversed(done.stdout.splitlines()) if line.startswith(SUMMARY_MARKER)), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"spark-submit of {names} failed:\n{done.stderr[-3000:]}")
    streams = json.loads(line[len(SUMMARY_MARKER):])["streams"]
    if any(stream["status"] != "succeeded" or stream["batches"] != 1 for stream in streams):
        raise SystemExit(f"a run did not succeed in one batch: {streams}")
    return list(streams)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="sluice-bench-multi-"))
    try:
        catalog = write_world(folder)

        def run(side: str, round_index: int) -> float:
            root = folder / f"{side}-{round_index}"
            started = time.monotonic()
            if side == "one_app":
                submit(catalog, folder / "landing", root, STREAMS)
            else:
                for name in STREAMS:
                    submit(catalog, folder / "landing", root, [name])
            elapsed = time.monotonic() - started
            shutil.rmtree(root, ignore_errors=True)
            return elapsed

        best = best_of_rounds(["one_app", "five_apps"], args.rounds, run)
        ratio = best["one_app"] / best["five_apps"]
        print(f"5 streams in one application: {best['one_app']:.2f}s; in five: {best['five_apps']:.2f}s; "
              f"{ratio:.2f}x (goal <= {GOALS['one_app_vs_five_apps']})")
        print(json.dumps({"ratios": {"one_app_vs_five_apps": round(ratio, 3)}, "goals": GOALS,
                          "seconds": {side: round(value, 2) for side, value in best.items()}}))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
