"""The newcomer path of the Makefile, run as a new user runs it: `make demo`, `make run`, `make stop`, `make clean`.

`make run` and `make stop` run the checkout's Makefile against an Airflow home and a data root under the test's
temporary folder. The Airflow of `make run` is told not to create scheduled runs (``[scheduler] use_job_schedule``):
the bundled DAGs' Spark runs would only slow the test down, and whether the DAGs are unpaused is read from the REST
API. Every process `make run` starts is found as a descendant of the `make` process, independently of what the
Makefile records, and is killed at the end whatever happened. `make clean` runs in a throwaway copy of the Makefile,
never in the checkout.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psutil
import pytest

from sluice.cli.demo_producer import DemoProducer
from sluice.operations.loopback import is_loopback
from tests.helpers import free_port

pytestmark = pytest.mark.airflow

PROJECT = Path(__file__).resolve().parents[2]
# The tests run inside the venv: `make` must never reinstall it, even when requirements.txt is newer than its stamp.
NEVER_REMAKE = ("-o", str(PROJECT / ".venv" / ".sluice-installed"))


def make_env(**variables: str) -> dict[str, str]:
    """The environment of a new user's shell: none of the settings the test session gives itself, plus ``variables``."""
    inherited = {name: value for name, value in os.environ.items()
                 if not name.startswith(("AIRFLOW", "SLUICE_", "PYSPARK_", "MAKE")) and name != "MFLAGS"}
    return {**inherited, **variables}


