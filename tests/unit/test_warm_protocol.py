"""Warm mode's protocol and client (:mod:`sluice.warm`), without Spark: request checks field by field, and what the
client makes of a server that refuses, answers, or goes away. The real server is tested in tests/spark/test_warm.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from sluice.errors import SluiceError
from sluice.paths import Roots
from sluice.warm import (
    MAX_HELLO_BYTES,
    MAX_REQUEST_BYTES,
    PROTOCOL,
    Channel,
    WarmAddress,
    WarmRefused,
    WarmRequest,
    WarmServerGone,
    hello,
    ping,
    require_token,
    run,
    server_handshake,
    server_proof,
)

TOKEN = "t" * 32
ROOTS = Roots(landing="/data/landing", lake="/data/lake", checkpoints="/data/checkpoints")
Reply = Callable[[socket.socket, Channel, WarmRequest], None]


def body(**changes: object) -> dict[str, object]:
    return {"command": "run", "streams": ["events"], "run_id": "r1", "engine": None, "catalog": "/c.yaml",
            "roots": ROOTS.__dict__, **changes}


def test_a_good_request_round_trips() -> None:
    request = WarmRequest(command="run", streams=("events", "orders"), run_id="dag/run/task", engine="rs",
                          catalog="/c.yaml", roots=ROOTS)
    assert WarmRequest.parse(json.loads(json.dumps(request.to_dict()))) == request
    assert WarmRequest.parse(WarmRequest(command="ping").to_dict()).command == "ping"


@pytest.mark.parametrize(("raw", "field"), [
    (body(command="exec"), "command"),
    (body(streams=[]), "streams"),
    (body(streams="events"), "streams"),
    (body(streams=["../etc"]), "streams"),
    (body(streams=["a b"]), "streams"),
    (body(run_id="x\ny"), "run_id"),
    (body(run_id="r" * 1025), "run_id"),
    (body(engine="spark"), "engine"),
    (body(catalog=None), "catalog"),
    (body(roots={"lake": "/x"}), "roots"),
    (body(roots={**ROOTS.__dict__, "landing": 3}), "roots"),
    ([1], "object"),
])
def test_a_bad_request_is_refused_naming_its_field(raw: object, field: str) -> None:
    with pytest.raises(WarmRefused, match=field):
        WarmRequest.parse(raw)


def test_the_token_is_never_part_of_an_address_string() -> None:
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
def listener() -> Iterator[Callable[[Callable[[socket.socket], None]], WarmAddress]]:
    """A one-connection server on 127.0.0.1 that does what the test says with its connection."""
    threads: list[threading.Thread] = []
    listeners: list[socket.socket] = []

    def start(serve: Callable[[socket.socket], None]) -> WarmAddress:
        listening = socket.create_server(("127.0.0.1", 0))
        listeners.append(listening)

        def accept_one() -> None:
            connection, _ = listening.accept()
            with connection:
                serve(connection)

        thread = threading.Thread(target=accept_one, daemon=True)
        thread.start()
        threads.append(thread)
        return WarmAddress("127.0.0.1", listening.getsockname()[1], TOKEN)

    yield start
    for thread in threads:
        thread.join(timeout=10)
    for listening in listeners:
        listening.close()


@pytest.fixture
def fake_server(listener: Callable[..., WarmAddress]) -> Callable[[Reply], WarmAddress]:
    """A server that speaks the real protocol's server side (:func:`server_handshake`) and then answers what the test
    writes: it stands in for the warm server only to put the client in front of each kind of answer (the real one is
    tested with Spark)."""
    def start(reply: Reply) -> WarmAddress:
        def serve(connection: socket.socket) -> None:
            accepted = server_handshake(connection, TOKEN, time.monotonic() + 10)
            assert accepted is not None
            channel, body = accepted
            reply(connection, channel, WarmRequest.parse(body))

        return listener(serve)

    return start


def test_the_client_reads_logs_then_the_summary(fake_server: Callable[[Reply], WarmAddress]) -> None:
    seen: dict[str, object] = {}

    def reply(connection: socket.socket, channel: Channel, request: WarmRequest) -> None:
        seen["request"] = request
        summary = {"app_id": "local-1", "streams": [{"stream": "events", "status": "succeeded", "batches": 2}]}
        connection.sendall(channel.seal({"log": "first"}) + channel.seal({"log": "second"})
                           + channel.seal({"summary": summary}))

    address = fake_server(reply)
    logs: list[str] = []
    summary = run(address, ["events"], catalog="/c.yaml", roots=ROOTS, run_id="r1", on_log=logs.append)
    assert logs == ["first", "second"]
    assert summary.ok and summary.app_id == "local-1" and summary.streams[0].batches == 2
    assert seen["request"] == WarmRequest(command="run", streams=("events",), run_id="r1", catalog="/c.yaml",
                                          roots=ROOTS)


def test_a_refusal_is_not_retryable(fake_server: Callable[[Reply], WarmAddress]) -> None:
    address = fake_server(lambda connection, channel, _: connection.sendall(
        channel.seal({"refused": "streams: unknown stream 'x'"})))
    with pytest.raises(WarmRefused, match="unknown stream 'x'"):
        run(address, ["x"], catalog="/c.yaml", roots=ROOTS)


def test_a_server_that_goes_away_mid_run_is_retryable(fake_server: Callable[[Reply], WarmAddress]) -> None:
    address = fake_server(lambda connection, channel, _: connection.sendall(channel.seal({"log": "batch 0"})))
    with pytest.raises(WarmServerGone, match="closed the connection before the run's summary"):
        run(address, ["events"], catalog="/c.yaml", roots=ROOTS)


def test_a_server_that_fails_is_retryable_and_a_refusal_is_not(fake_server: Callable[[Reply], WarmAddress]) -> None:
    address = fake_server(lambda connection, channel, _: connection.sendall(
        channel.seal({"error": "Py4JError: gateway closed"})))
    with pytest.raises(WarmServerGone, match="failed during the run: Py4JError"):
        run(address, ["events"], catalog="/c.yaml", roots=ROOTS)


FORGED_SUMMARY = {"summary": {"app_id": "forged", "streams": [{"stream": "events", "status": "succeeded"}]}}


def replay_of_a_real_reply() -> bytes:
    """A real server's answer to another client's hello: its proof is for that client's nonce."""
    nonce, _ = hello()
    server_nonce = "b" * 64
    proof = server_proof(TOKEN, nonce, server_nonce)
    return (json.dumps({"protocol": PROTOCOL, "nonce": server_nonce, "proof": proof}) + "\n").encode()


