"""The credentials of a run, through its streams' kinds: which Airflow connections the streams name, how each one
becomes the environment of the driver (:class:`~sluice.kinds.base.Credentials`), and every secret a run was given,
for masking in the task log and scrubbing from the errors a run reports.

The operators, the stream and backfill runners and the warm server call this module; none of them names a kind, so
a kind with credentials of its own needs nothing outside its own modules and its registry lines.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sluice.connections.secrets import REDACTED, environment_secrets, scrub
from sluice.errors import SluiceError
from sluice.kinds import SINK_KINDS, SOURCE_KINDS
from sluice.kinds.base import Credentials
from sluice.model.stream import StreamSpec

__all__ = ["REDACTED", "ConnectionEnvironment", "airflow_environment", "connection_environments", "needed",
           "run_environment", "run_secrets", "scrub", "scrub_secrets"]


def _all_credentials() -> list[Credentials]:
    found = [kind.credentials for kind in SOURCE_KINDS.values() if kind.credentials]
    found += [kind.credentials for kind in SINK_KINDS.values() if kind.credentials]
    return list({id(credentials): credentials for credentials in found}.values())


def needed(streams: Iterable[StreamSpec]) -> dict[str, Credentials]:
    """Each Airflow connection the streams' sources and sinks name, with the credentials of the kind that names
    it; a connection named by a kind without credentials is left out."""
    found: dict[str, Credentials] = {}
    for stream in streams:
        for conn_id, credentials in ((stream.source.connection, SOURCE_KINDS[stream.source.type].credentials),
                                     (stream.sink.connection, SINK_KINDS[stream.sink.format].credentials)):
            if conn_id and credentials is not None:
                found.setdefault(conn_id, credentials)
    return found


@dataclass(frozen=True)
class ConnectionEnvironment:
    """One connection as the driver's environment: its variables, the secrets in them, and what a log may say."""

    conn_id: str
    env: dict[str, str]
    secrets: list[str]
    description: str

    def __repr__(self) -> str:
        return f"ConnectionEnvironment(conn_id={self.conn_id!r}, env={sorted(self.env)}, {self.description})"


def connection_environments(streams: Iterable[StreamSpec]) -> list[ConnectionEnvironment]:
    """Each connection the streams need, read from Airflow now; a connection that is not defined or not usable
    raises :class:`~sluice.errors.SluiceError` naming it."""
    found = []
    for conn_id, credentials in needed(streams).items():
        env = credentials.environment(conn_id)
        found.append(ConnectionEnvironment(conn_id, env, credentials.secrets(env), credentials.described(env)))
    return found


def run_environment(streams: Iterable[StreamSpec]) -> dict[str, str]:
    """The driver's environment for every connection the streams need (:func:`connection_environments`)."""
    return {name: value for found in connection_environments(streams) for name, value in found.env.items()}


def airflow_environment(streams: Iterable[StreamSpec]) -> dict[str, str]:
    """:func:`run_environment` for a warm server, which no task starts and which reads it before each run, so that
    a rotated password takes effect at the next run: a connection Airflow does not define is left to the
    environment the server was started with; the stream's run names it if it is missing there too."""
    env: dict[str, str] = {}
    for conn_id, credentials in needed(streams).items():
        try:
            env.update(credentials.environment(conn_id))
        except (SluiceError, KeyError, ValueError):
            continue
    return env


def run_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Every form of every secret in ``environ`` (this process's environment by default): the kinds' credentials,
    object storage's, and variables whose names say they hold one."""
    environ = os.environ if environ is None else environ
    secrets = [secret for credentials in _all_credentials() for secret in credentials.secrets(environ)]
    return list(dict.fromkeys([*secrets, *environment_secrets(environ)]))


def scrub_secrets(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every secret of the run replaced by ``***``."""
    secrets = run_secrets(environ)
    return scrub(text, secrets) if secrets else text
