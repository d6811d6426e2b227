"""Warm mode: one resident Spark driver, the warm server, runs the streams on request, so a run pays no JVM start.

The server (``spark_apps/warm_server.py``, started by ``spark-submit`` once per deployment) holds one Spark
application with Sluice loaded. A run is one TCP connection to it: the client sends one request line, the server
answers with the run's log lines and ends with its summary, the same ``RunSummary`` a cold ``stream_runner.py`` run
prints. Everything else is the cold run's: the same runner code, the same checkpoint lock (held by the server's
process for the run), the same health gate before it (an Airflow task), the same summary and exit rules.

A connection starts with a handshake in which each end proves that it holds the shared token without sending it
(HMAC-SHA256 challenge and response, both ways), and the server proves it first:

1. client: ``{"protocol": 2, "nonce": <64 hex>}``: nothing secret.
2. server: ``{"protocol": 2, "nonce": <64 hex>, "proof": HMAC(token, "server" + both nonces)}``. The client checks the
   proof and, when it does not match, sends nothing more: something else on the port (a local user who took it while
   the server warmed up, or a server with another token) never sees a request and cannot answer one.
3. Every later line, both ways, is ``<mac> <json>``: an HMAC, with a key of this connection's own (from the token and
   both nonces), of a counter per direction and the JSON. The client's first line proves it holds the token; a line
   that is forged, replayed from another connection, reordered or changed is refused, so a summary that did not come
   from the server is never reported.

Why not a Unix socket in a private folder, which would make impersonation impossible on one machine: the compose
stack's runs reach the server over the network (another container), and one protocol for both keeps one code path.

The server gives a connection :data:`REQUEST_DEADLINE_SECONDS` in all to finish its handshake and send its request
(a client that trickles bytes is cut off then), and keeps at most :data:`MAX_UNAUTHENTICATED` connections that have
not yet proven themselves; more are closed at once.

The messages (the JSON of step 3):

- request: ``{"command": "run" | "ping", "streams": [...], "run_id": ..., "engine": ..., "catalog": ...,
  "roots": {...}}``. The catalog and the roots are the client's, and only compared with the server's: a request
  never points the server at a path (a server serves one catalog and one set of roots, given when it starts).
- answers: ``{"log": "..."}`` any number of times, then one of ``{"summary": {...}}``, ``{"pong": {...}}``,
  ``{"refused": "..."}`` (the request cannot run as it is: not retryable) or ``{"error": "..."}`` (the server
  failed: retryable).

The connection is the run's lifeline: when the client goes away (its Airflow task was killed, or it crashed), the
server stops the run's queries and releases their locks, as killing a cold run's spark-submit does; a request for
the same streams waits for that before it runs. When the server goes away mid-run, the client fails retryably; the
checkpoint makes the rerun exactly-once.

The token is a shared secret (``SLUICE_WARM_TOKEN`` for the server and the command line, the password of the
Airflow connection ``sluice_warm`` for the operators). It never crosses the connection, and is never logged.
This module uses the standard library only: a client starts no JVM and imports no pyspark.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.constants import DeltaEngine
from sluice.errors import SluiceError
from sluice.paths import Roots
from sluice.summary import RunSummary

PROTOCOL = 2
DEFAULT_PORT = 15041
TOKEN_ENV = "SLUICE_WARM_TOKEN"
ADDRESS_ENV = "SLUICE_WARM_ADDRESS"
CONNECTION_ID = "sluice_warm"
MIN_TOKEN_LENGTH = 24
MAX_HELLO_BYTES = 1024
MAX_REQUEST_BYTES = 64 * 1024
# The longest answer line a client reads: a summary of many streams with long errors is well under it.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
CONNECT_TIMEOUT_SECONDS = 10.0
# Seconds a connection has, from its accept, to prove itself and send its request; then it is closed.
REQUEST_DEADLINE_SECONDS = 30.0
# Connections that have not proven themselves yet, at most; more are closed at once.
MAX_UNAUTHENTICATED = 16
COMMANDS = ("run", "ping")
# sluice.catalog.DEFAULT_CATALOG, without importing the catalog package (0.2 s): the client starts in under 0.1 s.
BUNDLED_CATALOG = Path(__file__).parent / "streams.yaml"
# An Airflow run's id is "<dag id>/<run id>/<task id>", each up to 250 characters.
_RUN_ID = re.compile(r"[\x20-\x7e]{1,1024}")
# TCP keepalive on both ends: a peer whose host vanished (a lost node, a partition) is noticed in about a minute,
# not never: a run has no read timeout, since it takes as long as it takes.
KEEPALIVE = {"TCP_KEEPIDLE": 30, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 3}
_STREAM = re.compile(r"[A-Za-z0-9_]{1,128}")
_NONCE = re.compile(r"[0-9a-f]{64}")
_MAC_LENGTH = 64  # hex of SHA-256


class WarmRefused(SluiceError):
    """The server refused a request (bad token, bad field, another catalog), or the server is not the warm server:
    a rerun cannot fix it."""


class WarmServerGone(SluiceError):
    """The server could not be reached, or went away before the run's summary: retryable."""


