"""The credentials a task hands to what it runs, read from Airflow connections in the worker at run time (never
while a DAG file is parsed), each secret registered with Airflow's masker before anything is logged.

- :class:`StorageConnectionHook`: the object store's credentials (``sluice_storage``), as the environment every
  reader of the store takes (:mod:`sluice.connections.storage`);
- :class:`StreamConnectionsHook`: the connections the streams' kinds need, as their kinds declare them
  (:mod:`sluice.kinds.credentials`). It names no kind.
"""

from __future__ import annotations

from collections.abc import Iterable

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from sluice.connections.storage import DEFAULT_CONNECTION as STORAGE_CONNECTION
from sluice.errors import SluiceError
from sluice.model.stream import StreamSpec


class StorageConnectionHook(BaseHook):
    """The object store's credentials from the Airflow connection ``conn_id`` (aws, wasb/adls or
    google_cloud_platform); without it, the machine's own credentials are used."""

    def __init__(self, conn_id: str = STORAGE_CONNECTION) -> None:
        super().__init__()
        self.conn_id = conn_id

    def environment(self, where: Iterable[str]) -> dict[str, str]:
        """The connection as the environment the store's readers take; empty when every place in ``where`` is
        local or the connection is not defined. A connection of another type fails the task without retries."""
        from airflow.sdk.log import mask_secret

        from sluice.connections.storage import connection_environment, described, secrets_of
        from sluice.storage.store import is_local

        if all(is_local(place) for place in where):
            return {}
        try:
            env = connection_environment(self.conn_id)
        except SluiceError as exc:
            raise AirflowFailException(f"connection {self.conn_id!r}: {exc}") from None
        if env is None:
            self.log.info("No connection %r: the object store is reached with this machine's credentials",
                          self.conn_id)
            return {}
        for secret in secrets_of(env):
            mask_secret(secret)
        self.log.info("Object storage through connection %r: %s", self.conn_id, described(env))
        return env


class StreamConnectionsHook(BaseHook):
    """The Airflow connections the streams' sources and sinks name, as the driver's secret environment: the
    variables each kind declares (:class:`sluice.kinds.base.Credentials`)."""

    def __init__(self, streams: Iterable[StreamSpec]) -> None:
        super().__init__()
        self.streams = list(streams)

    def environment(self) -> dict[str, str]:
        from airflow.sdk.log import mask_secret

        from sluice.kinds.credentials import connection_environments

        try:
            found = connection_environments(self.streams)
        except SluiceError as exc:
            raise AirflowException(str(exc)) from None
        env: dict[str, str] = {}
        for connection in found:
            for secret in connection.secrets:
                mask_secret(secret)
            self.log.info("Connection %s: %s", connection.conn_id, connection.description)
            env.update(connection.env)
        return env
