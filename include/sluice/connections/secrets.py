"""Every secret a run was given, and error text scrubbed of all of them.

The operators pass a run its credentials in the environment of its driver: Kafka's as ``SLUICE_KAFKA_CONN_<ID>``
(:mod:`sluice.connections.kafka`), object storage's as ``AWS_SECRET_ACCESS_KEY`` and its kin
(:mod:`sluice.connections.storage`). A Spark error may quote any of them (a client option, a value an expression
failed on, a URI with its credentials), and an error reaches the task log, XCom and the run log; so every error text
that leaves the driver is scrubbed of every form of every one of them, not only Kafka's.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

from sluice.connections.kafka import REDACTED, env_secrets, scrub, secret_forms
from sluice.connections.storage import SECRET_VARIABLES

# Other variables whose names say they hold a secret (a password, a token, a key): the run may have been given them
# by its deployment rather than by Sluice (Airflow's connection URIs among them).
_SECRET_NAME = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|PRIVATE_KEY|API_KEY|SAS_KEY|ACCOUNT_KEY)"
                          r"|^AIRFLOW_CONN_", re.IGNORECASE)
# A value that short in a variable Sluice does not know is no credential ("true", a port): scrubbing it would garble
# every message.
_MIN_GUESSED_SECRET = 8

__all__ = ["REDACTED", "run_secrets", "scrub_secrets"]


def run_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Every form of every secret in ``environ`` (this process's environment by default)."""
    environ = os.environ if environ is None else environ
    secrets = env_secrets(environ)
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


def scrub_secrets(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every secret of the run replaced by ``***``."""
    secrets = run_secrets(environ)
    return scrub(text, secrets) if secrets else text
