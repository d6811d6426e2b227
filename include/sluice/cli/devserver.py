"""What `make run`, `make stop` and `make clean` do: the embedded default's Airflow, its stop, and the clean-up.

Run as ``python -m sluice.cli.devserver run|stop|clean``. The Makefile gives every setting on the command line; ``stop``
and ``clean`` run before the venv exists, on the system Python with ``PYTHONPATH=include``, so this module uses the
standard library only. ``run`` and ``stop`` read ``/proc``, so they need Linux.

`make run` starts two sessions (:func:`os.setsid`): the scheduling session (scheduler, DAG processor, triggerer and
the demo producer), then the API session (the API server, which the task processes report their end to, so it is
stopped last). It records one line ``<name> <pid> <start time>`` per session in ``$AIRFLOW_HOME/make-run.sessions``, in
the order `make stop` stops them. The pid is the session leader's, and so the session id; the start time (clock ticks
after boot, field 22 of ``/proc/<pid>/stat``) proves that the pid still belongs to that leader, not to a process that
got the number since.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, NoReturn

DESCRIPTION = "What `make run`, `make stop` and `make clean` do."
RECORD_NAME = "make-run.sessions"
JWT_SECRET_NAME = "jwt-secret"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# What `make clean` deletes besides the data root and the Airflow home, relative to the checkout.
CACHES = (".pytest_cache", ".ruff_cache", ".mypy_cache", "spark-warehouse")
HEALTH_TIMEOUT = 300
# Seconds between `make run`'s status lines, which say again where the UI is once the components' output has
# scrolled it away.
STATUS_INTERVAL = 300
# Seconds `make stop` waits for what SIGKILL was sent to.
KILL_TIMEOUT = 10
POLL_INTERVAL = 0.2
# Standalone's scheduler and triggerer would also open log servers on every address (8793, 8794); on one machine the
# API server reads the task logs from their files, so they are skipped.
SCHEDULING_COMPONENTS = (
    ("scheduler", ("airflow", "scheduler", "--skip-serve-logs")),
    ("dag-proc", ("airflow", "dag-processor")),
    ("triggerer", ("airflow", "triggerer", "--skip-serve-logs")),
)
API_COMPONENTS = (("api-server", ("airflow", "api-server")),)
# `make run WARM=1`: warm mode's server (one resident Spark driver, spark_apps/warm_server.py), its command built at
# start from the deployment's catalog and roots.
SESSIONS = {"scheduling": SCHEDULING_COMPONENTS, "api-server": API_COMPONENTS, "warm": (), "kafka": ()}
WARM_PORT = 15041
WARM_MASTER = "local[*]"
WARM_READY_TIMEOUT = 300
# `make run KAFKA=1`: a Kafka broker (python -m sluice kafka-broker) under the data root, the topic the demo producer
# also sends its events to, and the catalog of the bundled streams plus include/sluice/streams_kafka.yaml's.
KAFKA_TOPIC = "demo.events"
KAFKA_READY_TIMEOUT = 120
KAFKA_CATALOG_NAME = "catalog-kafka.yaml"


def say(message: str = "", *, error: bool = False) -> None:
    """One line to stdout (or stderr), flushed at once: the sessions write to the same terminal."""
    print(message, file=sys.stderr if error else sys.stdout, flush=True)


# ---------------------------------------------------------------------------------------------------------------------
# The process table and the sessions of `make run` (pure, apart from the readers)


@dataclass(frozen=True)
class ProcessStat:
    """The fields of ``/proc/<pid>/stat`` that membership needs."""

    pid: int
    state: str
    parent: int
    session: int
    start: int

    @property
    def live(self) -> bool:
        """A zombie (or a dead process) has exited: it is no longer anyone's to stop."""
        return self.state not in ("Z", "X")


