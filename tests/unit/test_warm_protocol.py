"""Warm mode's protocol and client (:mod:`sluice.warm`), without Spark: request checks field by field, and what the
client makes of a server that refuses, answers, or goes away. The real server is tested in tests/spark/test_warm.py.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from sluice.errors import SluiceError
from sluice.paths import Roots
from sluice.warm import (
    MAX_REQUEST_BYTES,
    PROTOCOL,
    WarmAddress,
    WarmRefused,
    WarmRequest,
    WarmServerGone,
    answer,
    ping,
    require_token,
    run,
)

TOKEN = "t" * 32
ROOTS = Roots(landing="/data/landing", lake="/data/lake", checkpoints="/data/checkpoints")


def line(**changes: object) -> bytes:
    body = {"protocol": PROTOCOL, "token": TOKEN, "command": "run", "streams": ["events"], "run_id": "r1",
            "engine": None, "catalog": "/c.yaml", "roots": ROOTS.__dict__, **changes}
    return (json.dumps(body) + "\n").encode()


def test_a_good_request_round_trips() -> None:
    request = WarmRequest(command="run", streams=("events", "orders"), run_id="dag/run/task", engine="rs",
                          catalog="/c.yaml", roots=ROOTS)
    assert WarmRequest.parse(request.to_line(TOKEN), TOKEN) == request
    assert WarmRequest.parse(WarmRequest(command="ping").to_line(TOKEN), TOKEN).command == "ping"


@pytest.mark.parametrize(("raw", "field"), [
    (line(token="u" * 32), "token"),
    (line(token=None), "token"),
    (line(protocol=2), "protocol"),
    (line(command="exec"), "command"),
    (line(streams=[]), "streams"),
    (line(streams="events"), "streams"),
    (line(streams=["../etc"]), "streams"),
    (line(streams=["a b"]), "streams"),
    (line(run_id="x\ny"), "run_id"),
    (line(run_id="r" * 1025), "run_id"),
    (line(engine="spark"), "engine"),
    (line(catalog=None), "catalog"),
    (line(roots={"lake": "/x"}), "roots"),
    (line(roots={**ROOTS.__dict__, "landing": 3}), "roots"),
    (b"not json\n", "JSON"),
    (b"[1]\n", "object"),
    (line()[:-1], "one line"),
    (line(run_id="r" * 10) + b" " * MAX_REQUEST_BYTES, "one line"),
])
def test_a_bad_request_is_refused_naming_its_field(raw: bytes, field: str) -> None:
    with pytest.raises(WarmRefused, match=field):
        WarmRequest.parse(raw, TOKEN)


def test_the_token_is_checked_before_any_field_and_never_echoed() -> None:
    with pytest.raises(WarmRefused) as refused:
        WarmRequest.parse(line(token="u" * 32, command="exec"), TOKEN)
    assert "token" in str(refused.value) and "u" * 32 not in str(refused.value)
    assert TOKEN not in repr(WarmAddress("h", 1, TOKEN)) and str(WarmAddress("h", 1, TOKEN)) == "h:1"


def test_the_command_line_client_defaults_to_the_bundled_catalog() -> None:
    from sluice.catalog import DEFAULT_CATALOG
    from sluice.warm import BUNDLED_CATALOG

    assert BUNDLED_CATALOG == DEFAULT_CATALOG


def test_addresses_and_tokens() -> None:
    assert WarmAddress.parse("10.0.0.5:15050", TOKEN) == WarmAddress("10.0.0.5", 15050, TOKEN)
    assert WarmAddress.parse("spark-warm", TOKEN).port == 15041
    for bad in ("host:port", ":15041", "host:0", "host:70000"):
        with pytest.raises(SluiceError, match="warm server address"):
            WarmAddress.parse(bad, TOKEN)
    for bad in (None, "", "short"):
        with pytest.raises(SluiceError, match="at least 24 characters"):
            require_token(bad)


@pytest.fixture
def fake_server() -> Iterator[Callable[[Callable[[socket.socket, bytes], None]], WarmAddress]]:
    """A one-connection server on 127.0.0.1 whose answer the test writes: it stands in for the warm server only to
    put the client in front of each kind of answer (the real one is tested with Spark)."""
    threads: list[threading.Thread] = []
    listeners: list[socket.socket] = []

    def start(reply: Callable[[socket.socket, bytes], None]) -> WarmAddress:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def serve() -> None:
            connection, _ = listener.accept()
            with connection:
                request = connection.makefile("rb").readline()
                reply(connection, request)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        threads.append(thread)
        return WarmAddress("127.0.0.1", listener.getsockname()[1], TOKEN)

    yield start
    for thread in threads:
        thread.join(timeout=10)
    for listener in listeners:
        listener.close()


def test_the_client_reads_logs_then_the_summary(fake_server: Callable[..., WarmAddress]) -> None:
    seen: dict[str, object] = {}

    def reply(connection: socket.socket, request: bytes) -> None:
        seen["request"] = WarmRequest.parse(request, TOKEN)
        summary = {"app_id": "local-1", "streams": [{"stream": "events", "status": "succeeded", "batches": 2}]}
        connection.sendall(answer(log="first") + answer(log="second") + answer(summary=summary))

    address = fake_server(reply)
    logs: list[str] = []
    summary = run(address, ["events"], catalog="/c.yaml", roots=ROOTS, run_id="r1", on_log=logs.append)
    assert logs == ["first", "second"]
    assert summary.ok and summary.app_id == "local-1" and summary.streams[0].batches == 2
    assert seen["request"] == WarmRequest(command="run", streams=("events",), run_id="r1", catalog="/c.yaml",
                                          roots=ROOTS)


def test_a_refusal_is_not_retryable(fake_server: Callable[..., WarmAddress]) -> None:
    address = fake_server(lambda connection, _: connection.sendall(answer(refused="streams: unknown stream 'x'")))
    with pytest.raises(WarmRefused, match="unknown stream 'x'"):
        run(address, ["x"], catalog="/c.yaml", roots=ROOTS)


def test_a_server_that_goes_away_mid_run_is_retryable(fake_server: Callable[..., WarmAddress]) -> None:
    address = fake_server(lambda connection, _: connection.sendall(answer(log="batch 0")))
    with pytest.raises(WarmServerGone, match="closed the connection before the run's summary"):
        run(address, ["events"], catalog="/c.yaml", roots=ROOTS)
    address = fake_server(lambda connection, _: connection.sendall(b"garbage\n"))
    with pytest.raises(WarmServerGone, match="not JSON"):
        ping(address)


def test_a_server_that_fails_is_retryable_and_a_refusal_is_not(fake_server: Callable[..., WarmAddress]) -> None:
    address = fake_server(lambda connection, _: connection.sendall(answer(error="Py4JError: gateway closed")))
    with pytest.raises(WarmServerGone, match="failed during the run: Py4JError"):
        run(address, ["events"], catalog="/c.yaml", roots=ROOTS)


def test_ipv6_addresses() -> None:
    assert WarmAddress.parse("[::1]:15050", TOKEN) == WarmAddress("::1", 15050, TOKEN)
    assert WarmAddress.parse("::1", TOKEN) == WarmAddress("::1", 15041, TOKEN)


def test_an_airflow_run_id_fits() -> None:
    run_id = f"{'d' * 250}/{'r' * 250}/{'t' * 250}"
    request = WarmRequest(command="run", streams=("events",), run_id=run_id, catalog="/c.yaml", roots=ROOTS)
    assert WarmRequest.parse(request.to_line(TOKEN), TOKEN).run_id == run_id


def test_no_server_is_retryable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(WarmServerGone, match="cannot reach the warm server"):
        ping(WarmAddress("127.0.0.1", port, TOKEN))


def test_a_warm_server_reads_kafka_options_from_airflow_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.connections.kafka import airflow_environment, env_name

    def define(password: str) -> None:
        monkeypatch.setenv("AIRFLOW_CONN_WARM_KAFKA", json.dumps(
            {"conn_type": "kafka", "login": "sluice", "password": password, "extra": {
                "bootstrap.servers": "kafka:9092", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}}))

    define("p4ss")
    env = airflow_environment(["warm_kafka", "warm_kafka", "not_defined"])
    assert set(env) == {env_name("warm_kafka")}  # an undefined connection is left to the server's environment
    options = json.loads(env[env_name("warm_kafka")])
    assert options["kafka.bootstrap.servers"] == "kafka:9092" and 'password="p4ss"' in options["kafka.sasl.jaas.config"]
    define("rotated")  # read again before each run: a rotated password takes effect at the next one
    assert 'password="rotated"' in json.loads(airflow_environment(["warm_kafka"])[env_name("warm_kafka")])[
        "kafka.sasl.jaas.config"]
