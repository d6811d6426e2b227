"""Arrival benchmark: seconds from a file landing to its rows committed, when the stream runs on arrival, against
the cron schedule's best case (a tick at the very moment the file lands), through a running Airflow.

Airflow is `make run` (scheduler, DAG processor, triggerer, API server; the embedded default) on a data root and an
Airflow home of the bench's own, with a catalog of two copies of the bundled ``events_bronze``:

- ``arrival``: ``arrival: {poll: 1s, settle: 1s, max_wait: 10s}`` and no cron. A file lands; the watcher on the
  triggerer sees it, the scheduler starts the DAG (its run task checks health first: ``health_gate: inline``, the
  default of a stream on arrival);
- ``cron_best``: a cron that never comes due, and the same DAG (``health_gate: inline``); the file lands and the
  DAG is triggered through the REST API at once, which is what a cron tick at the landing moment would do.

Both write with the ``rs`` engine (``--engine``; with the bundled stream's ``auto``, the ``arrival`` side is ``rs``
too, as ``auto`` is for a text append on arrival, and ``cron_best`` the JVM's delta-spark wherever its jars load):
a one-file run takes the small-run paths (the driver's write, the light JIT), which only ``rs`` has, and
delta-spark's first commit to a table in a fresh JVM (each cold run's) costs 10 to 18 s more on two cores (bench run
of 2026-11-28; docs/guides/scheduling.md).

Each side lands ``--files`` files, one at a time, each once the previous one is committed and its run has ended
(the stream idles between them, as a landing zone does). The time is from the file's landing to the Delta commit
that holds its rows (the commit's own timestamp in the table's log). Cold: each run starts its Spark application
(spark-submit); warm (``make run WARM=1``): the runs go to one resident driver. The goals are the issue's: the median
arrival latency under 15 s cold and under 5 s warm. Before the result, a table of where the seconds went, stage by
stage (:data:`STAGES`, from the Airflow DB, the triggerer's log lines and the task logs); the last line is the
result as JSON.

    python bench/bench_arrival.py [--files 5] [--no-warm] [--engine rs] [--keep FOLDER]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as dt
import json
import os
import re
import signal
import socket
import sqlite3
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
NEVER = "0 0 29 2 1"  # 29 February or a Monday of February (cron ORs the days): no tick during a bench


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_catalog(folder: Path, engine: str) -> Path:
    bundled = yaml.safe_load(DEFAULT_CATALOG.read_text(encoding="utf-8"))
    base = next(entry for entry in bundled["streams"] if entry["name"] == "events_bronze")
    streams = []
    for name, extra in (("arrival", {"arrival": {"poll": "1s", "settle": "1s", "max_wait": "10s"}}),
                        ("cron_best", {"schedule": NEVER, "health_gate": "inline"})):
        stream = copy.deepcopy(base)
        stream.pop("schedule", None)
        stream.update(name=name, checkpoint=f"bench/{name}", **extra)
        stream["source"]["path"] = name
        stream["sink"]["path"] = f"bench/{name}"
        stream["dead_letter"] = {"path": f"bench/{name}_dead_letter"}
        stream["sink"]["engine"] = engine
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
        with contextlib.closing(self.db()) as connection:
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

    def idle(self, dag_id: str) -> None:
        """Until no run of the DAG is queued or running (the one at start-up, the one that committed the last
        file): a file lands on an idle stream, as the bench means to measure, not behind a run still ending."""
        self._wait(lambda: not self._get(f"/api/v2/dags/{dag_id}/dagRuns?state=queued&state=running")["dag_runs"],
                   f"{dag_id} to be idle", 600)

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self.folder / 'airflow' / 'airflow.db'}?mode=ro", uri=True)

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


def latencies(airflow: Airflow, side: str, files: int, moment: dt.datetime) -> list[tuple[float, float]]:
    """Each file's landing and the commit of its rows (seconds since the epoch)."""
    data = airflow.folder / "data"
    producer = DemoProducer(data / "landing" / side, seed=len(side), malformed_rate=0.0)
    table = data / "lake" / "bench" / side
    found: list[tuple[float, float]] = []
    for index in range(files):
        airflow.idle(f"ingest_{side}")
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
        found.append((landed, commit_times(table)[before]))
        print(f"{side}: file {index + 1} committed {found[-1][1] - landed:.2f}s after it landed", flush=True)
    return found


STAGES = {
    "land_to_fired": "the watcher sees the file, and it settles (arrival)",
    "fired_to_event": "the triggerer stores the asset event (arrival)",
    "to_dag_run": "the scheduler creates the DAG run (from the event, or the REST call)",
    "dag_run_to_queued": "the first task queued",
    "queued_to_process": "the executor starts the task process",
    "gate_task": "the gate as a task of its own, until the run task's process starts",
    "process_to_spark": "the run task parses its DAG, checks health, calls Spark",
    "spark_to_commit": "spark-submit (cold) or the warm server's run, to the Delta commit",
}


def _utc(text: str) -> float:
    """Seconds since the epoch of a UTC time as the Airflow DB (naive) or a task log (ISO, Z) writes it."""
    moment = dt.datetime.fromisoformat(text.replace("Z", "").replace("T", " ").split("+")[0])
    return moment.replace(tzinfo=dt.timezone.utc).timestamp()


def _task_log(folder: Path, dag_id: str, run_id: str, task_id: str) -> list[tuple[float, str]]:
    lines = []
    for path in sorted((folder / "airflow" / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" /
                        f"task_id={task_id}").glob("attempt=*.log"))[:1]:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                record = json.loads(line)
                lines.append((_utc(record["timestamp"]), str(record.get("event", ""))))
    return lines


