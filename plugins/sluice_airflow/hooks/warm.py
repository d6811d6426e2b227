"""The deployment's warm server (:mod:`sluice.warm`) as a hook: its address from an Airflow connection, a run on it,
and the connection that a killed task closes, which stops the run."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from sluice.paths import Roots
from sluice.summary import RunSummary
from sluice.warm import CONNECTION_ID, WarmAddress


def warm_address(conn_id: str = CONNECTION_ID) -> WarmAddress | None:
    """The warm server of this deployment: the Airflow connection ``conn_id`` (host, port, and the token as its
    password), read in the worker at run time; None (a cold run through spark-submit) when it is not defined."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    from sluice.errors import SluiceError
    from sluice.warm import DEFAULT_PORT, require_token

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:  # any other error (the API server, a secrets backend) fails the task
        return None
    try:
        return WarmAddress(host=str(conn.host or "127.0.0.1"), port=int(conn.port or DEFAULT_PORT),
                           token=require_token(conn.password, where=f"connection {conn_id!r}: password"))
    except SluiceError as exc:
        raise AirflowFailException(str(exc)) from None


class WarmServerHook(BaseHook):
    """Runs streams on the warm server of the connection ``conn_id``. :meth:`close` (a task's ``on_kill``, from
    another thread) closes the run's connection, and the server stops the run; closed before the connection is
    made, the run never starts."""

    def __init__(self, conn_id: str = CONNECTION_ID) -> None:
        super().__init__()
        self.conn_id = conn_id
        self._connection: socket.socket | None = None
        self._closed = False

    def address(self) -> WarmAddress | None:
        return warm_address(self.conn_id)

    def run(self, address: WarmAddress, streams: list[str], *, catalog: str, roots: Roots, run_id: str,
            engine: str | None, on_log: Callable[[str], None]) -> RunSummary:
        """The run's summary; the server's log lines of the run go to ``on_log``. A refusal fails the task without
        retries; a server that went away mid-run is retried."""
        from sluice.warm import WarmRefused, WarmServerGone, run

        try:
            return run(address, streams, catalog=catalog, roots=roots, run_id=run_id, engine=engine, on_log=on_log,
                       on_connected=self._keep)
        except WarmRefused as exc:
            raise AirflowFailException(str(exc)) from None
        except WarmServerGone as exc:
            raise AirflowException(str(exc)) from None

    def _keep(self, connection: socket.socket) -> None:
        self._connection = connection
        if self._closed:  # killed while connecting: the server must not start the run
            self.close()

    def close(self) -> None:
        self._closed = True
        connection = self._connection
        if connection is not None:  # the server sees its client go, and stops the run's queries
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
            connection.close()
