"""Kafka connections: the Airflow connection that says where the brokers are and how to log in, and the secrets
it holds (what a catalog may say about a Kafka source or sink is :mod:`sluice.kinds.kafka`).

The brokers and every security setting come from an Airflow connection (``sluice_kafka`` unless the catalog names
another), never from the catalog or a DAG param: a catalog lives in git, and a param is visible to everyone who can
trigger a DAG. The connection follows the convention of apache-airflow-providers-apache-kafka: ``conn_type`` kafka
and an ``extra`` holding librdkafka settings (``bootstrap.servers``, ``security.protocol``, ``sasl.mechanism``,
``sasl.username``, ``sasl.password``, ``ssl.*``); ``host:port`` (and login/password) work too. That one connection
is mapped two ways:

- :func:`spark_options`: Spark's ``kafka.``-prefixed Java client options, with ``kafka.sasl.jaas.config`` built
  for PLAIN and SCRAM. The operator passes them to the driver in the environment of spark-submit
  (:func:`env_name`), never on its command line, in XCom or in a log;
- :func:`client_config`: confluent-kafka (librdkafka) settings for the lag probe, which reads the brokers'
  watermarks without a JVM.

Pure Python: no pyspark, and Airflow only inside :func:`connection_fields`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluice.connections.secrets import REDACTED, connection_secrets, scrub, secret_forms
from sluice.errors import SluiceError

__all__ = ["REDACTED", "scrub", "secret_forms"]  # with the rest of this module: the generic pieces, where they were

DEFAULT_CONNECTION = "sluice_kafka"
# The environment variable (one per connection) that carries a connection's Spark options to the driver.
ENV_PREFIX = "SLUICE_KAFKA_CONN_"

_SASL_MECHANISMS = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# librdkafka SSL settings and their Java client names (both read PKCS#12 keystores; Java reads PEM truststores).
_SSL_TO_JAVA = {
    "ssl.keystore.location": "ssl.keystore.location",
    "ssl.keystore.password": "ssl.keystore.password",
    "ssl.key.password": "ssl.key.password",
    "ssl.endpoint.identification.algorithm": "ssl.endpoint.identification.algorithm",
}
# The settings of a Kafka client that are not secret, by name (without the ``kafka.`` prefix). Every other setting
# of a connection is treated as a secret: a rule that lists secret names misses the next one (an inline PEM key is
# ``ssl.keystore.key``), a rule that lists public names fails safe.
_PUBLIC_SETTING = re.compile(
    r"bootstrap\.servers|security\.protocol|sasl\.mechanisms?|sasl\.username|"
    r"ssl\.(?:[a-z]+\.)?(?:location|type)|ssl\.endpoint\.identification\.algorithm|ssl\.enabled\.protocols|"
    r"ssl\.protocol|client\.id|group\.id",
    re.IGNORECASE,
)
_JAAS_PASSWORD = re.compile(r'password="((?:[^"\\]|\\.)*)"')


def is_connection_setting(key: str) -> bool:
    """True for a client setting that belongs in the Airflow connection: brokers, protocol, SASL and SSL."""
    name = key.lower().removeprefix("kafka.")
    return key.lower().startswith("kafka.") and (
        name == "bootstrap.servers" or name.startswith(("security.", "sasl.", "ssl."))
    )


# --- the connection -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectionFields:
    """What Sluice reads from an Airflow connection; the repr hides the password and secret extras."""

    conn_id: str
    host: str | None = None
    port: int | None = None
    login: str | None = None
    password: str | None = None
    extra: Mapping[str, Any] | None = None

    def __repr__(self) -> str:
        extra = redact(self.extra or {})
        return (f"ConnectionFields(conn_id={self.conn_id!r}, host={self.host!r}, port={self.port!r}, "
                f"login={self.login!r}, password={REDACTED if self.password else None!r}, extra={extra!r})")


def connection_fields(conn_id: str) -> ConnectionFields:
    """Read an Airflow connection (``airflow.sdk.BaseHook.get_connection``: in a task through the API server, else
    the secrets backends, ``AIRFLOW_CONN_*`` included). Call it at run time, never while a DAG file is parsed."""
    from airflow.sdk import BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as exc:
        raise SluiceError(f"Kafka connection {conn_id!r} is not defined: {type(exc).__name__}. Add it, e.g. "
                          f"airflow connections add {conn_id} --conn-type kafka --conn-extra "
                          "'{\"bootstrap.servers\": \"broker:9092\"}'") from None
    return ConnectionFields(conn_id=conn_id, host=conn.host, port=conn.port, login=conn.login,
                            password=conn.password, extra=dict(conn.extra_dejson or {}))


def _settings(conn: ConnectionFields) -> dict[str, str]:
    """The connection as librdkafka-style settings: extra first, then host:port and login/password as fallbacks."""
    extra = {str(k): v for k, v in (conn.extra or {}).items()}
    settings = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in extra.items() if v is not None}
    if "sasl.mechanisms" in settings:  # librdkafka's alias
        settings.setdefault("sasl.mechanism", settings.pop("sasl.mechanisms"))
    if "bootstrap.servers" not in settings and conn.host:
        servers = conn.host
        if conn.port and "," not in servers and ":" not in servers:
            servers = f"{servers}:{conn.port}"
        settings["bootstrap.servers"] = servers
    if not settings.get("bootstrap.servers"):
        raise SluiceError(f"Kafka connection {conn.conn_id!r} names no brokers: set bootstrap.servers in its extra, "
                          "or its host (and port)")
    if conn.login and "sasl.username" not in settings:
        settings["sasl.username"] = conn.login
    if conn.password and "sasl.password" not in settings:
        settings["sasl.password"] = conn.password
    protocol = settings.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in _PROTOCOLS:
        raise SluiceError(f"Kafka connection {conn.conn_id!r}: security.protocol {protocol!r} is not one of "
                          f"{', '.join(_PROTOCOLS)}")
    settings["security.protocol"] = protocol
    if protocol.startswith("SASL"):
        mechanism = settings.get("sasl.mechanism", "PLAIN").upper()
        if mechanism not in _SASL_MECHANISMS:
            raise SluiceError(f"Kafka connection {conn.conn_id!r}: sasl.mechanism {mechanism!r} is not supported; "
                              f"use one of {', '.join(_SASL_MECHANISMS)}")
        if not settings.get("sasl.username") or not settings.get("sasl.password"):
            raise SluiceError(f"Kafka connection {conn.conn_id!r}: {protocol} needs sasl.username and sasl.password "
                              "(in its extra, or its login and password)")
        settings["sasl.mechanism"] = mechanism
    elif "sasl.username" in settings and "sasl.mechanism" in settings:
        raise SluiceError(f"Kafka connection {conn.conn_id!r} has SASL credentials but security.protocol "
                          f"{protocol}; set it to SASL_SSL (or SASL_PLAINTEXT)")
    return settings


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def spark_options(conn: ConnectionFields) -> dict[str, str]:
    """Spark's Kafka options (Java client settings with the ``kafka.`` prefix) for the connection: the brokers,
    the protocol, SASL PLAIN / SCRAM as ``kafka.sasl.jaas.config``, and SSL trust and key stores."""
    settings = _settings(conn)
    protocol = settings["security.protocol"]
    options = {"kafka.bootstrap.servers": settings["bootstrap.servers"], "kafka.security.protocol": protocol}
    if protocol.startswith("SASL"):
        mechanism = settings["sasl.mechanism"]
        options["kafka.sasl.mechanism"] = mechanism
        options["kafka.sasl.jaas.config"] = (
            f"{_SASL_MECHANISMS[mechanism]} required username={_jaas_quote(settings['sasl.username'])} "
            f"password={_jaas_quote(settings['sasl.password'])};"
        )
    if protocol.endswith("SSL"):
        if "ssl.ca.location" in settings:
            options["kafka.ssl.truststore.type"] = "PEM"
            options["kafka.ssl.truststore.location"] = settings["ssl.ca.location"]
        for key in ("ssl.certificate.location", "ssl.key.location"):
            if key in settings:
                raise SluiceError(f"Kafka connection {conn.conn_id!r}: {key} (a PEM client certificate) cannot be "
                                  "given to Spark's Java client; use ssl.keystore.location (PKCS#12) and "
                                  "ssl.keystore.password, which both Spark and the lag probe read")
        for key, java in _SSL_TO_JAVA.items():
            if key in settings:
                options[f"kafka.{java}"] = settings[key]
        if "ssl.keystore.location" in settings:
            options["kafka.ssl.keystore.type"] = "PKCS12"
        # Java-only settings given as such (a JKS truststore) pass through.
        for key, value in settings.items():
            if key.startswith(("ssl.truststore.", "ssl.keystore.", "ssl.enabled.protocols", "ssl.protocol")):
                options.setdefault(f"kafka.{key}", value)
        if options.get("kafka.ssl.endpoint.identification.algorithm") == "none":
            options["kafka.ssl.endpoint.identification.algorithm"] = ""
    return options


def client_config(conn: ConnectionFields) -> dict[str, str]:
    """confluent-kafka (librdkafka) settings for the connection, for the lag probe."""
    settings = _settings(conn)
    protocol = settings["security.protocol"]
    config = {"bootstrap.servers": settings["bootstrap.servers"], "security.protocol": protocol}
    if protocol.startswith("SASL"):
        config.update({"sasl.mechanism": settings["sasl.mechanism"], "sasl.username": settings["sasl.username"],
                       "sasl.password": settings["sasl.password"]})
    if protocol.endswith("SSL"):
        if settings.get("ssl.truststore.location") and "ssl.ca.location" not in settings:
            if settings.get("ssl.truststore.type", "").upper() != "PEM":
                raise SluiceError(f"Kafka connection {conn.conn_id!r}: ssl.truststore.location is a Java truststore, "
                                  "which the lag probe (librdkafka) cannot read; give the CA as PEM in ssl.ca.location")
            settings["ssl.ca.location"] = settings["ssl.truststore.location"]
        for key in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location", *_SSL_TO_JAVA):
            if key in settings:
                config[key] = settings[key]
        if config.get("ssl.endpoint.identification.algorithm") == "":
            config["ssl.endpoint.identification.algorithm"] = "none"
    return config


def client_config_from_spark(options: Mapping[str, str]) -> dict[str, str]:
    """librdkafka (confluent-kafka) settings from the Spark ``kafka.*`` options :func:`spark_options` made: what the
    driver's own Kafka clients (the transactional sink) use, from the one variable the operator passes."""
    config = {"bootstrap.servers": options["kafka.bootstrap.servers"],
              "security.protocol": options.get("kafka.security.protocol", "PLAINTEXT")}
    if config["security.protocol"].startswith("SASL"):
        config["sasl.mechanism"] = options.get("kafka.sasl.mechanism", "PLAIN")
        jaas = options.get("kafka.sasl.jaas.config", "")
        for name in ("username", "password"):
            found = re.search(rf'{name}="((?:[^"\\]|\\.)*)"', jaas)
            if found is None:
                raise SluiceError(f"kafka.sasl.jaas.config has no {name}")
            config[f"sasl.{name}"] = re.sub(r"\\(.)", r"\1", found.group(1))
    if options.get("kafka.ssl.truststore.type") == "PEM" and "kafka.ssl.truststore.location" in options:
        config["ssl.ca.location"] = options["kafka.ssl.truststore.location"]
    for java, native in (("kafka.ssl.keystore.location", "ssl.keystore.location"),
                         ("kafka.ssl.keystore.password", "ssl.keystore.password"),
                         ("kafka.ssl.key.password", "ssl.key.password")):
        if java in options:
            config[native] = options[java]
    if options.get("kafka.ssl.endpoint.identification.algorithm") == "":
        config["ssl.endpoint.identification.algorithm"] = "none"
    return config


