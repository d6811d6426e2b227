"""Arrival benchmark: seconds from a file landing to its rows committed, when the stream runs on arrival, against
the cron schedule's best case (a tick at the very moment the file lands), through a running Airflow.

Airflow is `make run` (scheduler, DAG processor, triggerer, API server; the embedded default) on a data root and an
Airflow home of the bench's own, with a catalog of two copies of the bundled ``events_bronze``:

- ``arrival``: ``arrival: {poll: 1s, settle: 1s, max_wait: 10s}`` and no cron. A file lands; the watcher on the
  triggerer sees it, the scheduler starts the DAG (health gate, then the run);
- ``cron_best``: a cron that never comes due; the file lands and the DAG is triggered through the REST API at once,
  which is what a cron tick at the landing moment would do.

Each side lands ``--files`` files, one at a time, each once the previous one is committed (the stream idles between
them, as a landing zone does). The time is from the file's landing to the Delta commit that holds its rows (the
commit's own timestamp in the table's log). Cold: each run starts its Spark application (spark-submit); warm
(``make run WARM=1``): the runs go to one resident driver. The goals are the issue's: the median arrival latency
under 15 s cold and under 5 s warm. The last line is the result as JSON.

    python bench/bench_arrival.py [--files 5] [--no-warm]
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from sluice.catalog import DEFAULT_CATALOG
from sluice.cli.demo_producer import DemoProducer

PROJECT = Path(__file__).resolve().parents[1]
GOALS = {"arrival_cold_median_seconds": 15.0, "arrival_warm_median_seconds": 5.0,
         "arrival_vs_cron_best_cold": None, "arrival_vs_cron_best_warm": None}
NEVER = "0 0 29 2 1"  # a Monday 29 February: years apart


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_catalog(folder: Path) -> Path:
    bundled = yaml.safe_load(DEFAULT_CATALOG.read_text(encoding="utf-8"))
    base = next(entry for entry in bundled["streams"] if entry["name"] == "events_bronze")
    streams = []
    for name, extra in (("arrival", {"arrival": {"poll": "1s", "settle": "1s", "max_wait": "10s"}}),
                        ("cron_best", {"schedule": NEVER})):
        stream = copy.deepcopy(base)
        stream.pop("schedule", None)
        stream.update(name=name, checkpoint=f"bench/{name}", **extra)
        stream["source"]["path"] = name
        stream["sink"]["path"] = f"bench/{name}"
        stream["dead_letter"] = {"path": f"bench/{name}_dead_letter"}
        streams.append(stream)
    path = folder / "catalog.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "streams": streams}, sort_keys=False), encoding="utf-8")
    return path


class Airflow:
    """`make run` (WARM=1 for the warm side) on the bench's folder; the REST API with its token."""

    def __init__(self, folder: Path, catalog: Path, *, warm: bool) -> None:
        self.folder = folder
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        inherited = {name: value for name, value in os.environ.items()
                     if not name.startswith(("AIRFLOW", "SLUICE_", "MAKE")) and name != "MFLAGS"}
        self.env = {**inherited, "AIRFLOW_HOME": str(folder / "airflow"), "SLUICE_DATA_ROOT": str(folder / "data"),
                    "SLUICE_CATALOG": str(catalog)}
        self.log = (folder / "make-run.log").open("wb")
        self.make = subprocess.Popen(
            ["make", "--no-print-directory", "-C", str(PROJECT), "run", f"PORT={self.port}",
             *(["WARM=1"] if warm else [])], env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        self.token = ""
        self._wait(lambda: self._get("/auth/token").get("access_token"), "the API server", 600)
        self.token = self._get("/auth/token")["access_token"]
        for name in ("arrival", "cron_best"):
            self._wait(lambda name=name: self._get(f"/api/v2/dags/ingest_{name}").get("is_paused") is False,
                       f"DAG ingest_{name}", 300)
        self._wait(self._watching, "the triggerer to run the arrival watcher", 300)

    def _wait(self, condition: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.make.poll() is not None:
                raise SystemExit(f"make run exited; see {self.folder / 'make-run.log'}")
            try:
                if condition():
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"timed out waiting for {what}; see {self.folder / 'make-run.log'}")

    def _watching(self) -> bool:
        import sqlite3

        with sqlite3.connect(self.folder / "airflow" / "airflow.db") as connection:
            return bool(connection.execute(
                "SELECT count(*) FROM trigger WHERE classpath LIKE '%StreamArrivalTrigger' "
                "AND triggerer_id IS NOT NULL").fetchone()[0])

    def _get(self, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            self.base + path, data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {self.token}"}
                                                              if self.token else {})})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def trigger(self, dag_id: str) -> None:
        self._get(f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None})

    def stop(self) -> None:
        subprocess.run(["make", "--no-print-directory", "-C", str(PROJECT), "stop"], env=self.env,
                       capture_output=True, timeout=120)
        if self.make.poll() is None:
            os.killpg(self.make.pid, signal.SIGKILL)
        self.make.wait(timeout=60)
        self.log.close()