def make(*arguments: str, env: dict[str, str], cwd: Path = PROJECT,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", "-C", str(cwd), *NEVER_REMAKE, *arguments], env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def wait_for(condition: Any, what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def http(url: str, *, token: str | None = None, body: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, decoded JSON body) of a GET, or of a POST of ``body``; HTTP errors are returned, not raised."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body else None, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, None


def answers(url: str) -> bool:
    try:
        return http(url)[0] == 200
    except OSError:
        return False


def alive(process: psutil.Process) -> bool:
    """Whether this very process (same pid, same start time) still runs."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class MakeRun:
    """`make run` in a session of its own, its output in a file, and everything it started killed on close."""

    def __init__(self, log: Path, env: dict[str, str], *variables: str) -> None:
        self.log = log
        with log.open("wb") as output:
            self.make = subprocess.Popen(["make", "--no-print-directory", "-C", str(PROJECT), *NEVER_REMAKE, "run",
                                          *variables], env=env, stdout=output, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.seen: dict[int, psutil.Process] = {}

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_until_up(self, health_url: str, timeout: float = 300) -> None:
        def up() -> bool:
            assert self.make.poll() is None, f"make run exited ({self.make.returncode}):\n{self.output()[-4000:]}"
            self.note_processes()
            return answers(health_url)

        wait_for(up, f"{health_url} to answer", timeout)

    def note_processes(self) -> list[psutil.Process]:
        """Every live descendant of `make run`, remembered (pid and start time) for the checks after the stop."""
        try:
            found = psutil.Process(self.make.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            found = []
        for process in found:
            self.seen.setdefault(process.pid, process)
        return found

    def sessions(self) -> set[int]:
        ids = set()
        for process in self.seen.values():
            with contextlib.suppress(ProcessLookupError):
                if alive(process):
                    ids.add(os.getsid(process.pid))
        return ids

    def left_over(self, session_ids: set[int]) -> list[psutil.Process]:
        """The processes seen that still run, and any process in one of their sessions."""
        left = [process for process in self.seen.values() if alive(process)]
        for process in psutil.process_iter():
            try:
                if os.getsid(process.pid) in session_ids and process.pid not in self.seen:
                    left.append(process)
            except (ProcessLookupError, PermissionError):
                pass
        return left

    def close(self) -> None:
        session_ids = self.sessions()
        for process in self.left_over(session_ids):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        if self.make.poll() is None:
            os.killpg(self.make.pid, signal.SIGKILL)
        self.make.wait(timeout=30)


def listening(processes: list[psutil.Process]) -> set[tuple[str, int]]:
    addresses = set()
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            addresses |= {(connection.laddr.ip, connection.laddr.port)
                          for connection in process.net_connections(kind="inet")
                          if connection.status == psutil.CONN_LISTEN}
    return addresses


def port_is_free(port: int) -> bool:
    for host in ("127.0.0.1", "0.0.0.0"):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                return False
    return True


def bundled_dag_ids() -> set[str]:
    from airflow.dag_processing.dagbag import DagBag

    dagbag = DagBag(dag_folder=str(PROJECT / "dags"))
    assert not dagbag.import_errors
    return set(dagbag.dag_ids)


def stop_and_check_nothing_is_left(run: MakeRun, env: dict[str, str], port: int) -> None:
    run.note_processes()
    session_ids = run.sessions()
    assert session_ids, "make run started no process"

    stopped = make("stop", env=env)

    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    run.make.wait(timeout=60)
    assert run.left_over(session_ids) == [], "make stop left processes of make run running"
    assert port_is_free(port), f"port {port} is still taken after make stop"


@pytest.fixture(scope="module")
def after_make_demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A new user's Airflow home and data root after `make demo`: the environment to run `make` with."""
    folder = tmp_path_factory.mktemp("newcomer")
    env = make_env(AIRFLOW_HOME=str(folder / "airflow"), SLUICE_DATA_ROOT=str(folder / "data"),
                   AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE="False")
    demo = make("demo", env=env, timeout=600)
    assert demo.returncode == 0, (demo.stdout + demo.stderr)[-6000:]
    assert json.loads(demo.stdout.strip().splitlines()[-1])["ok"] is True
    return env


@pytest.fixture
def bystander(after_make_demo: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """A process that `make run` did not start, although its command line names airflow and the producer and its
    environment names the same Airflow home: `make stop` must leave it alone."""
    command = [sys.executable, "-c", "import time; time.sleep(900)", "airflow", "sluice", "demo-producer"]
    process = subprocess.Popen(command, env=after_make_demo, start_new_session=True)
    yield process
    process.kill()
    process.wait()


def test_make_run_after_make_demo_runs_the_dags_on_loopback_and_make_stop_stops_exactly_it(
        after_make_demo: dict[str, str], bystander: subprocess.Popen[bytes], tmp_path: Path) -> None:
    env = after_make_demo
    database = Path(env["AIRFLOW_HOME"]) / "airflow.db"
    with sqlite3.connect(database) as connection:
        paused = {dag_id for dag_id, is_paused in connection.execute("SELECT dag_id, is_paused FROM dag") if is_paused}
    assert "ingest_events_bronze" in paused, "make demo is expected to leave the DAG it tested paused"
    expected_dags = bundled_dag_ids()
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    run = MakeRun(tmp_path / "make-run.log", env, f"PORT={port}")
    try:
        run.wait_until_up(f"{base}/api/v2/monitor/health")

        assert f"http://127.0.0.1:{port}" in run.output()
        status, login = http(f"{base}/auth/token")
        assert status == 201, "on loopback, make run keeps the no-login convenience"

        def dags_unpaused() -> bool:
            status, body = http(f"{base}/api/v2/dags?limit=100", token=login["access_token"])
            assert status == 200
            states = {dag["dag_id"]: dag["is_paused"] for dag in body["dags"]}
            return expected_dags <= states.keys() and not any(states[dag_id] for dag_id in expected_dags)

        wait_for(dags_unpaused, f"the bundled DAGs {sorted(expected_dags)} to be registered and unpaused", 180)
        assert "[http.access]" not in run.output(), "make run's console has a line per HTTP request"
        sockets = listening(run.note_processes())
        assert ("127.0.0.1", port) in sockets
        assert all(is_loopback(ip) for ip, _ in sockets), f"make run listens beyond loopback: {sockets}"

        stop_and_check_nothing_is_left(run, env, port)
        assert bystander.poll() is None, "make stop killed a process that make run did not start"
    finally:
        run.close()


def trigger_and_wait(run: MakeRun, base: str, dag: str, timeout: float) -> dict[str, object]:
    """Trigger ``dag`` through the REST API, as a user would (the DAG once registered), wait for its run to succeed,
    and return its run summary (the run task's XCom)."""
    _, login = http(f"{base}/auth/token")
    token = login["access_token"]
    wait_for(lambda: http(f"{base}/api/v2/dags/{dag}", token=token)[0] == 200, f"the DAG {dag}", 180)
    status, started = http(f"{base}/api/v2/dags/{dag}/dagRuns", token=token,
                           body={"logical_date": None})  # type: ignore[dict-item]
    assert status == 200, started
    run_id = started["dag_run_id"]

    def finished() -> str | None:
        _, body = http(f"{base}/api/v2/dags/{dag}/dagRuns/{run_id}", token=token)
        return body["state"] if body["state"] in ("success", "failed") else None

    assert wait_for(finished, f"the DAG run {run_id}", timeout) == "success", run.output()[-4000:]
    _, xcom = http(f"{base}/api/v2/dags/{dag}/dagRuns/{run_id}/taskInstances/run_stream/xcomEntries/return_value",
                   token=token)
    return xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])


