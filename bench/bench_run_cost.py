"""Run-cost benchmark: what one small scheduled run costs, from plain Spark to a DAG run through a scheduler.

One run of the bundled ``events_bronze`` stream (its SQL transform and four expectations, the rs Delta engine) over
3 files of 3,270 JSON events each (about 10,000 rows with the demo producer's duplicates), a fresh stream every
time, each of these ways, in one run of this script:

- ``spark``: the floor. A fresh ``spark-submit`` of ``readStream.json(...).writeStream.parquet(...)`` with
  availableNow over the same files, with the same schema;
- ``spark_same_jvm``: the floor again, its driver JVM started with the options Sluice gives its own (below): what
  those options alone buy plain Spark; Sluice bare against it (``bare_vs_spark_same_jvm``) is Sluice's own work on
  equal terms;
- ``bare``: ``spark-submit spark_apps/stream_runner.py --stream events_bronze`` as the operator launches it: the
  driver JVM with the class archive of ``python -m sluice jvm-archive`` and, for this small run, the light JIT
  (:mod:`sluice.operations.jvm`), and Sluice's own JVM classes with their session extension (``spark_conf`` of the
  ``sluice`` jar set: the drift check the bundled stream's ``rescue`` runs in Java, without which it falls back to
  column expressions). Not the connectors' jars (delta-spark, Kafka, s3a), which this stream on the rs engine does
  not use. A small run: its batch is collected to the driver and appended there;
- ``bare_executors``: the same with ``SLUICE_DRIVER_WRITE_MAX_BYTES=0``: the executors' Python data source writes
  it, as for a large run (for comparison; no goal);
- ``dag``: ``airflow dags test ingest_events_bronze`` (the health gate, then the run through the operator);
- ``scheduler``: a running scheduler, DAG processor and API server, with the scheduler's idle sleep Sluice deploys;
  the run triggered through the REST API, timed to the success Airflow records (the DAG run's ``end_date``);
- ``scheduler_inline``: the same for a copy of the stream with ``health_gate: inline`` (its own tables): one task
  that checks the checkpoint, then runs;
- ``warm``: warm mode. A warm server (``spark_apps/warm_server.py``) is started once, before the rounds and outside
  the timing; each round times a fresh ``python -m sluice warm run --stream events_bronze`` process, from its start
  to its exit.

Every side uses ``--master local[*]`` and its own data root (the two scheduler sides share one), emptied of tables
and checkpoints before each round.
Rounds alternate the order of the sides and the best time of each is kept, because these machines are shared and
noisy. Then the phases of the bare run (Sluice's own timings from the run summary, Spark's from the progress
reports in the run log) and of the DAG run (its task instances) are printed. The driver JVM options are printed first.

Goals: bare / spark <= 1.15, a DAG run (each way) / bare <= 1.15 and warm / spark <= 0.25. The last line is the
result as JSON.

    python bench/bench_run_cost.py [--rounds 3] [--no-scheduler] [--no-warm] [--sides bare,spark_same_jvm]

``--sides`` runs only the sides it names (for a quick look at one ratio, e.g. ``bare,spark_same_jvm``); the ratios
of the sides left out are not printed, and the default is every side.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import secrets
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from harness import best_of_rounds

from sluice.catalog import DEFAULT_CATALOG, load_catalog
from sluice.cli.demo_producer import EVENT_SCHEMA, DemoProducer
from sluice.cli.devserver import warm_jvm_environment
from sluice.constants import SUMMARY_MARKER
from sluice.operations.jars import SLUICE_SET, jar_paths, spark_conf
from sluice.operations.jvm import archive_refusal, driver_java_options, small_run, submit_env
from sluice.paths import Roots

PROJECT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STREAM = "events_bronze"
DAG_ID = f"ingest_{STREAM}"
INLINE_STREAM = f"{STREAM}_inline"  # the same stream with the health check in its run task
FILES, LINES = 3, 3270
# What the operator gives every application of Sluice's own (its drift classes and session extension), as arguments.
SLUICE_CONF = [arg for key, value in spark_conf(jars=jar_paths(SLUICE_SET)).items()
               for arg in ("--conf", f"{key}={value}")]
# Never: Feb 29 at midnight, last before the DAGs' start date, next in 2028. Only the bench triggers the DAG.
NO_SCHEDULE = "0 0 29 2 *"
# The scheduler's sleep between idle loops, as Sluice deploys it (the Makefile and the compose file;
# docs/performance/cost.md).
SCHEDULER_IDLE_SLEEP_TIME = "0.5"
# A DAG run is timed two ways: `airflow dags test` (which parses the DAG folder first) and a running scheduler.
# `dags test`'s own start-up is Airflow's: its ratio is printed without a goal (null).
SIDES = ("spark", "spark_same_jvm", "bare", "bare_executors", "dag", "scheduler", "scheduler_inline", "warm")
GOALS: dict[str, float | None] = {
    "bare_vs_spark": 1.15, "bare_vs_spark_same_jvm": 1.15, "dag_vs_bare": None, "scheduler_vs_bare": 1.15,
    "scheduler_inline_vs_bare": 1.15, "warm_vs_spark": 0.10}

FLOOR = '''
import sys
from pyspark.sql import SparkSession

landing, out, checkpoint, schema = sys.argv[1:5]
spark = SparkSession.builder.appName("plain-spark-floor").getOrCreate()
(spark.readStream.schema(schema).option("recursiveFileLookup", "true").option("pathGlobFilter", "*.json")
 .json(landing).writeStream.format("parquet").option("checkpointLocation", checkpoint)
 .trigger(availableNow=True).start(out).awaitTermination())
spark.stop()
'''


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class World:
    """The files, a catalog with the bundled stream (never scheduled), one data root per side, an Airflow home."""

    def __init__(self, folder: Path, *, airflow: bool = True) -> None:
        self.folder = folder
        self.landing = folder / "landing"
        producer = DemoProducer(self.landing, seed=7, malformed_rate=0.01)
        for minute in range(FILES):
            producer.events_file(lines=LINES, now=_moment(minute))
        self.bytes = sum(path.stat().st_size for path in self.landing.rglob("*.json"))
        catalog = yaml.safe_load(DEFAULT_CATALOG.read_text(encoding="utf-8"))
        stream = next(entry for entry in catalog["streams"] if entry["name"] == STREAM)
        # The rs engine, as the docstring says: the bundled `auto` is the JVM's writer where delta-spark's jars load,
        # and whether they load depends on the side's spark-submit (the operators pass them, a bare submit does not).
        stream = {**stream, "sink": {**stream["sink"], "engine": "rs"}}
        self.catalog = folder / "catalog.yaml"
        inline = {**stream, "name": INLINE_STREAM, "health_gate": "inline", "checkpoint": "bronze/inline",
                  "sink": {**stream["sink"], "path": "bronze/inline"},
                  "dead_letter": {"path": "bronze/_dead_letter/inline"}}
        self.catalog.write_text(yaml.safe_dump({"version": 1, "streams": [{**stream, "schedule": NO_SCHEDULE},
                                                                          {**inline, "schedule": NO_SCHEDULE}]}),
                                encoding="utf-8")
        self.floor = folder / "floor.py"
        self.floor.write_text(FLOOR, encoding="utf-8")
        self.port = free_port()
        self.home = folder / "airflow"  # the running scheduler's
        self.env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(48),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.port}/execution/",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "5",
            # As `make run` and the compose file set it (tests/unit/test_compose.py holds the three to one value).
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": SCHEDULER_IDLE_SLEEP_TIME,
            "SLUICE_CATALOG": str(self.catalog),
            "SLUICE_LANDING_ROOT": str(self.landing),
            "PYTHONUNBUFFERED": "1",
        }
        # `airflow dags test` gets a metadata database of its own: in the running scheduler's, the scheduler would
        # queue the test run's tasks too, and race the command that runs them in its own process.
        self.dags_test_home = folder / "airflow-dags-test"
        for home in (self.home, self.dags_test_home) if airflow else ():
            subprocess.run([str(BIN / "airflow"), "db", "migrate"], env={**self.env, "AIRFLOW_HOME": str(home)},
                           check=True, capture_output=True)

    def root(self, side: str) -> Path:
        """The side's data root, without the tables and checkpoints of its last run: every run is a fresh stream."""
        root = self.folder / side
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        return root

    def side_env(self, root: Path) -> dict[str, str]:
        return {**self.env, "SLUICE_LAKE_ROOT": str(root / "lake"), "SLUICE_CHECKPOINT_ROOT": str(root / "checkpoints")}

    def spark_submit(self, *args: str, env: dict[str, str] | None = None, java_options: Sequence[str] = ()) -> str:
        env = env or self.env
        done = subprocess.run([str(BIN / "spark-submit"), "--master", "local[*]", *args],
                              env={**env, **submit_env(java_options, env)}, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"spark-submit {args[0]} failed:\n{done.stderr[-3000:]}")
        return done.stdout


