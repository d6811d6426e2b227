"""Warm mode: a real warm server (``spark-submit spark_apps/warm_server.py``) serves runs to real clients.

The runs are checked against the oracle computed from the files with the json module, as the cold runs are; the
crash test kills the client in the middle of a batch (the server must stop the run and free the stream), then the
server itself (SIGKILL of its process group), and a run on a new server must leave the exact tables.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.constants import RunStatus
from sluice.paths import Roots
from sluice.storage import runlog
from sluice.storage.delta import read_table
from sluice.storage.lock import read_lock
from sluice.warm import MAX_UNAUTHENTICATED, WarmAddress, WarmRefused, WarmServerGone, hello, ping, run
from sluice_spark.runner import CANCELLED
from tests.helpers import events_stream, expected_events, roots_in, write_catalog
from tests.spark.test_ingest import bronze
from tests.warm_server import Server

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[2]
NOW = dt.datetime(2026, 11, 23, 8, 0, tzinfo=dt.timezone.utc)
CLIENT = [sys.executable, "-m", "sluice", "warm", "run", "--stream", "events"]
# The world server's deadline for a connection to prove itself and send its request: short, for the trickle test.
REQUEST_DEADLINE = 3.0


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path, Roots]]:
    folder = tmp_path_factory.mktemp("warm")
    clicks = events_stream("clicks", trigger={"max_files_per_trigger": 1})
    clicks["source"] = {**clicks["source"], "path": "clicks/events"}
    catalog = write_catalog(folder, events_stream(trigger={"max_files_per_trigger": 1}), clicks)
    roots = roots_in(folder)
    server = Server(folder, catalog, roots, args=("--request-deadline", str(REQUEST_DEADLINE)))
    try:
        yield server, catalog, roots
    finally:
        server.stop()


def assert_exact(catalog: Path, roots: Roots) -> None:
    stream = load_catalog(catalog).get("events")
    expected_good, expected_bad = expected_events(Path(roots.landing) / "events")
    assert bronze(stream.sink_path(roots)) == expected_good
    assert read_table(stream.dead_letter_table_path(roots)).num_rows == expected_bad


def test_warm_runs_are_exactly_once_and_match_the_oracle(world: tuple[Server, Path, Roots]) -> None:
    server, catalog, roots = world
    producer = DemoProducer(roots.landing, seed=5, malformed_rate=0.05)
    for index in range(2):
        producer.events_file(lines=80, now=NOW + dt.timedelta(minutes=index))
    logs: list[str] = []
    first = run(server.address, ["events"], catalog=str(catalog), roots=roots, run_id="warm-1", on_log=logs.append)
    assert first.ok and first.streams[0].batches == 2 and first.streams[0].run_id == "warm-1"
    assert any(f"warm server {first.app_id}" in line and "runs events" in line for line in logs)
    assert_exact(catalog, roots)

    # The command-line client, a new file: only it is read, as the next scheduled run would.
    producer.events_file(lines=80, now=NOW + dt.timedelta(minutes=5))
    done = subprocess.run(CLIENT, env=server.client_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.split("SLUICE_RUN_SUMMARY ", 1)[1])
    assert summary["app_id"] == first.app_id and summary["streams"][0]["batches"] == 1
    assert_exact(catalog, roots)
    # Nothing new: an idle run commits nothing.
    idle = run(server.address, ["events"], catalog=str(catalog), roots=roots)
    assert idle.ok and idle.streams[0].batches == 0
    assert read_lock(load_catalog(catalog).get("events").checkpoint_path(roots)) is None
    assert ping(server.address)["active_runs"] == 0


def test_two_streams_run_side_by_side_on_one_server(world: tuple[Server, Path, Roots]) -> None:
    server, catalog, roots = world
    DemoProducer(roots.landing, seed=6).events_file(lines=70, now=NOW + dt.timedelta(minutes=30))
    clicks = DemoProducer(Path(roots.landing) / "clicks", seed=7, malformed_rate=0.1)
    for index in range(2):
        clicks.events_file(lines=50, now=NOW + dt.timedelta(minutes=index))
    summaries: dict[str, Any] = {}
    logs: dict[str, list[str]] = {"events": [], "clicks": []}

    def one(name: str) -> None:
        summaries[name] = run(server.address, [name], catalog=str(catalog), roots=roots, on_log=logs[name].append)

    threads = [threading.Thread(target=one, args=(name,)) for name in logs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert summaries["events"].ok and summaries["events"].streams[0].batches == 1
    assert summaries["clicks"].ok and summaries["clicks"].streams[0].batches == 2
    for name, other in (("events", "clicks"), ("clicks", "events")):  # each client gets its own run's log lines
        assert any(f": running {name}" in line for line in logs[name])
        assert not any(f": running {other}" in line for line in logs[name])
    assert_exact(catalog, roots)
    stream = load_catalog(catalog).get("clicks")
    expected_good, expected_bad = expected_events(Path(roots.landing) / "clicks" / "events")
    assert bronze(stream.sink_path(roots)) == expected_good
    assert read_table(stream.dead_letter_table_path(roots)).num_rows == expected_bad


def test_the_server_refuses_what_it_cannot_run(world: tuple[Server, Path, Roots], tmp_path: Path) -> None:
    server, catalog, roots = world
    wrong = WarmAddress(server.address.host, server.address.port, "x" * 32)
    with pytest.raises(WarmRefused, match="token"):
        ping(wrong)
    elsewhere = Roots(roots.landing, str(tmp_path), roots.checkpoints)
    with pytest.raises(WarmRefused, match=r"roots\.lake"):
        run(server.address, ["events"], catalog=str(catalog), roots=elsewhere)
    with pytest.raises(WarmRefused, match="catalog"):
        run(server.address, ["events"], catalog=str(tmp_path / "other.yaml"), roots=roots)
    with pytest.raises(WarmRefused, match="nope"):
        run(server.address, ["nope"], catalog=str(catalog), roots=roots)
    with pytest.raises(WarmRefused, match="streams"):
        run(server.address, ["../x"], catalog=str(catalog), roots=roots)
    # The token is never echoed, and a server that is not there is a retryable error.
    assert server.token not in server.output()
    with pytest.raises(WarmServerGone, match="cannot reach"):
        ping(WarmAddress("127.0.0.1", 1, server.token))


def closed_by_the_server(connection: socket.socket, timeout: float) -> bool:
    """Whether the server closes ``connection`` within ``timeout`` seconds (after a refusal, if it sends one)."""
    connection.settimeout(timeout)
    try:
        while connection.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_a_client_that_trickles_bytes_is_cut_off_at_the_request_deadline(world: tuple[Server, Path, Roots]) -> None:
    """A byte every 0.2 s resets no timeout: the connection has one deadline for its handshake and request."""
    server, _, _ = world
    _, opening = hello()
    with socket.create_connection((server.address.host, server.address.port), timeout=10) as trickler:
        sent = 0
        for byte in opening[:-1] * 10:  # about 26 s of bytes at this pace, never a whole line
            try:
                trickler.sendall(bytes([byte]))
            except OSError:
                break
            sent += 1
            if closed_by_the_server(trickler, 0.2):
                break
        else:
            pytest.fail("the server kept a trickling client past its deadline")
    assert sent < len(opening) * 10
    assert ping(server.address)["active_runs"] == 0


def test_connections_that_do_not_prove_themselves_are_capped(world: tuple[Server, Path, Roots]) -> None:
    server, _, _ = world
    address = (server.address.host, server.address.port)
    # Each holds one of the slots until the deadline.
    silent = [socket.create_connection(address, timeout=10) for _ in range(MAX_UNAUTHENTICATED)]
    try:
        with socket.create_connection(address, timeout=10) as extra:
            # The server's word that the cap closed it, not a time: the deadline closes every connection too, and a
            # loaded machine may take a second to accept the extra one.
            server.wait_for_line("others have not proven themselves yet")
            assert closed_by_the_server(extra, 30), "a connection past the cap was kept"
    finally:
        for connection in silent:
            connection.close()
    assert ping_once_free(server.address)["active_runs"] == 0  # the slots are free again


def ping_once_free(address: WarmAddress, timeout: float = 60) -> dict[str, Any]:
    """A ping once a slot is free: the server gives back the slot of a connection its client closed when the
    connection's thread sees the end of the stream, which can be after the next connection is accepted (and closed
    for the cap)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ping(address)
        except WarmServerGone:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_killed_client_stops_its_run_and_a_killed_server_loses_nothing(tmp_path: Path) -> None:
    catalog = write_catalog(tmp_path, events_stream(trigger={"max_files_per_trigger": 1}))
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=9, malformed_rate=0.08)
    for index in range(3):  # three batches: 0, 1 and 2
        producer.events_file(lines=60, now=NOW + dt.timedelta(minutes=index))
    faults = tmp_path / "faults"
    faults.mkdir()
    server = Server(tmp_path, catalog, roots, ("SLUICE_FAULT_POINT", "before_commit:1,after_commit:2"),
                    ("SLUICE_FAULT_DIR", str(faults)))
    try:
        # The client dies while batch 1 waits to commit: the server must stop the run and free the stream.
        client = subprocess.Popen(CLIENT, env=server.client_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        deadline = time.monotonic() + 240
        while not (faults / "before_commit.reached").exists():
            assert client.poll() is None and time.monotonic() < deadline, server.output()[-3000:]
            time.sleep(0.05)
        os.killpg(client.pid, signal.SIGKILL)
        client.wait(timeout=30)
        server.wait_for_line("the client went away; stopping its queries")
        # The run stops its query (which waits for the batch in flight) before the batch may go on: released earlier,
        # batch 1 would commit and batch 2 start before the run's next look at the cancel.
        server.wait_for_line("query events: the run was cancelled")

        # The next run comes while the cancelled one still holds the stream's lock: it waits for it, not refused as
        # LOCKED. It takes the stream up again, and the server dies after batch 2's Delta commits.
        client = subprocess.Popen(CLIENT, env=server.client_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
        server.wait_for_line("warm-run-2: waiting for warm-run-1, cancelled, to release the lock of events")
        (faults / "before_commit.release").touch()
        server.wait_for_line("warm-run-1: done")
        # The run log says the cancelled run did not finish, and why: a stopped query is no success.
        [cancelled] = runlog.runs(roots.lake, "events")
        assert cancelled["status"] == RunStatus.FAILED and cancelled["error"] == CANCELLED
        deadline = time.monotonic() + 240  # batch 2's own wait, not what is left of batch 1's
        while not (faults / "after_commit.reached").exists():
            assert client.poll() is None and time.monotonic() < deadline, server.output()[-3000:]
            time.sleep(0.05)
        server.kill()
        output, _ = client.communicate(timeout=60)
        assert client.returncode == 3 and "closed the connection before the run's summary" in output
    finally:
        server.kill()

    # A new server, the same roots: the rerun finishes the stream, and every row is there exactly once.
    server = Server(tmp_path, catalog, roots)
    try:
        summary = run(server.address, ["events"], catalog=str(catalog), roots=roots)
        assert summary.ok, summary.streams[0].error
        assert summary.streams[0].status == RunStatus.SUCCEEDED
        assert_exact(catalog, roots)
    finally:
        server.stop()

