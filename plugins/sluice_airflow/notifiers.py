"""Notifiers for lag alerts: a generic JSON webhook (Slack and Teams incoming webhooks take it), and email through
the SMTP provider. The task log always gets the alert too (the monitor logs it)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.error import HTTPError, URLError

from airflow.sdk import BaseNotifier
from airflow.sdk.exceptions import AirflowException

if TYPE_CHECKING:
    from airflow.sdk import Connection, Context

DEFAULT_WEBHOOK_CONN_ID = "sluice_alert_webhook"


def webhook_url(connection: Connection) -> str:
    """The URL an HTTP connection points at: ``host`` (a whole URL, or a host name with ``schema``, default https,
    and ``port``), then ``password`` and ``extra.endpoint`` as path segments. Keep a webhook's secret path (as
    Slack's ``T000/B000/XXXX``) in the password: Airflow masks passwords in logs, not hosts."""
    host = (connection.host or "").rstrip("/")
    if not host:
        raise AirflowException(f"connection {connection.conn_id!r} has no host; set the webhook URL as its host")
    url = host if "://" in host else f"{connection.schema or 'https'}://{host}"
    if connection.port and "://" not in host:
        url += f":{connection.port}"
    extra = connection.extra_dejson
    for part in (connection.password, extra.get("endpoint")):
        if part:
            url += "/" + str(part).strip("/")
    return url


class WebhookNotifier(BaseNotifier):
    """POST a JSON body to the URL of an Airflow HTTP connection; any answer but 2xx is an error.

    :param payload: the JSON body (templated)
    :param conn_id: HTTP connection holding the URL (see :func:`webhook_url`); ``extra.headers`` adds headers
    :param timeout: seconds to wait for the answer
    """

    template_fields: Sequence[str] = ("payload",)

    def __init__(self, *, payload: dict[str, Any], conn_id: str = DEFAULT_WEBHOOK_CONN_ID, timeout: float = 10.0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.payload = payload
        self.conn_id = conn_id
        self.timeout = timeout

    def notify(self, context: Context) -> None:
        from airflow.sdk import BaseHook

        connection = BaseHook.get_connection(self.conn_id)
        headers = {"Content-Type": "application/json", **connection.extra_dejson.get("headers", {})}
        request = urllib.request.Request(webhook_url(connection), data=json.dumps(self.payload).encode(),
                                         headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                status = response.status
        # The URL may hold a secret path: no message below carries it, and no exception is chained.
        except HTTPError as exc:
            raise AirflowException(f"webhook {self.conn_id!r} answered HTTP {exc.code}") from None
        except URLError as exc:
            raise AirflowException(f"webhook {self.conn_id!r} is unreachable: {exc.reason}") from None
        except Exception as exc:
            raise AirflowException(f"webhook {self.conn_id!r} failed: {type(exc).__name__}") from None
        self.log.info("Webhook %s answered HTTP %s", self.conn_id, status)