IMPOSTOR_REPLIES = {
    "a forged summary": (json.dumps(FORGED_SUMMARY) + "\n").encode(),
    "a signed-looking forged summary": b"0" * 64 + b" " + json.dumps(FORGED_SUMMARY).encode() + b"\n",
    "a proof made with another token": (json.dumps({"protocol": PROTOCOL, "nonce": "a" * 64, "proof": server_proof(
        "u" * 32, "c" * 64, "a" * 64)}) + "\n").encode(),
    "a replayed proof": replay_of_a_real_reply(),
    "a proof that is not a string": (json.dumps({"protocol": PROTOCOL, "nonce": "a" * 64, "proof": 7}) + "\n").encode(),
    "an old server's refusal": b'{"refused": "token: not this server\'s token"}\n',
    "a line without an end": b"x" * (MAX_HELLO_BYTES + 10),
}


@pytest.mark.parametrize("reply", IMPOSTOR_REPLIES.values(), ids=IMPOSTOR_REPLIES.keys())
def test_an_impostor_on_the_port_never_gets_the_token_and_its_summary_is_refused(
        listener: Callable[..., WarmAddress], reply: bytes) -> None:
    """Whatever took the port (a local user, while the server warms up) sees the client's hello and nothing else: not
    the token, not a request; and what it answers is refused, never read as a run's summary."""
    received = bytearray()

    def impostor(connection: socket.socket) -> None:
        connection.settimeout(10)
        received.extend(connection.recv(65536))  # the hello
        connection.sendall(reply + json.dumps(FORGED_SUMMARY).encode() + b"\n")
        while chunk := connection.recv(65536):  # whatever else the client sends, until it closes
            received.extend(chunk)

    address = listener(impostor)
    with pytest.raises(WarmRefused, match="did not prove that it holds the warm server's token"):
        run(address, ["events"], catalog="/c.yaml", roots=ROOTS, run_id="r1")
    text = received.decode()
    assert TOKEN not in text and "events" not in text and "/c.yaml" not in text
    assert set(json.loads(text)) == {"protocol", "nonce"}, "the client sent only its hello"


