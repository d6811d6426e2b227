"""Iceberg catalogs from Airflow connections: ``catalog: <conn_id>`` on an Iceberg source or sink.

A catalog's address and credentials live in an Airflow connection, never in the catalog file (which lives in git).
The connection becomes pyiceberg catalog properties:

- type ``postgres``: a SQL catalog on PostgreSQL (``host``, ``port``, ``schema`` the database, ``login`` and
  ``password``); its warehouse is ``extra.warehouse``, else ``iceberg/warehouse`` under the lake root. Any
  connection whose ``extra.uri`` is an SQLAlchemy URL is a SQL catalog on that database too;
- type ``http``, ``https`` or ``iceberg``: an Iceberg REST catalog at ``host`` (a URL, or a host name with
  ``port`` and ``schema`` the path). ``password`` alone is a bearer token; ``login`` and ``password`` are an OAuth2
  client's id and secret (pyiceberg's ``credential``). ``extra`` may hold ``warehouse`` and any other pyiceberg
  catalog property (``token``, ``credential``, ``scope``, ``oauth2-server-uri``, ``s3.*``...).

The operator passes the properties to the driver as one ``SLUICE_ICEBERG_CONN_<ID>`` variable (JSON), in the
environment of spark-submit, never on a command line or in a log; a process without it (an Airflow worker's health
check) reads the connection from Airflow itself. Every value that is not known to be public is a secret: masked in
the task log, scrubbed from errors.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from sluice.connections.secrets import REDACTED, connection_secrets, secret_forms
from sluice.errors import SluiceError

ENV_PREFIX = "SLUICE_ICEBERG_CONN_"
SQL_TYPES = ("postgres", "postgresql")
REST_TYPES = ("http", "https", "iceberg")
# The catalog properties that are not secret, by name: every other one is (a rule listing secret names misses the
# next one; this one fails safe). A SQL catalog's ``uri`` holds its password: it is a secret.
_PUBLIC = re.compile(r"type|warehouse|scope|oauth2-server-uri|prefix|audience|resource|"
                     r"(s3|gcs|adls|hf|py-io|pyarrow)\.(endpoint|region|path-style-access|force-virtual-addressing|"
                     r"project-id|account-name)|header\.[A-Za-z0-9-]+|rest\.[a-z.-]+|downcast-ns-timestamp-to-us-on-write")


@dataclass(frozen=True)
class CatalogConnection:
    """The fields of an Airflow connection an Iceberg catalog takes; the repr hides the password and the extra."""

    conn_id: str
    conn_type: str
    host: str | None = None
    port: int | None = None
    schema: str | None = None
    login: str | None = None
    password: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (f"CatalogConnection(conn_id={self.conn_id!r}, conn_type={self.conn_type!r}, host={self.host!r}, "
                f"port={self.port!r}, login={self.login!r}, password={REDACTED if self.password else None!r}, "
                f"extra={redact({str(k): str(v) for k, v in self.extra.items()})!r})")


def read_connection(conn_id: str) -> CatalogConnection:
    """The Airflow connection ``conn_id`` (``airflow.sdk.BaseHook``: the API server in a task, else the secrets
    backends, ``AIRFLOW_CONN_*`` included). Call it at run time, never while a DAG file is parsed."""
    try:
        from airflow.sdk import BaseHook
    except ImportError:
        raise SluiceError(f"the Iceberg catalog connection {conn_id!r} did not reach this process ({env_name(conn_id)} "
                          "is not set) and Airflow is not installed here to read it") from None
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as exc:
        raise SluiceError(f"Iceberg catalog connection {conn_id!r} is not defined: {type(exc).__name__}. Add it, e.g. "
                          f"airflow connections add {conn_id} --conn-uri "
                          "'postgres://user:password@host:5432/iceberg'") from None
    return CatalogConnection(conn_id=conn_id, conn_type=str(conn.conn_type or ""), host=conn.host, port=conn.port,
                             schema=conn.schema, login=conn.login, password=conn.password,
                             extra=dict(conn.extra_dejson or {}))


def catalog_properties(conn: CatalogConnection) -> dict[str, str]:
    """The pyiceberg catalog properties of a connection (``type`` ``sql`` or ``rest``); a connection that is neither
    is refused, naming it."""
    extra = {str(key): str(value).lower() if isinstance(value, bool) else str(value)
             for key, value in conn.extra.items() if value is not None}
    kind = conn.conn_type.lower()
    if "uri" in extra and extra.get("type", "sql") == "sql":
        return {**extra, "type": "sql"}
    if kind in SQL_TYPES:
        if not conn.host:
            raise SluiceError(f"Iceberg catalog connection {conn.conn_id!r} (postgres) names no host")
        login = quote(conn.login or "", safe="") + (f":{quote(conn.password, safe='')}" if conn.password else "")
        uri = (f"postgresql+psycopg2://{login}{'@' if login else ''}{conn.host}:{conn.port or 5432}/"
               f"{conn.schema or 'postgres'}")
        return {**extra, "type": "sql", "uri": uri}
    if kind in REST_TYPES:
        host = conn.host or extra.get("uri", "")
        if not host:
            raise SluiceError(f"Iceberg catalog connection {conn.conn_id!r} ({kind}) names no host: set it to the "
                              "REST catalog's URL")
        if "://" not in host:
            scheme = "https" if kind == "https" else "http"
            host = f"{scheme}://{host}{f':{conn.port}' if conn.port else ''}{'/' + conn.schema if conn.schema else ''}"
        properties = {**extra, "type": "rest", "uri": host}
        if conn.password and conn.login:
            properties.setdefault("credential", f"{conn.login}:{conn.password}")
        elif conn.password:
            properties.setdefault("token", conn.password)
        return properties
    raise SluiceError(f"Iceberg catalog connection {conn.conn_id!r} is of type {conn.conn_type!r}; expected postgres "
                      f"(a SQL catalog on PostgreSQL), {', '.join(REST_TYPES)} (a REST catalog by URL), or an extra "
                      "uri (an SQLAlchemy URL)")


def env_name(conn_id: str) -> str:
    """The environment variable that carries a catalog connection's properties to the driver."""
    return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", conn_id).upper()