def commit_times(table: Path) -> list[float]:
    """The timestamps (seconds) of the table's commits that added data, from its JSON log."""
    times = []
    for commit in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
        if any(action.get("add") for action in actions):
            times += [action["commitInfo"]["timestamp"] / 1000 for action in actions if "commitInfo" in action]
    return times


def latencies(airflow: Airflow, side: str, files: int, moment: dt.datetime) -> list[float]:
    data = airflow.folder / "data"
    producer = DemoProducer(data / "landing" / side, seed=len(side), malformed_rate=0.0)
    table = data / "lake" / "bench" / side
    found: list[float] = []
    for index in range(files):
        before = len(commit_times(table)) if table.exists() else 0
        time.sleep(3)  # idle: the watcher has looked at an unchanged landing zone
        landed = time.time()
        producer.events_file(lines=50, now=moment + dt.timedelta(minutes=index))
        if side == "cron_best":
            airflow.trigger(f"ingest_{side}")
        deadline = time.monotonic() + 600
        while not (table.exists() and len(commit_times(table)) > before):
            if time.monotonic() > deadline:
                raise SystemExit(f"{side}: file {index} was not committed within 600 s")
            time.sleep(0.2)
        found.append(commit_times(table)[before] - landed)
        print(f"{side}: file {index + 1} committed {found[-1]:.2f}s after it landed", flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=5, help="files landed per side and mode")
    parser.add_argument("--no-warm", action="store_true", help="leave out make run WARM=1")
    args = parser.parse_args()
    seconds: dict[str, dict[str, list[float]]] = {}
    moment = dt.datetime(2026, 11, 27, 9, tzinfo=dt.timezone.utc)
    for mode in ("cold", *(() if args.no_warm else ("warm",))):
        with tempfile.TemporaryDirectory(prefix=f"sluice-bench-arrival-{mode}-") as tmp:
            folder = Path(tmp)
            airflow = Airflow(folder, write_catalog(folder), warm=mode == "warm")
            try:
                seconds[mode] = {side: latencies(airflow, side, args.files, moment)
                                 for side in ("arrival", "cron_best")}
            finally:
                airflow.stop()
    medians = {mode: {side: round(statistics.median(values), 2) for side, values in sides.items()}
               for mode, sides in seconds.items()}
    ratios: dict[str, float | None] = {}
    for mode, sides in medians.items():
        ratios[f"arrival_{mode}_median_seconds"] = sides["arrival"]
        ratios[f"arrival_vs_cron_best_{mode}"] = round(sides["arrival"] / sides["cron_best"], 3)
    print(json.dumps({"files": args.files, "median_seconds": medians, "ratios": ratios,
                      "goals": {key: GOALS[key] for key in ratios}}))


if __name__ == "__main__":
    main()