@dataclass(frozen=True)
class WarmAddress:
    """Where a warm server listens, and its token (never part of ``str``)."""

    host: str
    port: int
    token: str = field(repr=False)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, address: str, token: str) -> WarmAddress:
        """``host:port``, ``[ipv6]:port``, or a host alone (an IPv6 address alone too) on the default port."""
        text = address.strip()
        if text.startswith("["):
            host, _, rest = text[1:].partition("]")
            port = rest.removeprefix(":")
        elif text.count(":") == 1:
            host, _, port = text.partition(":")
        else:
            host, port = text, ""
        try:
            number = int(port) if port else DEFAULT_PORT
        except ValueError:
            raise SluiceError(f"warm server address {address!r}: the port is not a number") from None
        if not host or not 0 < number < 65536:
            raise SluiceError(f"warm server address {address!r}: expected host:port")
        return cls(host=host, port=number, token=token)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> WarmAddress:
        environ = dict(os.environ if environ is None else environ)
        return cls.parse(environ.get(ADDRESS_ENV, f"127.0.0.1:{DEFAULT_PORT}"), require_token(environ.get(TOKEN_ENV)))


def require_token(token: str | None, where: str = TOKEN_ENV) -> str:
    if not token or len(token) < MIN_TOKEN_LENGTH:
        raise SluiceError(f"{where}: the warm server's token must be set, at least {MIN_TOKEN_LENGTH} characters "
                          "(for example: python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return token


@dataclass(frozen=True)
class WarmRequest:
    """One request: run ``streams`` (as ``stream_runner.py --stream ...`` would), or ping."""

    command: str
    streams: tuple[str, ...] = ()
    run_id: str | None = None
    engine: str | None = None
    catalog: str | None = None
    roots: Roots | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"command": self.command, "streams": list(self.streams), "run_id": self.run_id, "engine": self.engine,
                "catalog": self.catalog, "roots": None if self.roots is None else self.roots.__dict__}

    @classmethod
    def parse(cls, body: object) -> WarmRequest:
        """A request's JSON (authenticated already), checked field by field; :class:`WarmRefused` names the first bad
        field."""
        if not isinstance(body, dict):
            raise WarmRefused("a request is a JSON object")
        command = body.get("command")
        if command not in COMMANDS:
            raise WarmRefused(f"command: one of {', '.join(COMMANDS)}, got {command!r}")
        if command == "ping":
            return cls(command="ping")
        streams = body.get("streams")
        if (not isinstance(streams, list) or not streams
                or not all(isinstance(name, str) and _STREAM.fullmatch(name) for name in streams)):
            raise WarmRefused(f"streams: a non-empty list of catalog stream names, got {streams!r}")
        run_id = body.get("run_id")
        if run_id is not None and not (isinstance(run_id, str) and _RUN_ID.fullmatch(run_id)):
            raise WarmRefused("run_id: printable ASCII, 1 to 1024 characters")
        engine = body.get("engine")
        if engine is not None and engine not in {item.value for item in DeltaEngine}:
            raise WarmRefused(f"engine: one of {', '.join(item.value for item in DeltaEngine)}, got {engine!r}")
        catalog, roots = body.get("catalog"), body.get("roots")
        if not isinstance(catalog, str):
            raise WarmRefused("catalog: the client's catalog path is required")
        if not (isinstance(roots, dict) and set(roots) == set(Roots.__dataclass_fields__)
                and all(isinstance(value, str) for value in roots.values())):
            raise WarmRefused(f"roots: an object with {', '.join(sorted(Roots.__dataclass_fields__))}")
        return cls(command="run", streams=tuple(streams), run_id=run_id, engine=engine, catalog=catalog,
                   roots=Roots(**roots))


# ---------------------------------------------------------------------------------------------------------------------
# The handshake and the authenticated lines


def _mac(key: bytes, *parts: bytes | str) -> str:
    return hmac.new(key, b"\0".join(part.encode() if isinstance(part, str) else part for part in parts),
                    hashlib.sha256).hexdigest()


def server_proof(token: str, client_nonce: str, server_nonce: str) -> str:
    """What only a holder of ``token`` can answer to ``client_nonce`` (labelled, so that it is no client's proof)."""
    return _mac(token.encode("utf-8"), "sluice-warm server proof", client_nonce, server_nonce)