# A line of Spark's own log (include/sluice/spark-log4j2.properties: "26/11/27 18:00:00 INFO SparkContext: ...").
SPARK_INFO_LINE = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d INFO \w+: ")


def test_make_run_warm_sends_the_runs_to_a_warm_server_and_make_stop_stops_it(after_make_demo: dict[str, str],
                                                                              tmp_path: Path) -> None:
    env = after_make_demo
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    run = MakeRun(tmp_path / "make-run.log", env, f"PORT={port}", "WARM=1")
    try:
        run.wait_until_up(f"{base}/api/v2/monitor/health")
        assert "the stream runs go to it (warm mode)" in run.output()
        summary = trigger_and_wait(run, base, "ingest_events_bronze", 240)
        ready = next(line for line in run.output().splitlines() if "SLUICE_WARM_READY" in line)
        assert summary["app_id"] == ready.split()[-1], "the run went to a Spark application of its own, not warm"
        spark_info = [line for line in run.output().splitlines() if SPARK_INFO_LINE.search(line)]
        assert not spark_info, f"Spark's INFO log reached make run's console: {spark_info[:3]}"
        # The warm server's driver (its UI, RPC and block manager) as much as Airflow: loopback only.
        sockets = listening(run.note_processes())
        assert ("127.0.0.1", 15041) in sockets
        assert all(is_loopback(ip) for ip, _ in sockets), f"make run WARM=1 listens beyond loopback: {sockets}"
        stop_and_check_nothing_is_left(run, env, port)
        assert port_is_free(15041), "the warm server's port is still taken after make stop"
    finally:
        run.close()


def test_make_run_kafka_feeds_a_local_broker_that_a_stream_ingests_and_make_stop_stops_it(
        after_make_demo: dict[str, str], tmp_path: Path) -> None:
    """`make run KAFKA=1`: a broker from the jars `make venv` resolved, on loopback only; the demo producer sends to
    its topic; a triggered run of the bundled Kafka stream ingests those events into Delta; `make stop` stops the
    broker with the rest."""
    env = after_make_demo
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    run = MakeRun(tmp_path / "make-run.log", env, f"PORT={port}", "KAFKA=1")
    try:
        run.wait_until_up(f"{base}/api/v2/monitor/health")
        assert "Starting a Kafka broker" in run.output()
        producer_log = Path(env["AIRFLOW_HOME"]) / "producer.log"
        wait_for(lambda: producer_log.exists() and '"topic": "demo.events"' in producer_log.read_text(),
                 "the demo producer's first round into demo.events", 180)
        summary = trigger_and_wait(run, base, "ingest_events_kafka_bronze", 300)
        [stream] = summary["streams"]
        assert stream["status"] == "succeeded" and stream["output_rows"] > 0, stream
        sockets = listening(run.note_processes())
        assert all(is_loopback(ip) for ip, _ in sockets), f"make run KAFKA=1 listens beyond loopback: {sockets}"
        stop_and_check_nothing_is_left(run, env, port)
        assert not (Path(env["SLUICE_DATA_ROOT"]) / "kafka" / "ready").exists(), "the broker stopped"
    finally:
        run.close()


