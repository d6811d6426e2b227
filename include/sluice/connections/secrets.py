"""The secrets in a run's environment that no kind declares, and how a secret is found and scrubbed in text.

The operators pass a run its credentials in the environment of its driver: object storage's as
``AWS_SECRET_ACCESS_KEY`` and its kin (:mod:`sluice.connections.storage`), and those of the connections its kinds
need as the kinds declare them (:mod:`sluice.kinds.credentials`, which adds theirs to :func:`environment_secrets`).
A Spark error may quote any of them (a client option, a value an expression failed on, a URI with its credentials),
and an error reaches the task log, XCom and the run log; so every error text that leaves the driver is scrubbed of
every form of every one of them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping

from sluice.connections.storage import SECRET_VARIABLES

REDACTED = "***"
# Lines of a multi-line secret (a PEM body) shorter than this are armour or padding, not key material.
_MIN_SECRET_LINE = 16

# Other variables whose names say they hold a secret (a password, a token, a key): the run may have been given them
# by its deployment rather than by Sluice (Airflow's connection URIs among them).
_SECRET_NAME = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|PRIVATE_KEY|API_KEY|SAS_KEY|ACCOUNT_KEY)"
                          r"|^AIRFLOW_CONN_", re.IGNORECASE)
# A value that short in a variable Sluice does not know is no credential ("true", a port): scrubbing it would garble
# every message.
_MIN_GUESSED_SECRET = 8

__all__ = ["REDACTED", "connection_secrets", "environment_secrets", "scrub", "secret_forms"]


def secret_forms(secret: str) -> list[str]:
    """The ways a secret can appear in a log or an error: as it is, JSON-escaped (a PEM key inside a JSON
    document), and line by line (a PEM key printed by a tool that wraps or indents it)."""
    forms = [secret, json.dumps(secret)[1:-1]]
    forms += [line.strip() for line in secret.splitlines()
              if len(line.strip()) >= _MIN_SECRET_LINE and not line.strip().startswith("-----")]
    return [form for form in dict.fromkeys(forms) if form]


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret replaced (longest first, so that a JAAS config goes before its password)."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def connection_secrets(environ: Mapping[str, str], prefix: str,
                       secret_values: Callable[[Mapping[str, str]], list[str]]) -> list[str]:
    """Every secret the connection variables in ``environ`` carry (those named ``prefix<ID>``, each the JSON of a
    connection's settings): the whole value, and what ``secret_values`` finds among its settings."""
    secrets: list[str] = []
    for name, text in environ.items():
        if not name.startswith(prefix) or not text:
            continue
        secrets.append(text)
        try:
            settings = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(settings, dict):
            secrets += secret_values({str(k): str(v) for k, v in settings.items()})
    return secrets


def environment_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Every form of every secret in ``environ`` (this process's environment by default) that no kind declares:
    object storage's, and variables whose names say they hold one. :func:`sluice.kinds.credentials.run_secrets`
    adds the kinds' own."""
    environ = os.environ if environ is None else environ
    secrets: list[str] = []
    for name, value in environ.items():
        known = name in SECRET_VARIABLES
        if value and (known or (_SECRET_NAME.search(name) and len(value) >= _MIN_GUESSED_SECRET)):
            secrets += secret_forms(value) + _inner_secrets(value)
    return list(dict.fromkeys(secrets))


def _inner_secrets(value: str) -> list[str]:
    """The secrets inside a JSON document (a service account's ``private_key``): an error may quote one alone, and
    inside the document its lines are escaped, where a tool prints them as lines."""
    try:
        document = json.loads(value)
    except ValueError:
        return []
    if not isinstance(document, dict):
        return []
    return [form for key, inner in document.items()
            if isinstance(inner, str) and _SECRET_NAME.search(str(key))
            for form in secret_forms(inner)]
