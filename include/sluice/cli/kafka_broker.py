"""A real Apache Kafka broker on this machine, for the tests and ``make run KAFKA=1``: one KRaft node (broker and
controller in one JVM, no ZooKeeper, no Docker), run from the jars ``python -m sluice jars`` resolved
(:mod:`sluice.operations.jars`, the ``kafka-broker`` set).

It listens on 127.0.0.1 only. Clients log in with SASL/PLAIN on the one client listener, as in the compose stack
(user ``sluice``); the controller's listener takes loopback PLAINTEXT from the node itself. The passwords are made
fresh for each storage folder and kept in its ``server.properties`` (mode 0600): they reach no command line.

    python -m sluice kafka-broker --folder DIR     run one in the foreground until interrupted
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.cli.local_jvm import LocalJvmProcess, die_with_parent, serve_until_stopped
from sluice.connections.kafka import ConnectionFields, spark_options
from sluice.errors import SluiceError
from sluice.operations.jars import BROKER_SET, NEEDS_JARS, jar_paths

HOST = "127.0.0.1"
CLIENT_USER = "sluice"
_PROPERTIES = "server.properties"
_SECRETS = "credentials.json"
# Written into the folder once the broker answers a client, removed when it stops: what `make run KAFKA=1` waits for.
READY_NAME = "ready"


def cluster_id(value: uuid.UUID) -> str:
    """A KRaft cluster id: the UUID's 16 bytes in URL-safe base64, unpadded (Kafka's ``Uuid.toString``)."""
    return base64.urlsafe_b64encode(value.bytes).decode("ascii").rstrip("=")


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class BrokerAddress:
    """Where a running broker listens and how a client logs in."""

    bootstrap: str
    username: str
    password: str

    def __repr__(self) -> str:
        return f"BrokerAddress(bootstrap={self.bootstrap!r}, username={self.username!r}, password='***')"

    def client_config(self) -> dict[str, Any]:
        """librdkafka (confluent-kafka) settings."""
        return {"bootstrap.servers": self.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN", "sasl.username": self.username, "sasl.password": self.password}

    def spark_options(self, conn_id: str = "sluice_kafka") -> dict[str, str]:
        """Spark's ``kafka.*`` options, as the operator gives them to the driver."""
        return spark_options(ConnectionFields(conn_id=conn_id, extra=self.client_config()))

    def connection_extra(self) -> dict[str, str]:
        """The ``extra`` of an Airflow Kafka connection (apache-airflow-providers-apache-kafka's convention)."""
        return self.client_config()

    def airflow_connection(self) -> str:
        """An ``AIRFLOW_CONN_<ID>`` value (JSON) for this broker."""
        return json.dumps({"conn_type": "kafka", "extra": self.connection_extra()})


