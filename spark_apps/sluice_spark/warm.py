"""The warm server: one resident Spark driver that runs catalog streams on request (see :mod:`sluice.warm`).

A cold run starts a JVM, imports Sluice and its Python data sources, and plans its first query on a cold JIT: most
of a small run. The warm server pays that once. Each request runs in a thread of its own, on a new session of the
one Spark application (``SparkSession.newSession``: its own SQL settings and data source registrations, the shared
JVM and executors), through the same :func:`~sluice_spark.runner.run_streams` as ``stream_runner.py``.

Why not a Spark Connect server: on Spark 4.2 a Connect client's ``foreachBatch`` starts a Python process on the
server per query, and a Python data source writer starts one to plan and one to commit each batch; each costs about
2 s (measured on this project's machines, against 13 s for the whole cold run), so a warm run through Connect costs
about 0.35x a cold run, not the 0.25x this mode is for. Here the batch functions run in the driver's own Python.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import select
import signal
import socket
import socketserver
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from sluice.catalog import load_catalog
from sluice.constants import DeltaEngine
from sluice.errors import SluiceError
from sluice.kinds.credentials import airflow_environment, scrub_secrets
from sluice.paths import Roots
from sluice.summary import PhaseClock, RunSummary
from sluice.warm import (
    MAX_UNAUTHENTICATED,
    REQUEST_DEADLINE_SECONDS,
    Channel,
    WarmRefused,
    WarmRequest,
    keep_alive,
    server_handshake,
)
from sluice_spark.runner import run_or_refuse, scrubbed

log = logging.getLogger(__name__)
# How often a run's connection is checked for its client having gone away, in seconds.
CLIENT_CHECK_SECONDS = 0.2
SEND_TIMEOUT_SECONDS = 60.0
# Seconds a cancelled run's queries get to stop (a batch in flight finishes or is interrupted) before the server
# exits so that their locks are freed.
STOP_DEADLINE_SECONDS = 300


def same_place(mine: str, theirs: str) -> bool:
    """Whether two catalog paths or roots name the same place (local paths after resolving links)."""
    def normal(path: str) -> str:
        if "://" in path and not path.startswith("file://"):
            return path.rstrip("/")
        return os.path.realpath(path.removeprefix("file://"))

    return normal(mine) == normal(theirs)


@dataclass
class _Run:
    """A run in flight: its streams, its cancel, and whether its client has gone (polled from another request)."""

    name: str
    streams: frozenset[str]
    cancel: threading.Event
    client_gone: Callable[[], bool]
    ended: threading.Event = field(default_factory=threading.Event)


class WarmServer(socketserver.ThreadingTCPServer):
    """Serves :class:`~sluice.warm.WarmRequest` s for one catalog and one set of roots."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, spark: SparkSession, *, host: str, port: int, token: str, catalog: str, roots: Roots,
                 request_deadline: float = REQUEST_DEADLINE_SECONDS) -> None:
        super().__init__((host, port), _Connection)
        self.spark, self.token, self.catalog, self.roots = spark, token, catalog, roots
        self.request_deadline = request_deadline
        self.app_id = spark.sparkContext.applicationId
        self._runs: dict[str, _Run] = {}
        self._runs_lock = threading.Lock()
        self._counter = 0
        self._sessions: dict[tuple[str, ...], SparkSession] = {}
        # Taken at accept, before a thread is started, and given back once the client proved itself (or left): a
        # flood of connections that never do costs this many threads at most, each for one deadline at most.
        self.unauthenticated = threading.BoundedSemaphore(MAX_UNAUTHENTICATED)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.unauthenticated.acquire(blocking=False):
            log.warning("closed a connection from %s: %d others have not proven themselves yet", client_address[0],
                        MAX_UNAUTHENTICATED)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def session_for(self, streams: tuple[str, ...]) -> SparkSession:
        """The session that runs these streams, made once and kept: each new session registers a streaming query
        listener bus with the shared SparkContext that is never removed, so a session per run would pile them up.
        The streams' locks keep two runs of one set from using a session at once."""
        key = tuple(sorted(set(streams)))
        with self._runs_lock:
            if key not in self._sessions:
                self._sessions[key] = self.spark.newSession()
            return self._sessions[key]

    @contextlib.contextmanager
    def registered(self, streams: tuple[str, ...], cancel: threading.Event,
                   client_gone: Callable[[], bool]) -> Iterator[str]:
        with self._runs_lock:
            self._counter += 1
            run = _Run(f"warm-run-{self._counter}", frozenset(streams), cancel, client_gone)
            self._runs[run.name] = run
        try:
            yield run.name
        finally:
            with self._runs_lock:
                del self._runs[run.name]
            run.ended.set()

    def active_runs(self) -> int:
        with self._runs_lock:
            return len(self._runs)

    def cancel_all(self) -> None:
        with self._runs_lock:
            for run in self._runs.values():
                run.cancel.set()

    def await_cancelled(self, name: str, streams: tuple[str, ...], cancel: threading.Event) -> None:
        """Wait until the runs of these streams whose clients went away have ended, and so released the streams'
        locks: a run that starts right after a killed one (a retry, the next scheduled run) would otherwise be refused
        as LOCKED while the cancelled run stops its queries. A run whose client is still there is not waited for: its
        lock refuses this run, as it would a cold one."""
        deadline = time.monotonic() + STOP_DEADLINE_SECONDS
        announced: set[str] = set()
        while not cancel.is_set() and time.monotonic() < deadline:
            with self._runs_lock:
                others = [run for run in self._runs.values() if run.name != name and run.streams & set(streams)]
            stopping = [run for run in others if run.cancel.is_set() or run.client_gone()]
            if not stopping:
                return
            for run in stopping:
                run.cancel.set()  # its own connection sets it too, at its next look
                if run.name not in announced:
                    announced.add(run.name)
                    log.info("%s: waiting for %s, cancelled, to release the lock of %s", name, run.name,
                             ", ".join(sorted(run.streams & set(streams))))
            stopping[0].ended.wait(CLIENT_CHECK_SECONDS * 5)

    def refusal(self, request: WarmRequest) -> str | None:
        """Why this server cannot run ``request`` for its client: it serves another catalog or other roots."""
        assert request.catalog is not None and request.roots is not None
        if not same_place(self.catalog, request.catalog):
            return f"catalog: this server serves {self.catalog}, the client runs {request.catalog}"
        for name in Roots.__dataclass_fields__:
            mine, theirs = getattr(self.roots, name), getattr(request.roots, name)
            if not same_place(mine, theirs):
                return f"roots.{name}: this server serves {mine}, the client has {theirs}"
        return None

    def run(self, name: str, request: WarmRequest, cancel: threading.Event) -> RunSummary:
        """The request's run, on its streams' own session, once the cancelled runs of its streams have ended; a
        catalog or lock refusal becomes a failed summary."""
        clock = PhaseClock()
        self.await_cancelled(name, request.streams, cancel)
        spark = self.session_for(request.streams)
        catalog = load_catalog(self.catalog)  # read per run: an edited catalog takes effect at the next run
        streams = catalog.select(list(request.streams))
        catalog.check_roots(self.roots)
        # The streams' connections as a run task gives a cold run, read again from the server's Airflow connections
        # before each run: a rotated password, or a stream added since the server started, takes effect now.
        os.environ.update(airflow_environment(streams))
        clock.lap("catalog")
        return run_or_refuse(spark, catalog, list(request.streams), self.roots, run_id=request.run_id,
                             engine=DeltaEngine(request.engine) if request.engine else None, clock=clock,
                             cancel=cancel)