def test_an_answer_changed_on_the_way_is_refused(fake_server: Callable[[Reply], WarmAddress]) -> None:
    def tampered(connection: socket.socket, channel: Channel, _: WarmRequest) -> None:
        line = channel.seal(FORGED_SUMMARY)
        connection.sendall(line.replace(b"forged", b"forgex"))

    with pytest.raises(WarmRefused, match="not signed with this connection's key"):
        run(fake_server(tampered), ["events"], catalog="/c.yaml", roots=ROOTS)

    def replayed(connection: socket.socket, channel: Channel, _: WarmRequest) -> None:
        first = channel.seal({"log": "once"})
        connection.sendall(first + first)  # the second copy has the first's counter

    with pytest.raises(WarmRefused, match="not signed"):
        run(fake_server(replayed), ["events"], catalog="/c.yaml", roots=ROOTS)


def client_hello(connection: socket.socket) -> tuple[str, dict[str, object]]:
    nonce, line = hello()
    connection.sendall(line)
    return nonce, json.loads(connection.makefile("rb").readline())


@pytest.mark.parametrize("token", ["u" * 32, TOKEN[:-1] + "u"])
def test_the_server_refuses_a_request_not_signed_with_its_token(token: str) -> None:
    """A client that goes on after the server's proof without the token: its request is refused by name."""
    def client(connection: socket.socket) -> None:
        nonce, reply = client_hello(connection)
        connection.sendall(Channel(token, nonce, str(reply["nonce"]), side="client").seal(
            WarmRequest(command="ping").to_dict()))

    with pytest.raises(WarmRefused, match="token: the request is not signed with this server's token"):
        handshake_with(client)


def handshake_with(client: Callable[[socket.socket], None]) -> tuple[Channel, object] | None:
    """The server's side of a handshake with ``client`` (run in a thread on the other end of a socket pair)."""
    server_end, client_end = socket.socketpair()
    with server_end, client_end:
        thread = threading.Thread(target=client, args=(client_end,))
        thread.start()
        try:
            return server_handshake(server_end, TOKEN, time.monotonic() + 10)
        finally:
            thread.join(timeout=10)


def test_a_request_replayed_on_another_connection_is_refused() -> None:
    recorded: list[bytes] = []

    def record(connection: socket.socket) -> None:
        nonce, reply = client_hello(connection)
        recorded.append(Channel(TOKEN, nonce, str(reply["nonce"]), side="client").seal(
            WarmRequest(command="ping").to_dict()))
        connection.sendall(recorded[0])

    def replay(connection: socket.socket) -> None:
        client_hello(connection)
        connection.sendall(recorded[0])

    accepted = handshake_with(record)
    assert accepted is not None and WarmRequest.parse(accepted[1]).command == "ping"
    with pytest.raises(WarmRefused, match="token"):
        handshake_with(replay)


@pytest.mark.parametrize("opening", [
    b'{"protocol": 1, "token": "' + TOKEN.encode() + b'", "command": "ping"}\n',
    b'{"protocol": 2, "nonce": "short"}\n',
    b"not json\n",
    b"x" * (MAX_HELLO_BYTES + 1),
])
def test_a_bad_hello_is_refused_before_the_server_proves_anything(opening: bytes) -> None:
    server_end, client_end = socket.socketpair()
    with server_end, client_end:
        client_end.sendall(opening)
        with pytest.raises(WarmRefused, match=r"protocol|at most"):
            server_handshake(server_end, TOKEN, time.monotonic() + 10)
        client_end.setblocking(False)
        with pytest.raises(BlockingIOError):
            client_end.recv(1)  # the server sent nothing: no proof to collect