def parse_stat(line: str) -> ProcessStat:
    """Parses one ``/proc/<pid>/stat`` line. The command name (field 2) is in parentheses and may itself hold spaces
    and parentheses, so the fields after it are read after the last ``") "``."""
    pid, separator, rest = line.partition(" ")
    name_end = rest.rfind(") ")
    if not separator or not rest.startswith("(") or name_end < 0:
        raise ValueError(f"not a /proc/<pid>/stat line: {line!r}")
    fields = rest[name_end + 2:].split()
    if len(fields) < 20:
        raise ValueError(f"a /proc/<pid>/stat line has 52 fields; this one has {len(fields) + 2}: {line!r}")
    return ProcessStat(pid=int(pid), state=fields[0], parent=int(fields[1]), session=int(fields[3]),
                       start=int(fields[19]))


def read_processes(proc: Path = Path("/proc")) -> dict[int, ProcessStat]:
    """Every process in the table by pid, zombies included; processes that exit while it reads are left out."""
    processes = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = parse_stat((entry / "stat").read_text(errors="surrogateescape"))
        except (OSError, ValueError):
            continue
        processes[stat.pid] = stat
    return processes


def started_at(pid: int) -> int:
    """The start time of process ``pid``, in clock ticks after boot."""
    return parse_stat((Path("/proc") / str(pid) / "stat").read_text(errors="surrogateescape")).start


@dataclass(frozen=True)
class SessionRecord:
    """One line of the record: a session that `make run` started, by its leader's pid and start time."""

    name: str
    leader: int
    start: int


def parse_record(text: str) -> list[SessionRecord]:
    """The sessions of a record; lines that are not ``<name> <pid> <start time>`` are skipped."""
    records = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[1].isdigit() and fields[2].isdigit():
            records.append(SessionRecord(fields[0], int(fields[1]), int(fields[2])))
    return records