class Channel:
    """One connection's authenticated lines, after the handshake: ``<mac> <json>``, the MAC keyed by this
    connection's own key and counting the lines of each direction, so that none can be forged, replayed or moved."""

    def __init__(self, token: str, client_nonce: str, server_nonce: str, *, side: str) -> None:
        self._key = bytes.fromhex(_mac(token.encode("utf-8"), "sluice-warm session", client_nonce, server_nonce))
        self._side, self._other = side, "server" if side == "client" else "client"
        self._sent = self._received = 0

    def seal(self, message: dict[str, Any]) -> bytes:
        body = json.dumps(message, default=str)
        mac = _mac(self._key, self._side, str(self._sent), body)
        self._sent += 1
        return f"{mac} {body}\n".encode()

    def open(self, line: bytes) -> Any:
        """The JSON of an authenticated line; :class:`WarmRefused` when its MAC is not this connection's."""
        mac, _, body = line.rstrip(b"\n").partition(b" ")
        try:
            text = body.decode("utf-8")
            expected = _mac(self._key, self._other, str(self._received), text)
            if not hmac.compare_digest(mac.decode("ascii"), expected):
                raise ValueError
            self._received += 1
            return json.loads(text)
        except (UnicodeDecodeError, ValueError):  # JSONDecodeError is a ValueError
            raise WarmRefused(f"a line from the {self._other} is not signed with this connection's key (another "
                              "token, or a forged line)") from None


class LineReader:
    """Reads lines from a socket, each at most ``limit`` bytes, and all of them before ``deadline`` (a monotonic
    time) when given: a peer that trickles bytes cannot hold the reader longer."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, bytearray()

    def line(self, limit: int, deadline: float | None = None) -> bytes:
        """The next line with its newline; what is left (no newline) at the end of the stream; b"" at its end.
        Raises :class:`WarmRefused` for a line over ``limit``, TimeoutError at the deadline, OSError."""
        searched = 0
        while (end := self.buffer.find(b"\n", searched)) < 0:
            if len(self.buffer) >= limit:
                raise WarmRefused(f"a line is at most {limit} bytes")
            searched = len(self.buffer)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the deadline passed")
                self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                rest = bytes(self.buffer)
                self.buffer.clear()
                return rest
            self.buffer += chunk
        if end + 1 > limit:
            raise WarmRefused(f"a line is at most {limit} bytes")
        found = bytes(self.buffer[:end + 1])
        del self.buffer[:end + 1]
        return found


def _plain(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        message = None
    return message if isinstance(message, dict) else {}


def hello() -> tuple[str, bytes]:
    """A client's nonce, and the line that opens its handshake."""
    nonce = secrets.token_hex(32)
    return nonce, (json.dumps({"protocol": PROTOCOL, "nonce": nonce}) + "\n").encode("utf-8")


def server_handshake(sock: socket.socket, token: str, deadline: float) -> tuple[Channel, Any] | None:
    """The server's side of a connection up to its request: answer the client's hello with this server's proof, then
    read the request, which must be signed with the token. Returns the connection's channel and the request's JSON,
    for :meth:`WarmRequest.parse` (a refusal then goes back sealed); None when the client closed without a word (a
    port probe). Raises :class:`WarmRefused` for a bad hello or an unsigned request, TimeoutError when the client does
    not finish by ``deadline``, OSError."""
    reader = LineReader(sock)
    line = reader.line(MAX_HELLO_BYTES, deadline)
    if not line:
        return None
    greeting = _plain(line)
    if greeting.get("protocol") != PROTOCOL or not _NONCE.fullmatch(str(greeting.get("nonce"))):
        raise WarmRefused(f"protocol: this server speaks protocol {PROTOCOL} (a hello with a nonce of 64 hex digits)")
    client_nonce, server_nonce = str(greeting["nonce"]), secrets.token_hex(32)
    sock.sendall((json.dumps({"protocol": PROTOCOL, "nonce": server_nonce,
                              "proof": server_proof(token, client_nonce, server_nonce)}) + "\n").encode("utf-8"))
    channel = Channel(token, client_nonce, server_nonce, side="server")
    line = reader.line(MAX_REQUEST_BYTES + _MAC_LENGTH + 1, deadline)
    if not line.endswith(b"\n"):
        raise WarmRefused("token: the client did not send a signed request")
    try:
        return channel, channel.open(line)
    except WarmRefused:
        raise WarmRefused("token: the request is not signed with this server's token") from None


@contextlib.contextmanager
def _connection(address: WarmAddress) -> Iterator[socket.socket]:
    try:
        sock = socket.create_connection((address.host, address.port), timeout=CONNECT_TIMEOUT_SECONDS)
    except OSError as exc:
        raise WarmServerGone(f"cannot reach the warm server at {address}: {exc.strerror or exc}; start it "
                             "(spark_apps/warm_server.py, `make run WARM=1`) or unset warm mode") from None
    try:
        keep_alive(sock)
        yield sock
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # the server sees its client go now, whoever still holds the socket
        sock.close()