def connection_properties(conn_id: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The catalog properties of connection ``conn_id``: from the variable the operator passed this process, else
    from Airflow."""
    environ = os.environ if environ is None else environ
    name = env_name(conn_id)
    text = environ.get(name)
    if not text:
        return catalog_properties(read_connection(conn_id))
    try:
        properties = json.loads(text)
    except json.JSONDecodeError:
        raise SluiceError(f"{name} is not JSON") from None
    if not isinstance(properties, dict) or properties.get("type") not in ("sql", "rest"):
        raise SluiceError(f"{name} must be a JSON object of pyiceberg catalog properties with type sql or rest")
    return {str(key): str(value) for key, value in properties.items()}


def is_secret(key: str, properties: Mapping[str, str]) -> bool:
    """Whether the property ``key`` holds a secret: any not known to be public, but a REST catalog's address."""
    return not _PUBLIC.fullmatch(key) and not (key == "uri" and properties.get("type") == "rest")


def secret_values(properties: Mapping[str, str]) -> list[str]:
    """Every form of every secret in the properties, and a SQL URI's or a credential's password alone."""
    secrets: list[str] = []
    for key, value in properties.items():
        if not value or not is_secret(key, properties):
            continue
        secrets += secret_forms(value)
        password = urlsplit(value).password if key == "uri" else None
        if key == "credential" and ":" in value:
            password = value.split(":", 1)[1]
        if password:  # a URL's password is quoted; an error may quote it either way
            secrets += secret_forms(password) + secret_forms(unquote(password))
    return list(dict.fromkeys(secret for secret in secrets if secret))


def env_secrets(environ: Mapping[str, str]) -> list[str]:
    """Every secret the catalog connections' variables in ``environ`` carry."""
    return connection_secrets(environ, ENV_PREFIX, secret_values)


def redact(properties: Mapping[str, str]) -> dict[str, str]:
    """The properties as a log may show them."""
    return {key: REDACTED if value and is_secret(key, properties) else value for key, value in properties.items()}