def stages(airflow: Airflow, side: str, landings: list[tuple[float, float]]) -> list[dict[str, float]]:
    """Where each file's seconds went, stage by stage (:data:`STAGES`), from the Airflow DB, the triggerer's lines
    in the make run log and the task logs. A stage that could not be timed is left out."""
    dag_id = f"ingest_{side}"
    fired_at = [_utc(match.group(1)) for match in re.finditer(
        rf"triggerer\s+\| (\S+) \[info\s*\] Stream {side}: \d+ new unread",
        (airflow.folder / "make-run.log").read_text(encoding="utf-8", errors="replace"))]
    found = []
    with contextlib.closing(airflow.db()) as db:
        runs = [(key, run_id, _utc(queued)) for key, run_id, queued in db.execute(
            "SELECT id, run_id, queued_at FROM dag_run WHERE dag_id = ? ORDER BY queued_at", (dag_id,))]
        for landed, committed in landings:
            run = next((run for run in runs if landed <= run[2] <= committed), None)
            if run is None:
                continue
            key, run_id, created = run
            marks = {"landed": landed, "created": created, "committed": committed}
            event = db.execute("SELECT e.timestamp FROM asset_event e JOIN dagrun_asset_event d ON d.event_id = e.id "
                               "WHERE d.dag_run_id = ? ORDER BY e.id", (key,)).fetchone()
            if event is not None:
                marks["event"] = _utc(event[0])
                marks["fired"] = max((at for at in fired_at if landed <= at <= marks["event"] + 0.01), default=landed)
            tasks = db.execute("SELECT task_id, queued_dttm FROM task_instance WHERE dag_id = ? AND run_id = ? "
                               "AND queued_dttm IS NOT NULL ORDER BY queued_dttm", (dag_id, run_id)).fetchall()
            if tasks:
                marks["queued"] = _utc(tasks[0][1])
                first = _task_log(airflow.folder, dag_id, run_id, tasks[0][0])
                run_log = _task_log(airflow.folder, dag_id, run_id, "run_stream")
                if first and run_log:
                    marks["process"], marks["run_process"] = first[0][0], run_log[0][0]
                    calls = [at for at, event in run_log if event.startswith("Spark-Submit cmd")
                             or (event.startswith("Running ") and "on the warm server" in event)]
                    if calls:
                        marks["spark"] = calls[0]
            found.append(_deltas(marks))
    return found


def _deltas(marks: dict[str, float]) -> dict[str, float]:
    pairs = {"land_to_fired": ("landed", "fired"), "fired_to_event": ("fired", "event"),
             "to_dag_run": ("event" if "event" in marks else "landed", "created"),
             "dag_run_to_queued": ("created", "queued"), "queued_to_process": ("queued", "process"),
             "gate_task": ("process", "run_process"), "process_to_spark": ("run_process", "spark"),
             "spark_to_commit": ("spark", "committed")}
    return {stage: round(marks[end] - marks[start], 2) for stage, (start, end) in pairs.items()
            if start in marks and end in marks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=5, help="files landed per side and mode")
    parser.add_argument("--no-warm", action="store_true", help="leave out make run WARM=1")
    parser.add_argument("--engine", choices=("auto", "jvm", "rs"), default="rs",
                        help="the sinks' Delta engine (auto: the bundled stream's)")
    parser.add_argument("--keep", type=Path, help="keep each mode's Airflow home, data and logs under this folder")
    args = parser.parse_args()
    seconds: dict[str, dict[str, list[float]]] = {}
    timed: dict[str, dict[str, dict[str, float]]] = {}
    moment = dt.datetime(2026, 11, 27, 9, tzinfo=dt.timezone.utc)
    for mode in ("cold", *(() if args.no_warm else ("warm",))):
        with tempfile.TemporaryDirectory(prefix=f"sluice-bench-arrival-{mode}-") as tmp:
            folder = Path(tmp) if args.keep is None else args.keep / mode
            folder.mkdir(parents=True, exist_ok=True)
            airflow = Airflow(folder, write_catalog(folder, args.engine), warm=mode == "warm")
            try:
                seconds[mode], timed[mode] = {}, {}
                for side in ("arrival", "cron_best"):
                    landings = latencies(airflow, side, args.files, moment)
                    seconds[mode][side] = [committed - landed for landed, committed in landings]
                    per_file = stages(airflow, side, landings)
                    timed[mode][side] = {stage: round(statistics.median(row[stage] for row in per_file
                                                                        if stage in row), 2)
                                         for stage in STAGES if any(stage in row for row in per_file)}
            finally:
                airflow.stop()
    print("median seconds per stage (" + ", ".join(f"{mode} {side}" for mode in timed for side in timed[mode]) + ")")
    for stage, what in STAGES.items():
        cells = [f"{timed[mode][side].get(stage, '-'):>6}" for mode in timed for side in timed[mode]]
        print(f"  {stage:<18} {' '.join(cells)}  {what}")
    medians = {mode: {side: round(statistics.median(values), 2) for side, values in sides.items()}
               for mode, sides in seconds.items()}
    ratios: dict[str, float | None] = {}
    for mode, sides in medians.items():
        ratios[f"arrival_{mode}_median_seconds"] = sides["arrival"]
        ratios[f"arrival_vs_cron_best_{mode}"] = round(sides["arrival"] / sides["cron_best"], 3)
    print(json.dumps({"files": args.files, "engine": args.engine, "median_seconds": medians,
                      "ratios": ratios, "goals": {key: GOALS[key] for key in ratios},
                      "stages_median_seconds": timed}))


if __name__ == "__main__":
    main()