def read_record(path: Path) -> list[SessionRecord]:
    try:
        return parse_record(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return []


@dataclass(frozen=True)
class Membership:
    """What of the recorded sessions still runs: ``processes`` maps each pid to its start time; ``recycled`` are the
    recorded leaders whose pid now belongs to another process."""

    processes: dict[int, int]
    recycled: list[int]


def members(records: Iterable[SessionRecord], table: Mapping[int, ProcessStat], only: int | None = None) -> Membership:
    """The live processes of the recorded sessions (only the one led by ``only``, when given) whose leader, when still
    alive, has the recorded start time, and all their live descendants (spark-submit runs in a session of its own).

    A process joins a session's members only if it started no earlier than the leader: a pid of the session id that
    a process kept from before would otherwise count.
    """
    live = {pid: stat for pid, stat in table.items() if stat.live}
    ours: dict[int, int] = {}
    recycled = []
    for record in records:
        if only is not None and record.leader != only:
            continue
        leader = live.get(record.leader)
        if leader is None or leader.start == record.start:
            ours[record.leader] = record.start
        else:
            recycled.append(record.leader)
    mine = {pid for pid, stat in live.items() if stat.session in ours and stat.start >= ours[stat.session]}
    grown = True
    while grown:
        descendants = {pid for pid, stat in live.items() if pid not in mine and stat.parent in mine}
        mine |= descendants
        grown = bool(descendants)
    return Membership({pid: live[pid].start for pid in sorted(mine)}, recycled)


# ---------------------------------------------------------------------------------------------------------------------
# make stop


class StopFailed(Exception):
    """Something of the recorded sessions still ran after SIGKILL."""


@dataclass
class Stopper:
    """Stops the sessions recorded in ``record``: SIGTERM, then SIGKILL to what runs ``timeout`` seconds later."""

    record: Path
    airflow_home: str
    timeout: float
    stopped: int = 0

    def running(self, only: int | None = None, *, notes: bool = False) -> dict[int, int]:
        membership = members(read_record(self.record), read_processes(), only)
        if notes:
            for pid in membership.recycled:
                say(f"make stop: pid {pid} now belongs to another process; leaving it alone", error=True)
        return membership.processes

    def stop_session(self, only: int | None = None) -> None:
        """Stops one recorded session (all of them, without ``only``) and every process it started."""
        alive = self.running(only)
        kill = False
        deadline = time.monotonic() + self.timeout
        signalled: set[tuple[int, int]] = set()
        while alive:
            if time.monotonic() >= deadline:
                listing = " ".join(f"{pid}:{start}" for pid, start in alive.items())
                if kill:
                    raise StopFailed(f"make stop: still running after SIGKILL: {listing}")
                say(f"make stop: SIGKILL to what still runs {self.timeout:g} s after SIGTERM: {listing}", error=True)
                kill = True
                signalled = set()
                deadline = time.monotonic() + KILL_TIMEOUT
            for process in alive.items():
                if process in signalled:
                    continue
                with contextlib.suppress(OSError):
                    os.kill(process[0], signal.SIGKILL if kill else signal.SIGTERM)
                signalled.add(process)
                if not kill:
                    self.stopped += 1
            time.sleep(POLL_INTERVAL)
            alive = self.running(only)

    def stop_all(self, *, quiet: bool = False) -> bool:
        """Stops every recorded session in the record's order, then anything of theirs that is left; False when
        something survived SIGKILL."""
        self.stopped = 0
        if not self.running(notes=True):
            if not quiet:
                say(f"Nothing that make run started is running (Airflow home {self.airflow_home})")
            self.record.unlink(missing_ok=True)
            return True
        try:
            for record in read_record(self.record):
                self.stop_session(record.leader)
            self.stop_session()
        except StopFailed as failure:
            say(str(failure), error=True)
            return False
        self.record.unlink(missing_ok=True)
        if not quiet:
            say(f"Stopped what make run started: {self.stopped} processes (Airflow home {self.airflow_home})")
        return True


# ---------------------------------------------------------------------------------------------------------------------
# make run


@dataclass(frozen=True)
class Address:
    """Where `make run` serves the UI and the REST API, and what follows from it."""

    host: str
    port: int

    @property
    def on_loopback(self) -> bool:
        return self.host in LOOPBACK_HOSTS

    @property
    def reach(self) -> str:
        """The address the local processes (LocalExecutor's workers, the health check) reach the API server at."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host

    @property
    def url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}"

    @property
    def local_url(self) -> str:
        return f"http://{url_host(self.reach)}:{self.port}"


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def all_admins(address: Address, environ: Mapping[str, str]) -> str:
    """Nobody logs in (every user is an admin) only on a loopback address, and only while the environment does not
    turn it off; any other address needs the simple auth manager's login."""
    if not address.on_loopback:
        return "False"
    return environ.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS") or "True"


def passwords_file(airflow_home: str, environ: Mapping[str, str]) -> str:
    return (environ.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE")
            or f"{airflow_home}/simple_auth_manager_passwords.json.generated")


# Airflow's loggers that `make run` quiets to WARNING on its console, unless AIRFLOW__LOGGING__NAMESPACE_LEVELS is set:
# the API server's line per HTTP request (the UI polls every few seconds: half the console) and the DAG processor's
# lines per DAG per parse about the next run's date.
QUIET_LOGGERS = "http.access=warning airflow.models.dag=warning airflow.serialization.definitions.dag=warning"


def run_environment(address: Address, airflow_home: str, data_root: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The settings `make run` gives Airflow on top of the Makefile's."""
    return {
        "AIRFLOW__LOGGING__NAMESPACE_LEVELS": environ.get("AIRFLOW__LOGGING__NAMESPACE_LEVELS", QUIET_LOGGERS),
        "AIRFLOW_HOME": airflow_home,
        "SLUICE_DATA_ROOT": data_root,
        "AIRFLOW__API__HOST": address.host,
        "AIRFLOW__API__PORT": str(address.port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{address.local_url}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": all_admins(address, environ),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "PYTHONUNBUFFERED": "1",
    }


def jwt_secret(airflow_home: str) -> str:
    """The key the API server signs its tokens with: 64 random bytes, made at the first `make run` and kept in the
    Airflow home (mode 0600), so tokens outlive a restart. Airflow's own default is 16 bytes, under the 64 that its
    HS512 signature asks for (PyJWT warns about it in every component's log)."""
    import secrets

    path = Path(airflow_home) / JWT_SECRET_NAME
    with contextlib.suppress(FileExistsError):
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="ascii") as out:
            out.write(secrets.token_urlsafe(64) + "\n")
    return path.read_text(encoding="ascii").strip()


def port_taken(host: str, port: int) -> bool:
    """Whether something answers on ``port`` of ``host``."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        return probe.connect_ex((host, port)) == 0


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except Exception:
        return False


def unpaused_dags(output: str) -> list[str]:
    """The DAGs that ``airflow dags unpause --output plain`` found paused (second column ``True``)."""
    return [fields[0] for fields in (line.split() for line in output.splitlines())
            if len(fields) >= 2 and fields[1] == "True"]


class Interrupted(Exception):
    """SIGINT, SIGTERM or SIGHUP reached `make run`."""


def interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise Interrupted(signum)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def spawn_session(name: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Starts session ``name`` as the leader of a new session: its pid is the session id."""
    return subprocess.Popen([sys.executable, "-m", "sluice.cli.devserver", "session", name], stdin=subprocess.DEVNULL,
                            start_new_session=True, env=None if env is None else {**os.environ, **env})


def warm_environment(port: int) -> tuple[dict[str, str], dict[str, str]]:
    """A new warm server's token, as its own environment, and the Airflow connection ``sluice_warm`` that points
    Airflow's runs at it, as Airflow's."""
    import json
    import secrets

    token = secrets.token_urlsafe(32)
    connection = {"conn_type": "generic", "host": "127.0.0.1", "port": port, "password": token}
    return {"SLUICE_WARM_TOKEN": token}, {"AIRFLOW_CONN_SLUICE_WARM": json.dumps(connection)}


def warm_command(port: int) -> list[str]:
    """spark-submit of the warm server, on the catalog and roots the DAGs use."""
    from sluice.catalog import DEFAULT_CATALOG
    from sluice.operations.jars import submit_args as jar_args
    from sluice.operations.loopback import submit_args
    from sluice.paths import Roots

    server = Path(__file__).resolve().parents[3] / "spark_apps" / "warm_server.py"
    catalog = os.environ.get("SLUICE_CATALOG") or str(DEFAULT_CATALOG)
    return ["spark-submit", "--master", WARM_MASTER, *submit_args(WARM_MASTER), *jar_args(), str(server),
            "--catalog", catalog, *Roots.from_env().as_args(), "--host", "127.0.0.1", "--port", str(port)]


def warm_jvm_environment() -> dict[str, str]:
    """The warm server's driver JVM gets the class archive (:mod:`sluice.operations.jvm`); a resident driver keeps
    the full JIT. Spark's own log is at WARN (``SLUICE_SPARK_LOG_LEVEL`` brings INFO back). Its UI listens on
    loopback (:mod:`sluice.operations.loopback`)."""
    from sluice.operations.jvm import driver_java_options, log_options, submit_env
    from sluice.operations.loopback import driver_env

    return {**driver_env(WARM_MASTER), **submit_env([*driver_java_options(small=False), *log_options()])}


def wait_for_warm(leader: subprocess.Popen[bytes], port: int, token: str) -> bool:
    """Waits until the warm server answers a ping (it warms up first, then listens), so that no scheduled run finds
    it missing. Not just an open port: the ping's handshake makes the server prove that it holds this run's token, so
    a program that took the port meanwhile is found out here, before Airflow sends it any run."""
    from sluice.warm import WarmAddress, WarmRefused, WarmServerGone, ping

    address = WarmAddress("127.0.0.1", port, token)
    deadline = time.monotonic() + WARM_READY_TIMEOUT
    while True:
        try:
            ping(address)
            return True
        except WarmRefused:
            say(f"make run: another program listens on the warm server's port {port}: it could not prove that it "
                "holds the warm server's token", error=True)
            return False
        except WarmServerGone:
            pass
        if leader.poll() is not None or time.monotonic() >= deadline:
            say(f"make run: the warm server did not answer on port {port}", error=True)
            return False
        time.sleep(0.5)


def kafka_folder() -> str:
    return os.path.join(os.environ["SLUICE_DATA_ROOT"], "kafka")


def wait_for_kafka(leader: subprocess.Popen[bytes], folder: str) -> bool:
    """Waits until the broker answers a client (its ready file), so that the first runs find their topic."""
    from sluice.cli.kafka_broker import READY_NAME

    deadline = time.monotonic() + KAFKA_READY_TIMEOUT
    while not os.path.exists(os.path.join(folder, READY_NAME)):
        if leader.poll() is not None or time.monotonic() >= deadline:
            say(f"make run: the Kafka broker did not start; its log: {folder}/broker.log", error=True)
            return False
        time.sleep(0.5)
    return True


def kafka_environment(folder: str, airflow_home: str) -> dict[str, str]:
    """Airflow's connection ``sluice_kafka`` to the started broker, the catalog with the Kafka stream, and the topic
    the demo producer sends to. The broker's password reaches the processes' environment only."""
    import yaml

    from sluice.catalog import DEFAULT_CATALOG
    from sluice.cli.kafka_broker import LocalKafkaBroker

    def streams(path: Path) -> list[object]:
        return list(yaml.safe_load(path.read_text(encoding="utf-8"))["streams"])

    catalog = Path(airflow_home) / KAFKA_CATALOG_NAME
    base = Path(os.environ.get("SLUICE_CATALOG") or DEFAULT_CATALOG)
    combined = {"version": 1, "streams": [*streams(base), *streams(DEFAULT_CATALOG.parent / "streams_kafka.yaml")]}
    catalog.write_text(yaml.safe_dump(combined, sort_keys=False), encoding="utf-8")
    return {"AIRFLOW_CONN_SLUICE_KAFKA": LocalKafkaBroker(folder).address().airflow_connection(),
            "SLUICE_CATALOG": str(catalog), "SLUICE_DEMO_KAFKA_TOPIC": KAFKA_TOPIC}


def run(address: Address, airflow_home: str, data_root: str, stop_timeout: float, *, warm: bool = False,
        kafka: bool = False) -> int:
    """`make run`: Airflow's components and the demo producer until a signal, `make stop`, or their end; with
    ``warm``, first a warm server that the stream runs go to; with ``kafka``, first a Kafka broker that the producer
    also feeds and a bundled Kafka stream reads."""
    record = Path(airflow_home) / RECORD_NAME
    stopper = Stopper(record, airflow_home, stop_timeout)
    if stopper.running():
        say(f"make run: already running for {airflow_home}; 'make stop' first", error=True)
        return 1
    if port_taken(address.reach, address.port):
        say(f"make run: another program listens on port {address.port}; choose a free one: make run PORT=8081",
            error=True)
        return 1
    os.environ.update(run_environment(address, airflow_home, data_root, os.environ))
    os.environ.setdefault("AIRFLOW__API_AUTH__JWT_SECRET", jwt_secret(airflow_home))
    Path(data_root).mkdir(parents=True, exist_ok=True)
    unpause = subprocess.run(["airflow", "dags", "unpause", "--treat-dag-id-as-regex", "--yes", ".*", "--output",
                              "plain"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if unpause.returncode != 0:
        say(unpause.stdout.rstrip("\n"), error=True)
        return 1
    unpaused = unpaused_dags(unpause.stdout)
    if unpaused:
        say("Unpaused the DAGs that the metadata database had paused: " + " ".join(unpaused))
    if warm and port_taken("127.0.0.1", WARM_PORT):
        say(f"make run: another program listens on the warm server's port {WARM_PORT}", error=True)
        return 1
    if warm:
        from sluice.errors import SluiceError
        from sluice.operations.loopback import driver_env

        try:
            driver_env(WARM_MASTER)  # the warm session reads it again; a bad setting is said here, once
        except SluiceError as exc:
            say(f"make run: {exc}", error=True)
            return 1
    for signum in STOP_SIGNALS:
        signal.signal(signum, interrupt)
    try:
        # `make stop` stops the sessions in the record's order: the runs' scheduling first, then the warm server,
        # then the API server; the warm server starts first, so that no scheduled run finds it missing.
        warm_line = ""
        if warm:
            say(f"Starting the warm server on 127.0.0.1 port {WARM_PORT}: the stream runs go to it (warm mode)")
            server_env, airflow_env = warm_environment(WARM_PORT)
            os.environ.update(airflow_env)
            server = spawn_session("warm", server_env)
            warm_line = f"warm {server.pid} {started_at(server.pid)}\n"
            record.write_text(warm_line)
            if not wait_for_warm(server, WARM_PORT, server_env["SLUICE_WARM_TOKEN"]):
                stopper.stop_all(quiet=True)
                return 1
        kafka_line = ""
        if kafka:
            say(f"Starting a Kafka broker (KRaft, SASL/PLAIN) on 127.0.0.1 for the stream events_kafka_bronze, its "
                f"data in {kafka_folder()}")
            broker = spawn_session("kafka")
            kafka_line = f"kafka {broker.pid} {started_at(broker.pid)}\n"
            record.write_text(f"{warm_line}{kafka_line}")
            if not wait_for_kafka(broker, kafka_folder()):
                stopper.stop_all(quiet=True)
                return 1
            os.environ.update(kafka_environment(kafka_folder(), airflow_home))
        say(f"Starting Airflow (scheduler, dag-processor, triggerer, api-server on {address.host} port {address.port})")
        say(f"and the demo producer: a round of events every 60 s into {data_root}/landing"
            + (f" and the topic {KAFKA_TOPIC}" if kafka else ""))
        scheduling = spawn_session("scheduling")
        record.write_text(f"scheduling {scheduling.pid} {started_at(scheduling.pid)}\n{warm_line}{kafka_line}")
        api = spawn_session("api-server")
        with record.open("a") as lines:
            lines.write(f"api-server {api.pid} {started_at(api.pid)}\n")
        started = time.monotonic()
        done = threading.Event()
        if wait_until_up(address, api, airflow_home):
            threading.Thread(target=keep_saying, args=(address, started, done), daemon=True).start()
        scheduling.wait()
        api.wait()
        done.set()
        stopper.stop_all(quiet=True)
    except Interrupted:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        say()
        stopper.stop_all()
        return 0
    say("make run: Airflow has stopped")
    return 0


def wait_until_up(address: Address, api: subprocess.Popen[bytes], airflow_home: str) -> bool:
    """Waits for the API server's health endpoint, then says where Airflow is and how to log in; whether it
    answered."""
    health = f"{address.local_url}/api/v2/monitor/health"
    deadline = time.monotonic() + HEALTH_TIMEOUT
    while not answers(health):
        if api.poll() is not None:
            break
        if time.monotonic() >= deadline:
            say(f"make run: no answer from {address.local_url} in {HEALTH_TIMEOUT} s", error=True)
            return False
        time.sleep(1)
    if api.poll() is not None:
        return False
    say()
    say(f"Airflow UI and REST API: {address.url}, on {address.host} port {address.port}"
        + (" (this machine only)" if address.on_loopback else ""))
    if os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] in ("True", "true", "1"):
        say("Every user is an admin, no login. 'make run HOST=0.0.0.0' serves other machines, with a login")
    else:
        say(f"Log in as admin; the password is in {passwords_file(airflow_home, os.environ)}")
    say("The ingest DAGs run on their schedules. Ctrl-C, or 'make stop' in another terminal, stops it all")
    return True


def status_line(address: Address, up_seconds: float) -> str:
    """The short line `make run` repeats, so that where the UI is stays findable in a scrolling console."""
    minutes = int(up_seconds // 60)
    up = f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"
    return f"make run: up {up}; Airflow UI at {address.url}; 'make stop' or Ctrl-C stops it"


def keep_saying(address: Address, started: float, done: threading.Event, interval: float = STATUS_INTERVAL) -> None:
    """Says :func:`status_line` every ``interval`` seconds until ``done`` is set."""
    while not done.wait(interval):
        say(status_line(address, time.monotonic() - started))


def prefix_lines(name: str, source: IO[bytes], lock: threading.Lock) -> None:
    """Copies a component's output to ours, each line prefixed with the component's name."""
    prefix = f"{name:<10} | ".encode()
    output = sys.stdout.buffer
    for line in source:
        with lock:
            try:
                output.write(prefix + line)
                output.flush()
            except (BrokenPipeError, ValueError):
                pass


def session(name: str) -> int:
    """A session leader: starts the components of session ``name`` and ends when all of them have.

    The leader and its output prefixing outlive SIGTERM: the components' last lines still reach the terminal, and
    `make run` sees a session end only when all its components have.
    """
    # A command run in the background by a shell has SIGINT and SIGQUIT ignored, and exec would keep them so.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    lock = threading.Lock()
    children: list[subprocess.Popen[bytes]] = []
    threads = []
    components = ([("warm", tuple(warm_command(WARM_PORT)))] if name == "warm"
                  else [("kafka", (sys.executable, "-m", "sluice", "kafka-broker", "--folder", kafka_folder()))]
                  if name == "kafka" else SESSIONS[name])
    environment = {**os.environ, **warm_jvm_environment()} if name == "warm" else None
    for component, command in components:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env=environment)
        assert child.stdout is not None
        thread = threading.Thread(target=prefix_lines, args=(component, child.stdout, lock), daemon=True)
        thread.start()
        children.append(child)
        threads.append(thread)
    if name == "scheduling":
        landing = os.path.join(os.environ["SLUICE_DATA_ROOT"], "landing")
        with open(os.path.join(os.environ["AIRFLOW_HOME"], "producer.log"), "ab") as log:
            producer = [sys.executable, "-m", "sluice", "demo-producer", "--landing-root", landing, "--loop",
                        "--interval", "60"]
            children.append(subprocess.Popen(producer, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
            topic = os.environ.get("SLUICE_DEMO_KAFKA_TOPIC")
            if topic:  # `make run KAFKA=1`: the same events to the local broker's topic, for events_kafka_bronze
                to_kafka = [sys.executable, "-m", "sluice", "demo-producer", "--topic", topic, "--kafka-connection",
                            "sluice_kafka", "--loop", "--interval", "60"]
                children.append(subprocess.Popen(to_kafka, stdin=subprocess.DEVNULL, stdout=log,
                                                 stderr=subprocess.STDOUT))
    for child in children:
        child.wait()
    for thread in threads:
        thread.join()
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# make clean


def tracked(checkout: str, path: str) -> bool:
    """Whether ``path`` is, or holds, a file under version control in ``checkout`` (False without git)."""
    try:
        listed = subprocess.run(["git", "-C", checkout, "ls-files", "--", path], capture_output=True, text=True)
    except OSError:
        return False
    return bool(listed.stdout.strip())


def refusal(path: str, resolved: str, checkout: str, is_tracked: Callable[[str], bool]) -> str | None:
    """Why `make clean` must not delete ``path`` (that resolves to ``resolved``), or None when it may."""
    inside = checkout.rstrip("/") + "/"
    if resolved == checkout:
        return f"{path}: is the checkout itself"
    if not resolved.startswith(inside):
        return f"{path}: resolves to {resolved}, outside the checkout {checkout}"
    relative = resolved[len(inside):]
    if relative.split("/", 1)[0] in (".venv", ".git"):
        return f"{path}: is or is inside {relative}"
    if is_tracked(resolved):
        return f"{path}: holds files under version control"
    return None


def clean(paths: Sequence[str], checkout: str) -> int:
    """`make clean`: deletes each path (symbolic links followed) if it is inside the checkout, is not .venv, .git or
    a folder holding files under version control; otherwise deletes nothing and says why."""
    root = os.path.realpath(checkout)
    delete = []
    refused = []
    for path in paths:
        resolved = os.path.realpath(os.path.join(root, path))
        reason = refusal(path, resolved, root, lambda resolved: tracked(root, resolved))
        if reason is None:
            delete.append(resolved)
        else:
            refused.append(reason)
    if refused:
        say("make clean: deleting nothing, because of:" + "".join(f"\n  {reason}" for reason in refused), error=True)
        return 1
    say("rm -rf " + " ".join(delete))
    for resolved in delete:
        try:
            if os.path.isdir(resolved) and not os.path.islink(resolved):
                shutil.rmtree(resolved)
            elif os.path.lexists(resolved):
                os.unlink(resolved)
        except OSError as error:
            say(f"make clean: {error}", error=True)
            return 1
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# The command line


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1
    if not 0 <= value < 86400:
        raise argparse.ArgumentTypeError(f"expected a number of seconds from 0 to 86400, got {text!r}")
    return value


def port_number(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}")
    return int(text)


def parser() -> argparse.ArgumentParser:
    arguments = argparse.ArgumentParser(prog="python -m sluice.cli.devserver", description=DESCRIPTION)
    commands = arguments.add_subparsers(dest="command", required=True)
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--airflow-home", default=os.environ.get("AIRFLOW_HOME"),
                       help="the Airflow home (default: $AIRFLOW_HOME)")
    where.add_argument("--data-root", default=os.environ.get("SLUICE_DATA_ROOT"),
                       help="the data root (default: $SLUICE_DATA_ROOT)")
    stopping = argparse.ArgumentParser(add_help=False)
    stopping.add_argument("--stop-timeout", type=seconds, default=30.0,
                          help="seconds each session gets to exit after SIGTERM, before SIGKILL (default: 30)")
    serve = commands.add_parser("run", parents=[where, stopping], help="Airflow, its DAGs on schedule, a producer")
    serve.add_argument("--host", default="127.0.0.1", help="the address of the UI and the REST API")
    serve.add_argument("--port", type=port_number, default=8080, help="their port")
    serve.add_argument("--warm", action="store_true", help="warm mode: the stream runs go to a resident Spark driver")
    serve.add_argument("--kafka", action="store_true",
                       help="a local Kafka broker, fed by the producer and read by the stream events_kafka_bronze")
    commands.add_parser("stop", parents=[where, stopping], help="stop exactly what `run` started")
    tidy = commands.add_parser("clean", parents=[where], help="delete the data, the Airflow home and the caches")
    tidy.add_argument("--checkout", default=os.getcwd(), help="the checkout that everything deleted must be inside")
    leader = commands.add_parser("session", help=argparse.SUPPRESS)
    leader.add_argument("name", choices=sorted(SESSIONS))
    return arguments


def main(argv: Sequence[str] | None = None) -> int:
    options = parser().parse_args(argv)
    if options.command == "session":
        return session(options.name)
    for option, name in (("airflow_home", "--airflow-home"), ("data_root", "--data-root")):
        if not getattr(options, option):
            parser().error(f"{name} is required when the environment does not set it")
    if options.command == "run":
        return run(Address(options.host, options.port), options.airflow_home, options.data_root, options.stop_timeout,
                   warm=options.warm, kafka=options.kafka)
    record = Path(options.airflow_home) / RECORD_NAME
    if options.command == "stop":
        return 0 if Stopper(record, options.airflow_home, options.stop_timeout).stop_all() else 1
    if read_record(record) and Stopper(record, options.airflow_home, 0).running():  # /proc only when recorded
        # Deleting the record under live sessions would leave them running with nothing that could stop them.
        say(f"make clean: make run is still running for {options.airflow_home}; 'make stop' first", error=True)
        return 1
    return clean([options.data_root, options.airflow_home, *CACHES], options.checkout)


if __name__ == "__main__":
    sys.exit(main())