class _RunLog(logging.Handler):
    """Queues a run's log records, for its connection to send to the client: those of the run's thread and of its
    streams' lock heartbeats, without the secrets this process holds (a query's error may quote a Kafka option).
    Spark's own (JVM) log and the batch functions' stay in the server's log."""

    def __init__(self, thread: threading.Thread, streams: tuple[str, ...]) -> None:
        super().__init__(logging.INFO)
        self.thread, self.lines = thread, queue.SimpleQueue[str]()
        self.heartbeats = {f"sluice-lock-{name}" for name in streams}
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread.ident or record.threadName in self.heartbeats:
            self.lines.put(scrub_secrets(self.format(record)))


class _Connection(socketserver.StreamRequestHandler):
    server: WarmServer
    channel: Channel | None = None

    def handle(self) -> None:
        deadline = time.monotonic() + self.server.request_deadline
        try:
            try:
                keep_alive(self.connection)
                accepted = server_handshake(self.connection, self.server.token, deadline)
            finally:
                self.server.unauthenticated.release()
            if accepted is None:  # a port probe (a healthcheck) closes without a word
                return
            self.channel, body = accepted
            request = WarmRequest.parse(body)
            if request.command == "ping":
                self.send(pong={"app_id": self.server.app_id, "catalog": self.server.catalog,
                                "roots": self.server.roots.__dict__, "active_runs": self.server.active_runs(),
                                "pid": os.getpid()})
                return
            refusal = self.server.refusal(request)
            if refusal:
                raise WarmRefused(refusal)
        except (WarmRefused, OSError) as exc:  # TimeoutError included: the client missed the request's deadline
            log.warning("refused a request from %s: %s", self.client_address[0], exc or type(exc).__name__)
            with contextlib.suppress(OSError):
                self.send(refused=str(exc))
            return
        # A client that stops reading (frozen, or its host gone with data unacknowledged) counts as gone after this.
        self.connection.settimeout(SEND_TIMEOUT_SECONDS)
        self.serve_run(request)

    def send(self, **message: Any) -> None:
        """An answer, sealed with the connection's key; before the handshake, a plain line (only refusals)."""
        self.wfile.write(self.channel.seal(message) if self.channel is not None
                         else (json.dumps(message) + "\n").encode("utf-8"))
        self.wfile.flush()

    def serve_run(self, request: WarmRequest) -> None:
        cancel = threading.Event()
        result: dict[str, Any] = {}

        def target() -> None:
            log.info("%s: running %s", threading.current_thread().name, ", ".join(request.streams))
            try:
                result["summary"] = self.server.run(threading.current_thread().name, request, cancel)
            except SluiceError as exc:  # the catalog refused the request (an unknown stream, a bad root)
                result["refused"] = str(exc)
            except Exception as exc:  # the server failed (py4j, a stopped SparkContext): the client may retry
                log.exception("run of %s failed", list(request.streams))
                result["error"] = scrub_secrets(f"{type(exc).__name__}: {exc}")[:2000]

        with self.server.registered(request.streams, cancel, self._client_gone) as name:
            thread = threading.Thread(target=target, name=name, daemon=True)
            handler = _RunLog(thread, request.streams)
            root = logging.getLogger()
            log.info("%s: %s for %s", name, list(request.streams), self.client_address[0])
            handler.lines.put(f"warm server {self.server.app_id} (pid {os.getpid()}): {name} runs "
                              f"{', '.join(request.streams)}")
            root.addHandler(handler)
            try:
                thread.start()
                gone, cancelled_at = False, None
                while thread.is_alive():
                    thread.join(CLIENT_CHECK_SECONDS)
                    gone = gone or self._drain(handler) or self._client_gone()
                    if gone and not cancel.is_set():
                        log.warning("%s: the client went away; stopping its queries", name)
                        cancel.set()
                    if cancel.is_set():
                        cancelled_at = cancelled_at or time.monotonic()
                        if time.monotonic() - cancelled_at > STOP_DEADLINE_SECONDS:
                            # Its locks stay fresh while this process lives, so no later run of its streams could
                            # start: end the process, and a dead pid frees them (the checkpoint keeps them exact).
                            log.critical("%s: its queries did not stop within %d s of the cancel; exiting", name,
                                         STOP_DEADLINE_SECONDS)
                            os._exit(1)
                gone = gone or self._drain(handler)
            finally:
                root.removeHandler(handler)
        log.info("%s: done", name)
        if not gone:  # the run is over and no longer counted as active when its client reads the answer
            with contextlib.suppress(OSError):
                if "summary" in result:
                    self.send(summary=json.loads(scrubbed(result["summary"]).to_json()))
                elif "refused" in result:
                    self.send(refused=result["refused"])
                else:
                    self.send(error=result.get("error", "the run ended without a summary"))

    def _drain(self, handler: _RunLog) -> bool:
        """Send the run's queued log lines; True when the client is gone."""
        try:
            while True:
                self.send(log=handler.lines.get_nowait())
        except queue.Empty:
            return False
        except OSError:
            return True

    def _client_gone(self) -> bool:
        """True when the client closed its end (it sends nothing after its request), or its host vanished. Polled,
        not read: a read of a socket with a (send) timeout would wait for data first."""
        poller = select.poll()
        poller.register(self.connection.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
        events = poller.poll(0)
        if not events:
            return False
        if events[0][1] & (select.POLLHUP | select.POLLERR):
            return True
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True


# The first run of a fresh JVM plans and compiles everything once (about 5 s more than the next run, measured): the
# server pays that at start, on a throwaway stream that takes the runner's common paths (JSON with a malformed line,
# a SQL transform, rules, a partitioned table and its dead-letter table, the run log).
WARM_UP_CATALOG = """
version: 1
streams:
  - name: warm_up
    source:
      type: files
      format: json
      path: events
      schema:
        id: bigint not null
        kind: string
        at: timestamp not null
        amount: decimal(12,2)
    transform: {sql: "SELECT *, lower(kind) AS kind_lower, to_date(at) AS day FROM source"}
    expectations:
      positive: {check: "amount IS NULL OR amount >= 0", on_violation: quarantine}
    sink: {format: delta, path: warm_up, partition_by: [day], mode: append, engine: rs}
    dead_letter: {path: _dead_letter/warm_up}
    checkpoint: warm_up
    schedule: "0 0 * * *"
"""
WARM_UP_RECORDS = (
    '{"id": 1, "kind": "A", "at": "2026-01-01T00:00:00Z", "amount": 1.5}\n'
    '{"id": 2, "kind": "B", "at": "2026-01-01T00:01:00Z", "amount": -1}\n'
    '{"id": 3, "kind": "C", "at": "2026-01-01T00:02:00Z", "extra": true}\n'
    'not json\n'
)


def warm_up(spark: SparkSession) -> None:
    """Run a throwaway stream on temporary roots, so that the first real run is as fast as the next."""
    from sluice_spark.runner import run_streams

    with tempfile.TemporaryDirectory(prefix="sluice-warm-up-") as folder:
        roots = Roots(landing=f"{folder}/landing", lake=f"{folder}/lake", checkpoints=f"{folder}/checkpoints")
        Path(roots.landing, "events").mkdir(parents=True)
        Path(roots.landing, "events", "one.json").write_text(WARM_UP_RECORDS, encoding="utf-8")
        catalog_path = Path(folder, "catalog.yaml")
        catalog_path.write_text(WARM_UP_CATALOG, encoding="utf-8")
        summary = run_streams(spark.newSession(), load_catalog(catalog_path), ["warm_up"], roots)
        if not summary.ok:
            raise SluiceError(f"the warm server's warm-up run failed: {summary.streams[0].error}")


# Seconds the runs get to end after the JVM went away, before the driver exits anyway.
ORPHAN_GRACE_SECONDS = 10.0


def _exit_with_the_jvm(server: WarmServer, jvm_pid: int) -> None:
    """End this driver when the JVM that started it (its parent: spark-submit's) is gone. A SIGTERM that reaches the
    JVM alone (``docker stop``, a kill of spark-submit's pid) would otherwise leave a driver that still takes runs
    it can no longer run."""
    while os.getppid() == jvm_pid:
        threading.Event().wait(1.0)
    log.error("the Spark JVM (pid %d) is gone: cancelling %d run(s) and exiting", jvm_pid, server.active_runs())
    server.cancel_all()
    threading.Thread(target=server.shutdown, daemon=True).start()
    deadline = time.monotonic() + ORPHAN_GRACE_SECONDS
    while server.active_runs() and time.monotonic() < deadline:
        threading.Event().wait(0.2)
    os._exit(1)


def serve(spark: SparkSession, *, host: str, port: int, token: str, catalog: str, roots: Roots,
          request_deadline: float = REQUEST_DEADLINE_SECONDS) -> None:
    """Serve until SIGTERM or SIGINT; then cancel the runs in flight, wait for them, and return."""
    warm_up(spark)
    server = WarmServer(spark, host=host, port=port, token=token, catalog=catalog, roots=roots,
                        request_deadline=request_deadline)

    def stopping(signum: int) -> None:
        log.info("signal %d: cancelling %d run(s) and stopping", signum, server.active_runs())
        server.cancel_all()
        server.shutdown()

    def stop(signum: int, _frame: Any) -> None:
        # In a thread: the main thread may hold a lock the handler's work needs (it runs between its bytecodes).
        threading.Thread(target=stopping, args=(signum,), daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=_exit_with_the_jvm, args=(server, os.getppid()), name="sluice-warm-watchdog",
                     daemon=True).start()
    print(f"SLUICE_WARM_READY {host}:{server.server_address[1]} {server.app_id}", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        deadline = time.monotonic() + STOP_DEADLINE_SECONDS
        while server.active_runs() and time.monotonic() < deadline:
            threading.Event().wait(0.2)
