"""Warm mode: one resident Spark driver, the warm server, runs the streams on request, so a run pays no JVM start.

The server (``spark_apps/warm_server.py``, started by ``spark-submit`` once per deployment) holds one Spark
application with Sluice loaded. A run is one TCP connection to it: the client sends one request line, the server
answers with the run's log lines and ends with its summary, the same ``RunSummary`` a cold ``stream_runner.py`` run
prints. Everything else is the cold run's: the same runner code, the same checkpoint lock (held by the server's
process for the run), the same health gate before it (an Airflow task), the same summary and exit rules.

Each message is one line of UTF-8 JSON:

- request: ``{"protocol": 1, "token": ..., "command": "run" | "ping", "streams": [...], "run_id": ...,
  "engine": ..., "catalog": ..., "roots": {...}}``. The catalog and the roots are the client's, and only compared
  with the server's: a request never points the server at a path (a server serves one catalog and one set of roots,
  given when it starts).
- answers: ``{"log": "..."}`` any number of times, then one of ``{"summary": {...}}``, ``{"pong": {...}}``,
  ``{"refused": "..."}`` (the request cannot run as it is: not retryable) or ``{"error": "..."}`` (the server
  failed: retryable).

The connection is the run's lifeline: when the client goes away (its Airflow task was killed, or it crashed), the
server stops the run's queries and releases their locks, as killing a cold run's spark-submit does. When the server
goes away mid-run, the client fails retryably; the checkpoint makes the rerun exactly-once.

The token is a shared secret (``SLUICE_WARM_TOKEN`` for the server and the command line, the password of the
Airflow connection ``sluice_warm`` for the operators). It is compared in constant time and never logged or echoed.
This module uses the standard library only: a client starts no JVM and imports no pyspark.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.constants import DeltaEngine
from sluice.errors import SluiceError
from sluice.paths import Roots
from sluice.summary import RunSummary

PROTOCOL = 1
DEFAULT_PORT = 15041
TOKEN_ENV = "SLUICE_WARM_TOKEN"
ADDRESS_ENV = "SLUICE_WARM_ADDRESS"
CONNECTION_ID = "sluice_warm"
MIN_TOKEN_LENGTH = 24
MAX_REQUEST_BYTES = 64 * 1024
# The longest answer line a client reads: a summary of many streams with long errors is well under it.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
CONNECT_TIMEOUT_SECONDS = 10.0
COMMANDS = ("run", "ping")
# sluice.catalog.DEFAULT_CATALOG, without importing the catalog package (0.2 s): the client starts in under 0.1 s.
BUNDLED_CATALOG = Path(__file__).parent / "streams.yaml"
# An Airflow run's id is "<dag id>/<run id>/<task id>", each up to 250 characters.
_RUN_ID = re.compile(r"[\x20-\x7e]{1,1024}")
# TCP keepalive on both ends: a peer whose host vanished (a lost node, a partition) is noticed in about a minute,
# not never: a run has no read timeout, since it takes as long as it takes.
KEEPALIVE = {"TCP_KEEPIDLE": 30, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 3}
_STREAM = re.compile(r"[A-Za-z0-9_]{1,128}")


class WarmRefused(SluiceError):
    """The server refused a request (bad token, bad field, another catalog): a rerun cannot fix it."""


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

    def to_line(self, token: str) -> bytes:
        body = {"protocol": PROTOCOL, "token": token, "command": self.command, "streams": list(self.streams),
                "run_id": self.run_id, "engine": self.engine, "catalog": self.catalog,
                "roots": None if self.roots is None else self.roots.__dict__}
        return (json.dumps(body) + "\n").encode("utf-8")

    @classmethod
    def parse(cls, line: bytes, token: str) -> WarmRequest:
        """A request line, checked field by field; :class:`WarmRefused` names the first bad field."""
        if len(line) > MAX_REQUEST_BYTES or not line.endswith(b"\n"):
            raise WarmRefused(f"a request is one line of at most {MAX_REQUEST_BYTES} bytes")
        try:
            body = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise WarmRefused("a request is one line of JSON") from None
        if not isinstance(body, dict):
            raise WarmRefused("a request is a JSON object")
        sent = body.get("token")
        if not isinstance(sent, str) or not hmac.compare_digest(sent.encode("utf-8"), token.encode("utf-8")):
            raise WarmRefused("token: not this server's token")
        if body.get("protocol") != PROTOCOL:
            raise WarmRefused(f"protocol: this server speaks protocol {PROTOCOL}, got {body.get('protocol')!r}")
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


def answer(**message: Any) -> bytes:
    return (json.dumps(message, default=str) + "\n").encode("utf-8")


@contextlib.contextmanager
def _connection(address: WarmAddress) -> Iterator[socket.socket]:
    try:
        sock = socket.create_connection((address.host, address.port), timeout=CONNECT_TIMEOUT_SECONDS)
    except OSError as exc:
        raise WarmServerGone(f"cannot reach the warm server at {address}: {exc.strerror or exc}; start it "
                             "(spark_apps/warm_server.py, `make run WARM=1`) or unset warm mode") from None
    try:
        sock.settimeout(None)  # a run takes as long as it takes; the server answers, closes, or its host vanishes
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


def _answers(sock: socket.socket, address: WarmAddress) -> Iterator[dict[str, Any]]:
    with sock.makefile("rb") as reader:
        while True:
            try:
                line = reader.readline(MAX_ANSWER_BYTES)
            except OSError as exc:
                raise WarmServerGone(f"the warm server at {address} went away: {exc}") from None
            if not line:
                return
            try:
                message = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise WarmServerGone(f"the warm server at {address} sent a line that is not JSON") from None
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
        try:
            sock.sendall(body.to_line(address.token))
        except OSError as exc:
            raise WarmServerGone(f"the warm server at {address} went away: {exc}") from None
        for message in _answers(sock, address):
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