def test_make_run_on_another_address_asks_for_the_generated_password(after_make_demo: dict[str, str],
                                                                    tmp_path: Path) -> None:
    env = after_make_demo
    port = free_port("0.0.0.0")
    base = f"http://127.0.0.1:{port}"
    passwords = Path(env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"

    run = MakeRun(tmp_path / "make-run.log", env, "HOST=0.0.0.0", f"PORT={port}")
    try:
        run.wait_until_up(f"{base}/api/v2/monitor/health")

        assert str(passwords) in run.output(), "make run must say where the password is"
        assert http(f"{base}/auth/token")[0] == 403, "no token without a password off loopback"
        assert http(f"{base}/api/v2/dags")[0] in (401, 403)
        password = json.loads(passwords.read_text())["admin"]
        status, login = http(f"{base}/auth/token", body={"username": "admin", "password": password})
        assert status == 201
        assert http(f"{base}/api/v2/dags", token=login["access_token"])[0] == 200

        stop_and_check_nothing_is_left(run, env, port)
    finally:
        run.close()


def start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat: what `make run` records next to each pid it starts."""
    return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19])


def test_make_stop_kills_the_recorded_sessions_and_never_a_pid_given_to_another_process(tmp_path: Path) -> None:
    home = tmp_path / "airflow"
    home.mkdir()
    # A recorded session whose processes ignore SIGTERM: make stop must get to SIGKILL, for the child as well.
    obstinate = subprocess.Popen(["bash", "-c", "trap '' TERM; sleep 900 & wait"], start_new_session=True)
    # A pid in the record that now belongs to another process (another start time): make stop must not touch it.
    stranger = subprocess.Popen(["sleep", "900"], start_new_session=True)
    try:
        wait_for(lambda: psutil.Process(obstinate.pid).children(), "the obstinate session's child", 10)
        child = psutil.Process(obstinate.pid).children()[0]
        (home / "make-run.sessions").write_text(f"airflow {obstinate.pid} {start_time(obstinate.pid)}\n"
                                                f"producer {stranger.pid} {start_time(stranger.pid) - 1}\n")

        stopped = make("stop", "STOP_TIMEOUT=1", env=make_env(AIRFLOW_HOME=str(home)), timeout=60)

        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert obstinate.wait(timeout=10) == -signal.SIGKILL
        assert not alive(child)
        assert stranger.poll() is None, "make stop killed a pid that now belongs to another process"
        assert str(stranger.pid) in stopped.stderr
        assert not (home / "make-run.sessions").exists()
    finally:
        for process in (obstinate, stranger):
            process.kill()
            process.wait()


# What `make clean` needs of the checkout: the Makefile, and sluice.cli.devserver, which it runs on the system Python.
SOURCES = ("Makefile", "include/sluice/__init__.py", "include/sluice/errors.py", "include/sluice/cli/__init__.py",
           "include/sluice/cli/devserver.py")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A throwaway copy of the checkout as `make clean` sees it: the Makefile and the module it runs (SOURCES), a venv,
    data, an Airflow home, caches."""
    folder = tmp_path / "checkout"
    for source in SOURCES:
        (folder / source).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(PROJECT / source, folder / source)
    for name in (".venv", "data", ".airflow", ".pytest_cache", "spark-warehouse"):
        (folder / name).mkdir()
        (folder / name / "marker").write_text(name)
    return folder


def files_under(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*") if path.is_file() or path.is_symlink()}


def test_make_clean_deletes_the_data_the_airflow_home_and_the_caches_inside_the_checkout(checkout: Path) -> None:
    cleaned = make("clean", env=make_env(), cwd=checkout)

    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert files_under(checkout) == {*(checkout / source for source in SOURCES), checkout / ".venv" / "marker"}


def test_make_clean_deletes_nothing_while_make_run_runs(checkout: Path) -> None:
    # A session recorded as make run's: deleting the Airflow home would delete its record, and make stop could then
    # stop nothing of it.
    session = subprocess.Popen(["sleep", "900"], start_new_session=True)
    try:
        record = checkout / ".airflow" / "make-run.sessions"
        record.write_text(f"airflow {session.pid} {start_time(session.pid)}\n")
        before = files_under(checkout)

        cleaned = make("clean", env=make_env(), cwd=checkout)

        assert cleaned.returncode != 0
        assert "'make stop' first" in cleaned.stderr
        assert files_under(checkout) == before
        assert session.poll() is None
    finally:
        session.kill()
        session.wait()


@pytest.mark.parametrize("case", ["data root outside", "data root links outside", "Airflow home is the checkout"])
def test_make_clean_deletes_nothing_when_a_path_is_not_inside_the_checkout(checkout: Path, tmp_path: Path,
                                                                           case: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("not the checkout's to delete")
    env = make_env()
    if case == "data root outside":
        env["SLUICE_DATA_ROOT"] = str(elsewhere)
    elif case == "data root links outside":
        shutil.rmtree(checkout / "data")
        (checkout / "data").symlink_to(elsewhere)
    else:
        env["AIRFLOW_HOME"] = str(checkout)
    before = files_under(checkout)

    cleaned = make("clean", env=env, cwd=checkout)

    assert cleaned.returncode != 0
    assert "deleting nothing" in cleaned.stderr
    assert (elsewhere / "precious").read_text() == "not the checkout's to delete"
    assert files_under(checkout) == before


def test_make_run_starts_a_stream_when_files_land_one_run_per_burst_each_row_once(
        after_make_demo: dict[str, str], tmp_path: Path) -> None:
    """A stream with ``arrival`` and no cron under `make run` (the triggerer watches its landing folder): a burst of
    files landing while Airflow idles starts one DAG run, which lands them; a later file starts one more; the table
    holds each good row once (the oracle reads the files with the json module)."""
    from tests.helpers import events_stream, expected_events, table_rows, write_catalog

    stream = events_stream("drops", schedule=None, arrival={"poll": "1s", "settle": "2s", "max_wait": "20s"},
                           source={**events_stream()["source"], "path": "drops"})
    catalog = write_catalog(tmp_path, stream)
    env = {**after_make_demo, "SLUICE_CATALOG": str(catalog), "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "True"}
    data = Path(env["SLUICE_DATA_ROOT"])
    producer = DemoProducer(data / "landing" / "drops", seed=41, malformed_rate=0.05)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    run = MakeRun(tmp_path / "make-run.log", env, f"PORT={port}")
    try:
        run.wait_until_up(f"{base}/api/v2/monitor/health")
        _, login = http(f"{base}/auth/token")
        token = login["access_token"]
        wait_for(lambda: http(f"{base}/api/v2/dags/ingest_drops", token=token)[1] is not None,
                 "the stream's DAG", 180)
        watcher_runs = Path(env["AIRFLOW_HOME"]) / "airflow.db"

        def watching() -> bool:
            with sqlite3.connect(watcher_runs) as connection:
                return bool(connection.execute(
                    "SELECT count(*) FROM trigger WHERE classpath = 'sluice_airflow.triggers.StreamArrivalTrigger' "
                    "AND triggerer_id IS NOT NULL").fetchone()[0])

        wait_for(watching, "the triggerer to run the stream's watcher", 180)

        def runs() -> list[dict[str, Any]]:
            _, body = http(f"{base}/api/v2/dags/ingest_drops/dagRuns?order_by=run_after", token=token)
            return list(body["dag_runs"])

        def finished(count: int) -> list[dict[str, Any]] | None:
            found = runs()
            done = len(found) >= count and all(r["state"] in ("success", "failed") for r in found)
            return found if done else None

        start = datetime.now(timezone.utc)
        for minute in range(3):  # a burst
            producer.events_file(lines=30, now=start + timedelta(minutes=minute))
        first = wait_for(lambda: finished(1), "a run started by the burst", 300)
        assert [r["run_type"] for r in first] == ["asset_triggered"] and first[0]["state"] == "success", first
        time.sleep(5)  # the absence of a second run: settle and a poll have passed since the run's start
        assert len(runs()) == 1, "a burst of files is one run"
        producer.events_file(lines=30, now=start + timedelta(minutes=10))
        second = wait_for(lambda: finished(2), "a run started by the later file", 300)
        assert [r["state"] for r in second] == ["success", "success"], second

        good, _ = expected_events(data / "landing" / "drops")
        rows = table_rows(str(data / "lake" / "bronze" / "drops"),
                          ["event_id", "event_type", "user_id", "amount", "event_date"])
        assert [(*row[:4], row[4].isoformat()) for row in rows] == good
    finally:
        run.close()