def keep_alive(sock: socket.socket) -> None:
    """Turn on TCP keepalive with :data:`KEEPALIVE`'s timings, where the platform has them."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in KEEPALIVE.items():
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if hasattr(socket, "TCP_USER_TIMEOUT"):  # data sent and unacknowledged this long: the peer is gone
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 60_000)


def _handshake(sock: socket.socket, reader: LineReader, address: WarmAddress) -> Channel:
    """The client's side: the server must prove it holds the token before anything else is sent."""
    nonce, opening = hello()
    deadline = time.monotonic() + CONNECT_TIMEOUT_SECONDS
    try:
        sock.sendall(opening)
        reply = _plain(reader.line(MAX_HELLO_BYTES, deadline))
    except WarmRefused:
        reply = {}
    except OSError as exc:  # TimeoutError included: a server that does not answer its hello may be busy starting
        raise WarmServerGone(f"the warm server at {address} did not answer the handshake: {exc}") from None
    server_nonce, proof = str(reply.get("nonce")), reply.get("proof")
    if not (_NONCE.fullmatch(server_nonce) and isinstance(proof, str)
            and hmac.compare_digest(proof, server_proof(address.token, nonce, server_nonce))):
        raise WarmRefused(f"the server at {address} did not prove that it holds the warm server's token: it is "
                          "another program, or a warm server with another token; nothing was sent to it")
    sock.settimeout(None)  # a run takes as long as it takes; the server answers, closes, or its host vanishes
    return Channel(address.token, nonce, server_nonce, side="client")


def _answers(reader: LineReader, channel: Channel, address: WarmAddress) -> Iterator[dict[str, Any]]:
    while True:
        try:
            line = reader.line(MAX_ANSWER_BYTES)
        except OSError as exc:
            raise WarmServerGone(f"the warm server at {address} went away: {exc}") from None
        except WarmRefused:
            raise WarmServerGone(f"the warm server at {address} sent a line over {MAX_ANSWER_BYTES} bytes") from None
        if not line.endswith(b"\n"):  # the end of the stream, or a torn last line
            return
        message = channel.open(line)
        if isinstance(message, dict):
            yield message


def request(address: WarmAddress, body: WarmRequest, on_log: Callable[[str], None] | None = None,
            on_connected: Callable[[socket.socket], None] | None = None) -> dict[str, Any]:
    """Send ``body`` and return the server's final answer (``summary`` or ``pong``); log lines go to ``on_log``.
    ``on_connected`` gets the socket, so that a caller can close it to cancel the run (an operator's ``on_kill``).
    """
    with _connection(address) as sock:
        if on_connected is not None:
            on_connected(sock)
        reader = LineReader(sock)
        channel = _handshake(sock, reader, address)
        try:
            sock.sendall(channel.seal(body.to_dict()))
        except OSError as exc:
            raise WarmServerGone(f"the warm server at {address} went away: {exc}") from None
        for message in _answers(reader, channel, address):
            if "log" in message:
                if on_log is not None:
                    on_log(str(message["log"]))
            elif "refused" in message:
                raise WarmRefused(f"the warm server at {address} refused the request: {message['refused']}")
            elif "error" in message:  # the server failed, not the request: a retry may succeed
                raise WarmServerGone(f"the warm server at {address} failed during the run: {message['error']}")
            else:
                return message
    raise WarmServerGone(f"the warm server at {address} closed the connection before the run's summary (it stopped "
                         "or was killed); the checkpoint keeps the run exactly-once: rerun it")


def run(address: WarmAddress, streams: list[str], *, catalog: str, roots: Roots, run_id: str | None = None,
        engine: str | None = None, on_log: Callable[[str], None] | None = None,
        on_connected: Callable[[socket.socket], None] | None = None) -> RunSummary:
    """Run ``streams`` on the warm server and return the run's summary."""
    body = WarmRequest(command="run", streams=tuple(streams), run_id=run_id, engine=engine, catalog=catalog,
                       roots=roots)
    message = request(address, body, on_log, on_connected)
    if not isinstance(message.get("summary"), dict):
        raise WarmServerGone(f"the warm server at {address} answered without a summary: {sorted(message)}")
    return RunSummary.from_dict(message["summary"])


def ping(address: WarmAddress) -> dict[str, Any]:
    """The server's application id, catalog, roots and active runs."""
    message = request(address, WarmRequest(command="ping"))
    if not isinstance(message.get("pong"), dict):
        raise WarmServerGone(f"the warm server at {address} did not answer the ping: {sorted(message)}")
    return dict(message["pong"])
