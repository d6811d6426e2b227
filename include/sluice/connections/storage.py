"""Object-storage credentials from an Airflow connection, as the environment every reader of the store takes.

Sluice's own reads (obstore) and delta-rs, in the driver and the executors, read the standard variables of their
cloud, and so does Hadoop's s3a connector (``AWS_ACCESS_KEY_ID``...); the operators put them in the environment of
spark-submit (never on its command line, in a log or in XCom) and of the worker's own checks. Hadoop's Azure and
GCS connectors take their credentials from Spark's configuration instead (``fs.azure.account.key.*``,
``google.cloud.auth.*``): give them to the cluster, not through this connection. The connection is
``sluice_storage`` unless the operator names another; without it, whatever the machine already has (instance
roles, workload identity, exported variables) is used.

- ``aws``: login and password are the access key; ``extra`` may hold ``aws_session_token``, ``region_name`` and
  ``endpoint_url`` (an S3-compatible store: MinIO, R2, Ceph).
- ``wasb``/``adls``: login is the storage account, password its key; or ``extra`` ``sas_token``, or a service
  principal (``tenant_id``, ``client_id``, ``client_secret``).
- ``google_cloud_platform``: ``extra`` ``key_path`` (a service-account file on the workers) or ``keyfile_dict``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sluice.errors import SluiceError

DEFAULT_CONNECTION = "sluice_storage"

# The variables of each mapping that hold a secret: masked in the task log, never printed.
SECRET_VARIABLES = frozenset({"AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_ACCOUNT_KEY",
                              "AZURE_STORAGE_SAS_KEY", "AZURE_CLIENT_SECRET", "GOOGLE_SERVICE_ACCOUNT_KEY"})


def _extra(raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except (TypeError, json.JSONDecodeError):
        raise SluiceError("the storage connection's extra is not a JSON object") from None
    if not isinstance(parsed, dict):
        raise SluiceError("the storage connection's extra is not a JSON object")
    return parsed


def storage_environment(conn_type: str, *, login: str | None = None, password: str | None = None,
                        extra: Any = None) -> dict[str, str]:
    """The environment a store's readers and writers take, from the fields of an Airflow connection."""
    settings = _extra(extra)
    env: dict[str, str] = {}
    if conn_type in ("aws", "s3"):
        endpoint = settings.get("endpoint_url") or (settings.get("service_config") or {}).get("s3", {}).get(
            "endpoint_url")
        pairs = {"AWS_ACCESS_KEY_ID": login, "AWS_SECRET_ACCESS_KEY": password,
                 "AWS_SESSION_TOKEN": settings.get("aws_session_token"), "AWS_REGION": settings.get("region_name"),
                 "AWS_ENDPOINT_URL": endpoint}
        env = {name: str(value) for name, value in pairs.items() if value}
        if endpoint and str(endpoint).startswith("http://"):
            env["AWS_ALLOW_HTTP"] = "true"
        env["AWS_CONDITIONAL_PUT"] = "etag"
    elif conn_type in ("wasb", "adls", "azure_data_lake"):
        pairs = {"AZURE_STORAGE_ACCOUNT_NAME": login or settings.get("account_name"),
                 "AZURE_STORAGE_ACCOUNT_KEY": password, "AZURE_STORAGE_SAS_KEY": settings.get("sas_token"),
                 "AZURE_TENANT_ID": settings.get("tenant_id"), "AZURE_CLIENT_ID": settings.get("client_id"),
                 "AZURE_CLIENT_SECRET": settings.get("client_secret")}
        env = {name: str(value) for name, value in pairs.items() if value}
    elif conn_type in ("google_cloud_platform", "gcp"):
        key_path = settings.get("key_path") or settings.get("extra__google_cloud_platform__key_path")
        keyfile = settings.get("keyfile_dict") or settings.get("extra__google_cloud_platform__keyfile_dict")
        if key_path:
            env = {"GOOGLE_SERVICE_ACCOUNT": str(key_path), "GOOGLE_APPLICATION_CREDENTIALS": str(key_path)}
        elif keyfile:
            env = {"GOOGLE_SERVICE_ACCOUNT_KEY": keyfile if isinstance(keyfile, str) else json.dumps(keyfile)}
    else:
        raise SluiceError(f"a storage connection is of type aws, wasb, adls or google_cloud_platform, not "
                          f"{conn_type!r}")
    return env


def connection_environment(conn_id: str) -> dict[str, str] | None:
    """The environment of an Airflow connection (see :func:`storage_environment`); None when it does not exist."""
    from airflow.sdk import BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:  # the task SDK raises its own not-found error type
        return None
    return storage_environment(str(conn.conn_type or ""), login=conn.login, password=conn.password,
                               extra=conn.extra_dejson)


async def aconnection_environment(conn_id: str) -> dict[str, str] | None:
    """:func:`connection_environment` for a trigger, which must not block the triggerer's event loop."""
    from airflow.sdk import BaseHook

    try:
        conn = await BaseHook.aget_connection(conn_id)
    except Exception:  # as for the worker: no such connection
        return None
    return storage_environment(str(conn.conn_type or ""), login=conn.login, password=conn.password,
                               extra=conn.extra_dejson)


def secrets_of(env: Mapping[str, str]) -> list[str]:
    return [value for name, value in env.items() if name in SECRET_VARIABLES and value]


def described(env: Mapping[str, str]) -> dict[str, str]:
    """The environment as a log may show it: secrets replaced."""
    return {name: "***" if name in SECRET_VARIABLES else value for name, value in env.items()}