# --- passing options to the driver, and keeping secrets out of sight -------------------------------------------


def env_name(conn_id: str) -> str:
    """The environment variable that carries a connection's Spark options to the driver."""
    return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", conn_id).upper()


def options_from_env(conn_id: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Spark options the operator passed for a connection (driver side)."""
    environ = os.environ if environ is None else environ
    name = env_name(conn_id)
    text = environ.get(name)
    if not text:
        raise SluiceError(f"the Kafka settings of connection {conn_id!r} did not reach the driver ({name} is not "
                          "set). Run the stream through its Airflow DAG (StreamRunOperator resolves the connection), "
                          f"or export {name} with the JSON of the kafka.* options")
    try:
        options = json.loads(text)
    except json.JSONDecodeError:
        raise SluiceError(f"{name} is not JSON") from None
    if not isinstance(options, dict) or not all(str(k).startswith("kafka.") for k in options):
        raise SluiceError(f"{name} must be a JSON object of kafka.* options")
    return {str(k): str(v) for k, v in options.items()}


def is_secret_setting(key: str) -> bool:
    """True for every client setting that is not known to be public (see ``_PUBLIC_SETTING``)."""
    return not _PUBLIC_SETTING.fullmatch(str(key).lower().removeprefix("kafka."))


def secret_values(options: Mapping[str, str]) -> list[str]:
    """Every form of every secret within options, and of the passwords inside a JAAS config (both as written in
    the config and as the plain password a client error may quote), for masking and scrubbing."""
    secrets: list[str] = []
    for key, value in options.items():
        if not value or not is_secret_setting(key):
            continue
        secrets += secret_forms(value)
        for escaped in _JAAS_PASSWORD.findall(value):
            secrets += [escaped, *secret_forms(re.sub(r"\\(.)", r"\1", escaped))]
    return list(dict.fromkeys(secret for secret in secrets if secret))


def env_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Every secret the operator passed to this process (driver side), for scrubbing error messages."""
    return connection_secrets(os.environ if environ is None else environ, ENV_PREFIX, secret_values)


def redact(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options with every secret value replaced, for an error message or a repr."""
    return {k: REDACTED if is_secret_setting(str(k)) and v else v for k, v in options.items()}