class LocalKafkaBroker(LocalJvmProcess):
    """One KRaft node whose storage and logs live in ``folder``. :meth:`start` formats the storage (once) and waits
    until the broker answers a client; :meth:`stop` stops it (SIGTERM, then SIGKILL)."""

    def __init__(self, folder: str | os.PathLike[str], *, port: int = 0, java: str = "java",
                 classpath: list[str] | None = None, heap: str = "512m") -> None:
        self.folder = Path(folder)
        self.port = port
        self.java = java
        self.classpath = classpath
        self.heap = heap

    @property
    def log_file(self) -> Path:
        return self.folder / "broker.log"

    def address(self) -> BrokerAddress:
        found = json.loads((self.folder / _SECRETS).read_text(encoding="utf-8"))
        return BrokerAddress(f"{HOST}:{found['port']}", CLIENT_USER, found["client_password"])

    def _classpath(self) -> str:
        jars = self.classpath if self.classpath is not None else jar_paths(BROKER_SET)
        if not jars:
            raise SluiceError(f"the Kafka broker's jars are not installed; run `make venv` with Maven installed "
                              f"(`python -m sluice jars`). They serve {NEEDS_JARS}")
        return os.pathsep.join(jars)

    def _configure(self) -> None:
        """Write ``server.properties`` and the credentials once per folder, and format the storage."""
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        secrets_file = self.folder / _SECRETS
        if secrets_file.exists():
            return
        port = self.port or free_port()
        controller_port = free_port()
        broker_password, client_password = secrets.token_hex(16), secrets.token_hex(16)
        jaas = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="broker" password="{broker_password}" '
                f'user_broker="{broker_password}" user_{CLIENT_USER}="{client_password}";')
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{HOST}:{controller_port}",
            "listeners": f"CLIENT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
            "advertised.listeners": f"CLIENT://{HOST}:{port}",
            "listener.security.protocol.map": "CLIENT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "CLIENT",
            "sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.client.plain.sasl.jaas.config": jaas,
            "log.dirs": str(self.folder / "data"),
            "num.partitions": "1",
            # One node: every internal topic has one replica, and few partitions so that it starts in seconds.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "delete.topic.enable": "true",
        }
        properties = self.folder / _PROPERTIES
        descriptor = os.open(properties, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.writelines(f"{key}={value}\n" for key, value in settings.items())
        identifier = cluster_id(uuid.uuid4())
        formatted = subprocess.run(
            # --cluster-id=<id> in one argument: a base64 id may start with "-", which would read as an option.
            [self.java, "-cp", self._classpath(), "kafka.tools.StorageTool", "format", f"--cluster-id={identifier}",
             "--config", str(properties), "--ignore-formatted"],
            capture_output=True, text=True, check=False)
        if formatted.returncode != 0:
            raise SluiceError(f"could not format the Kafka broker's storage in {self.folder}: "
                              f"{(formatted.stdout + formatted.stderr).strip()[-2000:]}")
        descriptor = os.open(secrets_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            json.dump({"port": port, "client_password": client_password}, out)

    def start(self, timeout: float = 90.0) -> BrokerAddress:
        """Start the broker and return its address once a client can log in and list topics."""
        self._configure()
        log = open(self.log_file, "ab")  # noqa: SIM115 - the broker's process writes to it until it stops
        self.process = subprocess.Popen(
            [self.java, f"-Xms{self.heap}", f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             "-Djava.awt.headless=true", "-cp", self._classpath(), "kafka.Kafka", str(self.folder / _PROPERTIES)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent)
        log.close()
        address = self.address()
        self._await_ready(address, timeout)
        return address

    def _await_ready(self, address: BrokerAddress, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = AdminClient({**address.client_config(), "log_level": 0})
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise SluiceError(f"the Kafka broker exited with code {self.process.returncode} as it started; its "
                                  f"log: {self.log_file}\n{self._log_tail()}")
            try:
                admin.list_topics(timeout=2)
                return
            except Exception as exc:  # not listening yet, or still electing its controller
                if time.monotonic() > deadline:
                    self.stop()
                    raise SluiceError(f"the Kafka broker did not answer within {timeout:.0f} s ({exc}); its log: "
                                      f"{self.log_file}\n{self._log_tail()}") from None
            time.sleep(0.2)

    @contextlib.contextmanager
    def running(self, timeout: float = 90.0) -> Iterator[BrokerAddress]:
        address = self.start(timeout)
        try:
            yield address
        finally:
            self.stop()


def create_topic(address: BrokerAddress, topic: str, partitions: int = 1, **config: Any) -> None:
    """Create ``topic`` and wait until the broker has it."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(dict(address.client_config()))
    wanted = NewTopic(topic, partitions, 1, config={key: str(value) for key, value in config.items()})
    admin.create_topics([wanted])[topic].result(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice kafka-broker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", required=True, type=Path, help="the broker's storage, logs and credentials")
    parser.add_argument("--port", type=int, default=0, help="the client port on 127.0.0.1 (default: a free one)")
    args = parser.parse_args(argv)
    broker = LocalKafkaBroker(args.folder, port=args.port)
    try:
        address = broker.start()
    except SluiceError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    print(f"sluice: Kafka broker on {address.bootstrap} (SASL/PLAIN user {address.username}; the password is in "
          f"{args.folder / _SECRETS})", flush=True)
    ready = args.folder / READY_NAME
    ready.write_text(address.bootstrap + "\n", encoding="utf-8")
    try:
        serve_until_stopped(broker)
    finally:
        ready.unlink(missing_ok=True)
    return 0