def test_a_client_that_trickles_bytes_is_cut_off_at_the_deadline() -> None:
    """One overall deadline, not one per read: a byte every 20 ms would keep a per-read timeout waiting forever."""
    server_end, client_end = socket.socketpair()
    stop = threading.Event()
    _, line = hello()

    def trickle() -> None:
        for byte in line * 100:  # 100 hellos' worth: about 2 minutes at this pace
            if stop.wait(0.02):
                return
            try:
                client_end.send(bytes([byte]))
            except OSError:
                return

    thread = threading.Thread(target=trickle)
    thread.start()
    try:
        with pytest.raises(TimeoutError):
            server_handshake(server_end, TOKEN, time.monotonic() + 0.5)
    finally:
        stop.set()
        thread.join(timeout=10)
        server_end.close()
        client_end.close()


def test_ipv6_addresses() -> None:
    assert WarmAddress.parse("[::1]:15050", TOKEN) == WarmAddress("::1", 15050, TOKEN)
    assert WarmAddress.parse("::1", TOKEN) == WarmAddress("::1", 15041, TOKEN)


def test_an_airflow_run_id_fits() -> None:
    run_id = f"{'d' * 250}/{'r' * 250}/{'t' * 250}"
    request = WarmRequest(command="run", streams=("events",), run_id=run_id, catalog="/c.yaml", roots=ROOTS)
    sender, receiver = (Channel(TOKEN, "c" * 64, "s" * 64, side=side) for side in ("client", "server"))
    line = sender.seal(request.to_dict())
    assert len(line) < MAX_REQUEST_BYTES
    assert WarmRequest.parse(receiver.open(line)).run_id == run_id


def test_no_server_is_retryable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(WarmServerGone, match="cannot reach the warm server"):
        ping(WarmAddress("127.0.0.1", port, TOKEN))


def test_a_warm_server_reads_the_streams_connections_from_airflow(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    from sluice.catalog import load_catalog
    from sluice.connections.kafka import env_name
    from sluice.kinds.credentials import airflow_environment
    from sluice.model.stream import StreamSpec

    def define(password: str) -> None:
        monkeypatch.setenv("AIRFLOW_CONN_WARM_KAFKA", json.dumps(
            {"conn_type": "kafka", "login": "sluice", "password": password, "extra": {
                "bootstrap.servers": "kafka:9092", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}}))

    def naming(conn_id: str) -> list[StreamSpec]:
        bundled = yaml.safe_load((Path(__file__).resolve().parents[2] / "include/sluice/streams_kafka.yaml")
                                 .read_text())
        bundled["streams"][0]["source"]["connection"] = conn_id
        path = tmp_path / f"{conn_id}.yaml"
        path.write_text(yaml.safe_dump(bundled))
        return list(load_catalog(str(path)))

    define("p4ss")
    catalog = naming("warm_kafka")
    env = airflow_environment([*catalog, *naming("not_defined")])
    assert set(env) == {env_name("warm_kafka")}  # an undefined connection is left to the server's environment
    options = json.loads(env[env_name("warm_kafka")])
    assert options["kafka.bootstrap.servers"] == "kafka:9092" and 'password="p4ss"' in options["kafka.sasl.jaas.config"]
    define("rotated")  # read again before each run: a rotated password takes effect at the next one
    assert 'password="rotated"' in json.loads(airflow_environment(catalog)[env_name("warm_kafka")])[
        "kafka.sasl.jaas.config"]
    define("rotated")  # read again before each run: a rotated password takes effect at the next one
    assert 'password="rotated"' in json.loads(airflow_environment(catalog)[env_name("warm_kafka")])[
        "kafka.sasl.jaas.config"]