def _moment(minute: int) -> dt.datetime:
    return dt.datetime(2026, 11, 23, 9, minute, tzinfo=dt.timezone.utc)


class Scheduler:
    """Airflow's scheduler, DAG processor and API server on the world's Airflow home; DAG runs through the REST API."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.base = f"http://127.0.0.1:{world.port}"
        self.env = world.side_env(world.folder / "scheduler")
        logs = world.folder / "scheduler-logs"
        logs.mkdir(exist_ok=True)
        self.processes = [
            subprocess.Popen([str(BIN / "airflow"), component], env=self.env, stdin=subprocess.DEVNULL,
                             stdout=(logs / f"{component}.log").open("wb"), stderr=subprocess.STDOUT,
                             start_new_session=True)
            for component in ("api-server", "scheduler", "dag-processor")
        ]
        self.token = ""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                self.token = self.call("GET", "/auth/token")["access_token"]
                if all(self.call("GET", f"/api/v2/dags/ingest_{name}").get("is_paused") is False
                       for name in (STREAM, INLINE_STREAM)):
                    return
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"Airflow did not serve both DAGs unpaused within 300 s; see {logs}")

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            self.base + path, method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {self.token}"}
                                                              if self.token else {})})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def run(self, stream: str) -> float:
        """Trigger the stream's DAG and wait for its run's end; the seconds from the trigger to the success that
        Airflow records (the run's ``end_date``). The wait polls once a second: a faster poll would take the API
        server's CPU from the run it times, and its interval would add to the time.

        The run is due from the second before the trigger's (``run_after``). The scheduler starts a queued run once
        ``run_after <= now()`` in the metadata database, and SQLite's ``now()`` has whole seconds: a run due at
        12:00:00.3 would wait until 12:00:01, up to a second that PostgreSQL (the compose stack's database) does
        not add.
        """
        self.world.root("scheduler")
        started = dt.datetime.now(dt.timezone.utc)
        due = started.replace(microsecond=0) - dt.timedelta(seconds=1)
        run = self.call("POST", f"/api/v2/dags/ingest_{stream}/dagRuns",
                        {"logical_date": None, "run_after": due.isoformat()})
        while True:
            time.sleep(1)
            dag_run = self.call("GET", f"/api/v2/dags/ingest_{stream}/dagRuns/{run['dag_run_id']}")
            if dag_run["state"] == "success":
                ended = dt.datetime.fromisoformat(dag_run["end_date"].replace("Z", "+00:00"))  # Python 3.10's parser
                return (ended - started).total_seconds()
            if dag_run["state"] == "failed":
                raise RuntimeError(f"the scheduled run {run['dag_run_id']} of ingest_{stream} failed")

    def stop(self) -> None:
        for process in self.processes:
            with_group(process, 15)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with_group(process, 9)


class Warm:
    """A warm server on the world's files and its own roots; each run is a fresh command-line client."""

    def __init__(self, world: World) -> None:
        self.world = world
        root = world.folder / "warm"
        token = secrets.token_urlsafe(32)
        roots = ["--landing-root", str(world.landing), "--lake-root", str(root / "lake"),
                 "--checkpoint-root", str(root / "checkpoints")]
        self.log = world.folder / "warm-server.log"
        self.process = subprocess.Popen(
            [str(BIN / "spark-submit"), "--master", "local[*]", str(PROJECT / "spark_apps" / "warm_server.py"),
             "--catalog", str(world.catalog), *roots, "--port", "0"],
            env={**world.env, **warm_jvm_environment(), "SLUICE_WARM_TOKEN": token}, stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + 300
        address = ""
        while not address:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the warm server did not start; see {self.log}")
            time.sleep(0.2)
            ready = [line for line in self.log.read_text().splitlines() if line.startswith("SLUICE_WARM_READY ")]
            address = ready[0].split()[1] if ready else ""
        self.env = {**world.side_env(root), "SLUICE_WARM_TOKEN": token, "SLUICE_WARM_ADDRESS": address}

    def run(self) -> str:
        self.world.root("warm")
        done = subprocess.run([str(BIN / "python"), "-m", "sluice", "warm", "run", "--stream", STREAM],
                              env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the warm run failed:\n{(done.stdout + done.stderr)[-3000:]}")
        return done.stdout

    def stop(self) -> None:
        with_group(self.process, 15)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with_group(self.process, 9)


def with_group(process: subprocess.Popen[bytes], signal_number: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal_number)


def summary_of(output: str) -> dict[str, Any]:
    line = next(line for line in reversed(output.splitlines()) if line.startswith(SUMMARY_MARKER))
    return dict(json.loads(line[len(SUMMARY_MARKER):]))


def task_seconds(home: Path, dag_id: str = DAG_ID, run_id_prefix: str = "manual__") -> dict[str, float]:
    """The duration of each task of the newest DAG run of ``dag_id``, from the metadata database of the Airflow
    ``home``."""
    with sqlite3.connect(home / "airflow.db") as db:
        (run_id,) = db.execute("SELECT run_id FROM dag_run WHERE dag_id = ? AND run_id LIKE ? ORDER BY id DESC "
                               "LIMIT 1", (dag_id, run_id_prefix + "%")).fetchone()
        rows = db.execute("SELECT task_id, duration FROM task_instance WHERE dag_id = ? AND run_id = ?",
                          (dag_id, run_id)).fetchall()
    return {task: round(float(seconds or 0), 2) for task, seconds in rows}


def _sides(text: str) -> list[str]:
    """``--sides``: known side names, comma-separated."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SIDES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--sides takes some of {', '.join(SIDES)}, not {text!r}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-scheduler", action="store_true", help="leave out the side through a running scheduler")
    parser.add_argument("--no-warm", action="store_true", help="leave out the side through a warm server")
    parser.add_argument("--sides", type=_sides, default=None,
                        help=f"run only these sides, comma-separated (of {', '.join(SIDES)}); default: all")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="sluice-bench-cost-"))
    scheduler: Scheduler | None = None
    warm: Warm | None = None
    try:
        sides = [side for side in SIDES if side in (args.sides or SIDES)]
        if args.no_scheduler:
            sides = [side for side in sides if not side.startswith("scheduler")]
        if args.no_warm:
            sides = [side for side in sides if side != "warm"]
        world = World(folder, airflow=any(side == "dag" or side.startswith("scheduler") for side in sides))
        schema = ", ".join(f"{name} {kind.removesuffix(' not null')}" for name, kind in EVENT_SCHEMA.items())
        print(f"{FILES} files, {FILES * LINES} lines, {world.bytes / 2**20:.1f} MiB of JSON; Python "
              f"{sys.version.split()[0]}, {os.cpu_count()} cores")
        outputs: dict[str, str] = {}

        def run(side: str, _: int) -> float:
            root = world.root(side) if not side.startswith("scheduler") else None
            started = time.monotonic()
            if side in ("spark", "spark_same_jvm"):
                assert root is not None
                world.spark_submit(str(world.floor), str(world.landing / "events"), str(root / "out"),
                                   str(root / "checkpoint"), schema,
                                   java_options=java_options if side == "spark_same_jvm" else [])
            elif side in ("bare", "bare_executors"):
                assert root is not None
                env = world.env if side == "bare" else {**world.env, "SLUICE_DRIVER_WRITE_MAX_BYTES": "0"}
                outputs[side] = world.spark_submit(
                    *SLUICE_CONF, str(PROJECT / "spark_apps" / "stream_runner.py"), "--catalog", str(world.catalog),
                    "--stream", STREAM, "--landing-root", str(world.landing), "--lake-root", str(root / "lake"),
                    "--checkpoint-root", str(root / "checkpoints"), env=env, java_options=java_options)
            elif side == "dag":
                assert root is not None
                done = subprocess.run([str(BIN / "airflow"), "dags", "test", DAG_ID],
                                      env={**world.side_env(root), "AIRFLOW_HOME": str(world.dags_test_home)},
                                      capture_output=True, text=True)
                if done.returncode != 0 or "state=success" not in done.stdout + done.stderr:
                    raise RuntimeError(f"airflow dags test failed:\n{(done.stdout + done.stderr)[-3000:]}")
            elif side == "warm":
                assert warm is not None
                outputs[side] = warm.run()
            else:
                assert scheduler is not None
                return scheduler.run(INLINE_STREAM if side == "scheduler_inline" else STREAM)
            return time.monotonic() - started

        # The options the operator gives this run's driver: the archive, and the light JIT if the run is small.
        fresh = world.root("bare")
        java_options = driver_java_options(small=small_run(
            load_catalog(world.catalog).select([STREAM]),
            Roots(landing=str(world.landing), lake=str(fresh / "lake"), checkpoints=str(fresh / "checkpoints"))))
        refusal = archive_refusal()
        print(f"driver JVM options of Sluice's runs: {' '.join(java_options) or 'none'}"
              + (f" (no class archive: {refusal})" if refusal else ""))
        if any(side.startswith("scheduler") for side in sides):
            scheduler = Scheduler(world)
        if "warm" in sides:
            warm = Warm(world)
        best = best_of_rounds(sides, args.rounds, run)

        phases: dict[str, float] = {}
        stream: dict[str, Any] = {}
        if "bare" in best:
            summary = summary_of(outputs["bare"])
            stream = summary["streams"][0]
            assert stream["status"] == "succeeded", stream
            phases = summary.get("phases_seconds", {})
            print(f"\nbare run ({stream.get('write_path') or 'executors'} write path): {stream['input_rows']} rows "
                  f"in, {stream['output_rows']} written, "
                  f"{stream['dead_letter_rows']} dead-lettered, {stream['batches']} batch(es)")
            print("  inside the application (s): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
                  + f"; outside it (JVM start and stop, Python start): {best['bare'] - sum(phases.values()):.2f}")
            from sluice.storage import runlog

            batches = runlog.batches(str(folder / "bare" / "lake"), STREAM)
            for batch in batches:
                print(f"  batch {batch['batch_id']}: {batch['duration_ms']} ms, Spark's phases (ms) "
                      f"{batch['phases_ms']}")
        if "dag" in best:
            print(f"`dags test` run's tasks (s): {task_seconds(world.dags_test_home)}")
        if scheduler is not None:
            print(f"scheduled DAG run's tasks (s): {task_seconds(world.home)}")
            print(f"inline-gate DAG run's tasks (s): {task_seconds(world.home, f'ingest_{INLINE_STREAM}')}")

        # Each ratio whose two sides ran.
        pairs = {"bare_vs_spark": ("bare", "spark"), "bare_vs_spark_same_jvm": ("bare", "spark_same_jvm"),
                 "dag_vs_bare": ("dag", "bare"), "scheduler_vs_bare": ("scheduler", "bare"),
                 "scheduler_inline_vs_bare": ("scheduler_inline", "bare"), "warm_vs_spark": ("warm", "spark")}
        ratios = {key: best[side] / best[base] for key, (side, base) in pairs.items() if side in best and base in best}
        if "warm" in best:
            warm_phases = summary_of(outputs["warm"]).get("phases_seconds", {})
            print("warm run, inside the server (s): " + ", ".join(f"{k} {v:.2f}" for k, v in warm_phases.items())
                  + f"; outside it (the client's start, the connection): "
                    f"{best['warm'] - sum(warm_phases.values()):.2f}")

        def floor(side: str) -> str:
            return f", {best[side] / best['spark']:.2f}x the floor" if "spark" in best else ""

        print()
        if "spark" in best:
            print(f"plain Spark floor  {best['spark']:6.2f} s")
        if "spark_same_jvm" in best:
            print(f"plain Spark, Sluice's JVM options {best['spark_same_jvm']:6.2f} s"
                  + (f"   (Sluice, bare: {ratios['bare_vs_spark_same_jvm']:.2f}x that, goal <= "
                     f"{GOALS['bare_vs_spark_same_jvm']})" if "bare_vs_spark_same_jvm" in ratios else ""))
        if "bare" in best:
            print(f"Sluice, bare       {best['bare']:6.2f} s"
                  + (f"   {ratios['bare_vs_spark']:.2f}x the floor (goal <= {GOALS['bare_vs_spark']})"
                     if "bare_vs_spark" in ratios else ""))
        if "bare_executors" in best:
            print(f"Sluice, bare, executors' write path {best['bare_executors']:6.2f} s " + floor("bare_executors"))
        if "dag_vs_bare" in ratios:
            print(f"Sluice, dags test  {best['dag']:6.2f} s   {ratios['dag_vs_bare']:.2f}x bare (no goal: Airflow's "
                  "own start-up)")
        if "scheduler_vs_bare" in ratios:
            print(f"Sluice, scheduler  {best['scheduler']:6.2f} s   {ratios['scheduler_vs_bare']:.2f}x bare "
                  f"(goal <= {GOALS['scheduler_vs_bare']})" + floor("scheduler"))
        if "scheduler_inline_vs_bare" in ratios:
            print(f"Sluice, scheduler, inline gate {best['scheduler_inline']:6.2f} s   "
                  f"{ratios['scheduler_inline_vs_bare']:.2f}x bare (goal <= {GOALS['scheduler_inline_vs_bare']})"
                  + floor("scheduler_inline"))
        if "warm_vs_spark" in ratios:
            print(f"Sluice, warm       {best['warm']:6.2f} s   {ratios['warm_vs_spark']:.2f}x the floor "
                  f"(goal <= {GOALS['warm_vs_spark']})")
        print(json.dumps({
            "ratios": {key: round(value, 3) for key, value in ratios.items()},
            "goals": {key: GOALS[key] for key in ratios},
            "seconds": {side: round(value, 2) for side, value in best.items()},
            "java_options": java_options,
            "phases_seconds": phases,
            "rows": stream.get("input_rows"),
            "write_path": stream.get("write_path"),
        }))
    finally:
        if scheduler is not None:
            scheduler.stop()
        if warm is not None:
            warm.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
