"""Object-store credentials for one piece of work, without touching the process environment.

A task's own process takes its connection's credentials as environment variables (they also go to spark-submit).
A triggerer runs many triggers in one process, each perhaps with another connection, and other triggers there must
not see them: a trigger scopes its credentials to its own checks instead. Within :func:`scoped`, the stores of
:mod:`sluice.storage.store` and the Delta tables Sluice opens use these credentials; outside, the environment's.
The scope is a context variable, so it follows a check into ``asyncio.to_thread`` and no other thread sees it.

The credentials are spelled as the environment would hold them (``AWS_ACCESS_KEY_ID``...,
:func:`sluice.connections.storage.storage_environment`): delta-rs takes those names as storage options, and obstore
takes them under its own keys (:func:`store_config`). Both lay them over the process environment, as the AWS SDKs
do: a variable the connection leaves unset (a session token, an endpoint, a region) is still read from there. A
triggerer whose environment exports another identity's ``AWS_SESSION_TOKEN`` must not serve a connection with
static keys and no token.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

_SCOPED: ContextVar[tuple[tuple[str, str], ...]] = ContextVar("sluice_storage_credentials", default=())

# Environment variable -> obstore's configuration key, per store.
_OBSTORE_KEYS = {
    "s3": {"AWS_ACCESS_KEY_ID": "access_key_id", "AWS_SECRET_ACCESS_KEY": "secret_access_key",
           "AWS_SESSION_TOKEN": "session_token", "AWS_REGION": "region", "AWS_ENDPOINT_URL": "endpoint",
           "AWS_CONDITIONAL_PUT": "conditional_put"},
    "abfss": {"AZURE_STORAGE_ACCOUNT_NAME": "account_name", "AZURE_STORAGE_ACCOUNT_KEY": "account_key",
              "AZURE_STORAGE_SAS_KEY": "sas_key", "AZURE_TENANT_ID": "tenant_id", "AZURE_CLIENT_ID": "client_id",
              "AZURE_CLIENT_SECRET": "client_secret"},
    "gs": {"GOOGLE_SERVICE_ACCOUNT": "service_account", "GOOGLE_SERVICE_ACCOUNT_KEY": "service_account_key",
           "GOOGLE_APPLICATION_CREDENTIALS": "application_credentials"},
}
_OBSTORE_KEYS["az"] = _OBSTORE_KEYS["abfss"]


@contextlib.contextmanager
def scoped(env: Mapping[str, str] | None) -> Iterator[None]:
    """Use these credentials (none: the environment's) for the stores and tables opened inside the block."""
    token = _SCOPED.set(tuple(sorted((env or {}).items())))
    try:
        yield
    finally:
        _SCOPED.reset(token)


def current() -> tuple[tuple[str, str], ...]:
    """The scoped credentials, hashable (a store client is cached per bucket and credentials)."""
    return _SCOPED.get()


def delta_options() -> dict[str, str] | None:
    """delta-rs's storage options: the scoped credentials, or None for the environment's."""
    return dict(_SCOPED.get()) or None


def store_config(scheme: str, credentials: tuple[tuple[str, str], ...]) -> tuple[dict[str, str], dict[str, Any]]:
    """obstore's configuration and client options for a store of ``scheme`` (``s3``, ``abfss``, ``gs``) from
    credentials spelled as environment variables."""
    keys = _OBSTORE_KEYS.get(scheme, {})
    given = dict(credentials)
    config = {keys[name]: value for name, value in given.items() if name in keys}
    client = {"allow_http": True} if scheme == "s3" and given.get("AWS_ALLOW_HTTP", "").lower() == "true" else {}
    return config, client
