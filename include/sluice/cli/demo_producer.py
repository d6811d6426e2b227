"""Demo producer: realistic clickstream events and order exports written into the landing zone.

Users sign up, start sessions, click through pages and buy things. Like real feeds, a few events arrive late, some
are delivered twice, and some are malformed (broken JSON, an amount that is not a number, a missing timestamp).
Files appear atomically: each is written under a hidden name and renamed into place, as an uploader should.

With ``--topic`` the same event lines go to a Kafka topic instead (confluent-kafka), one message per line, keyed by
user so that each user's events stay in order within a partition:

    python -m sluice demo-producer --landing-root data/landing --files 3
    python -m sluice demo-producer --landing-root data/landing --loop --interval 30
    python -m sluice demo-producer --kafka-bootstrap kafka:9092 --topic demo.events --loop --interval 30
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sluice.storage.store import write_atomically

PAGES = ("/", "/search", "/product/espresso-grinder", "/product/pour-over-kettle", "/product/beans-ethiopia",
         "/cart", "/checkout")
CURRENCIES = ("EUR", "USD", "GBP")

# The schema of the events this producer writes, as a catalog declares it.
EVENT_SCHEMA = {
    "event_id": "string not null",
    "event_type": "string not null",
    "user_id": "string not null",
    "session_id": "string",
    "page": "string",
    "amount": "decimal(12,2)",
    "currency": "string",
    "event_time": "timestamp not null",
}


@dataclass
class ProducedBatch:
    """What one call wrote: the files, and how many lines of each kind, so tests can check counts exactly."""

    files: list[Path] = field(default_factory=list)
    events: int = 0
    duplicates: int = 0
    late: int = 0
    malformed: int = 0
    orders: int = 0
    malformed_orders: int = 0

    @property
    def event_lines(self) -> int:
        return self.events + self.duplicates + self.malformed

    def add_events(self, other: ProducedBatch) -> None:
        self.files += other.files
        self.events += other.events
        self.duplicates += other.duplicates
        self.late += other.late
        self.malformed += other.malformed


@dataclass(frozen=True)
class EventRecord:
    """One line of the event feed: the line exactly as an events file holds it, and the user it belongs to."""

    user_id: str
    line: str


def encode_kafka_message(record: EventRecord) -> tuple[bytes, bytes]:
    """The Kafka key and value of an event line: the user id (one user's events stay in one partition, in order)
    and the line's UTF-8 bytes, unchanged, so that a Kafka source reads the same records as the file source,
    malformed ones included."""
    return record.user_id.encode("utf-8"), record.line.encode("utf-8")


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, text.encode("utf-8"))


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class DemoProducer:
    """Generates a user population and emits event files and order exports from it."""

    def __init__(self, landing_root: str | os.PathLike[str], *, seed: int = 7, users: int = 50,
                 malformed_rate: float = 0.02, duplicate_rate: float = 0.03, late_rate: float = 0.05) -> None:
        self.landing = Path(landing_root)
        self.random = random.Random(seed)
        self.users = [f"u{index:04d}" for index in range(users)]
        self.malformed_rate = malformed_rate
        self.duplicate_rate = duplicate_rate
        self.late_rate = late_rate
        self.sequence = 0

    def _event(self, now: datetime) -> dict[str, object]:
        user = self.random.choice(self.users)
        kind = self.random.choices(["session_start", "click", "purchase", "user_signup"], [20, 60, 12, 8])[0]
        moment = now - timedelta(seconds=self.random.uniform(0, 60))
        event: dict[str, object] = {
            "event_id": str(uuid.UUID(int=self.random.getrandbits(128))),
            "event_type": kind if self.random.random() > 0.1 else kind.upper(),
            "user_id": user,
            "session_id": f"s-{user}-{self.random.randint(1, 5)}",
            "event_time": _iso(moment),
        }
        if kind == "click":
            event["page"] = self.random.choice(PAGES)
        if kind == "purchase":
            event["amount"] = round(self.random.uniform(3, 250), 2)
            event["currency"] = self.random.choice(CURRENCIES)
        return event

    def _malformed_record(self, now: datetime) -> EventRecord:
        event = self._event(now)
        user = str(event["user_id"])
        flavour = self.random.randrange(3)
        if flavour == 0:
            return EventRecord(user, json.dumps(event)[:-7])  # truncated mid-record by a broken uploader
        if flavour == 1:
            event["event_type"], event["amount"] = "purchase", "twelve euros"
            return EventRecord(user, json.dumps(event))
        event.pop("event_time")
        return EventRecord(user, json.dumps(event))

    def event_records(self, *, lines: int = 200,
                      now: datetime | None = None) -> tuple[ProducedBatch, list[EventRecord]]:
        """``lines`` events (plus duplicates), some late and some malformed, with the counts of each kind."""
        now = now or datetime.now(timezone.utc)
        produced = ProducedBatch()
        out: list[EventRecord] = []
        for _ in range(lines):
            if self.random.random() < self.malformed_rate:
                out.append(self._malformed_record(now))
                produced.malformed += 1
                continue
            event = self._event(now)
            if self.random.random() < self.late_rate:
                event["event_time"] = _iso(now - timedelta(hours=self.random.uniform(1, 30)))
                produced.late += 1
            record = EventRecord(str(event["user_id"]), json.dumps(event))
            out.append(record)
            produced.events += 1
            if self.random.random() < self.duplicate_rate:
                out.append(record)  # at-least-once delivery upstream
                produced.duplicates += 1
        return produced, out

    def events_file(self, *, lines: int = 200, now: datetime | None = None) -> ProducedBatch:
        """One JSON-lines file of ``lines`` events under ``<landing>/events/<date>/``."""
        now = now or datetime.now(timezone.utc)
        produced, records = self.event_records(lines=lines, now=now)
        self.sequence += 1
        path = self.landing / "events" / now.strftime("%Y-%m-%d") / f"events-{now:%H%M%S}-{self.sequence:06d}.json"
        _write_atomically(path, "\n".join(record.line for record in records) + "\n")
        produced.files.append(path)
        return produced

    def orders_file(self, *, rows: int = 40, now: datetime | None = None) -> ProducedBatch:
        """One CSV export of ``rows`` orders under ``<landing>/orders/``."""
        now = now or datetime.now(timezone.utc)
        produced = ProducedBatch()
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["order_id", "user_id", "amount", "currency", "status", "ordered_at"])
        for _ in range(rows):
            amount: object = round(self.random.uniform(3, 250), 2)
            if self.random.random() < self.malformed_rate:
                amount = "n/a"
                produced.malformed_orders += 1
            else:
                produced.orders += 1
            writer.writerow([
                f"o-{uuid.UUID(int=self.random.getrandbits(128)).hex[:12]}",
                self.random.choice(self.users),
                amount,
                self.random.choice(CURRENCIES),
                self.random.choice(["paid", "paid", "paid", "refunded"]),
                _iso(now - timedelta(minutes=self.random.uniform(0, 10))),
            ])
        self.sequence += 1
        path = self.landing / "orders" / f"orders-{now:%Y%m%d-%H%M%S}-{self.sequence:06d}.csv"
        _write_atomically(path, buffer.getvalue())
        produced.files.append(path)
        return produced

    def produce(self, *, files: int = 3, lines: int = 200, now: datetime | None = None) -> ProducedBatch:
        """``files`` event files plus one order export."""
        total = ProducedBatch()
        for _ in range(files):
            total.add_events(self.events_file(lines=lines, now=now))
        orders = self.orders_file(now=now)
        total.files += orders.files
        total.orders, total.malformed_orders = orders.orders, orders.malformed_orders
        return total


# What only a producer reads; the admin client that creates the topic takes every other setting of the sink.
_DELIVERY_SETTINGS = frozenset({"enable.idempotence", "acks", "linger.ms"})


class KafkaEventSink:
    """Sends event records to one Kafka topic with confluent-kafka and waits until the broker has every one.

    The producer is idempotent with ``acks=all``, so a retried send never duplicates a message; the duplicates in
    the feed are the ones the demo makes on purpose.
    """

    def __init__(self, bootstrap_servers: str, topic: str, *, partitions: int = 3,
                 config: dict[str, Any] | None = None, producer: Any = None) -> None:
        if not bootstrap_servers:
            raise ValueError("bootstrap_servers: expected host:port[,host:port...], got an empty value")
        if not topic:
            raise ValueError("topic: expected a topic name, got an empty value")
        if partitions < 1:
            raise ValueError(f"partitions: expected at least 1, got {partitions}")
        self.config = {"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, "acks": "all",
                       "linger.ms": 20, **(config or {})}
        self.topic = topic
        self.partitions = partitions
        self._producer = producer

    @property
    def producer(self) -> Any:
        if self._producer is None:
            from confluent_kafka import Producer

            self._producer = Producer(self.config)
        return self._producer

    def ensure_topic(self, timeout: float = 30.0) -> bool:
        """Create the topic with ``partitions`` partitions unless it exists; True when this call created it."""
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        # The producer's connection settings (brokers, protocol, SASL, SSL), without its delivery settings.
        admin = AdminClient({key: value for key, value in self.config.items() if key not in _DELIVERY_SETTINGS})
        if self.topic in admin.list_topics(timeout=timeout).topics:
            return False
        future = admin.create_topics([NewTopic(self.topic, self.partitions, 1)])[self.topic]
        try:
            future.result(timeout)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return False  # another producer created it in between
            raise
        return True

    def send(self, records: Sequence[EventRecord], *, timeout: float = 30.0) -> int:
        """Send ``records`` in order; return how many the broker acknowledged, or raise if any was not."""
        failures: list[str] = []

        def delivered(error: Any, message: Any) -> None:
            if error is not None:
                failures.append(str(error))

        for record in records:
            key, value = encode_kafka_message(record)
            while True:
                try:
                    self.producer.produce(self.topic, key=key, value=value, on_delivery=delivered)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    self.producer.poll(1.0)
            self.producer.poll(0)
        remaining = self.producer.flush(timeout)
        if remaining or failures:
            reason = failures[0] if failures else f"{remaining} message(s) still queued after {timeout:g} s"
            raise RuntimeError(f"Kafka topic {self.topic!r}: {len(failures) + remaining} of {len(records)} "
                               f"message(s) not delivered: {reason}")
        return len(records)


def _beat(heartbeat_file: str | None) -> None:
    if heartbeat_file:
        _write_atomically(Path(heartbeat_file), f"{time.time():.0f}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice demo-producer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--landing-root", default=os.environ.get("SLUICE_LANDING_ROOT", "data/landing"))
    parser.add_argument("--files", type=int, default=3, help="event files (or batches of messages) per round")
    parser.add_argument("--lines", type=int, default=200, help="events per file or batch")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--loop", action="store_true", help="keep producing a round every --interval seconds")
    parser.add_argument("--interval", type=float, default=30.0)
    parser.add_argument("--topic", help="send the events to this Kafka topic instead of writing files")
    parser.add_argument("--kafka-bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
                        help="Kafka bootstrap servers for --topic (default: KAFKA_BOOTSTRAP_SERVERS)")
    parser.add_argument("--kafka-connection",
                        help="for --topic: the Airflow connection to log in with (brokers, SASL, SSL), as the stream "
                             "DAGs do, e.g. sluice_kafka from AIRFLOW_CONN_SLUICE_KAFKA")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of --topic when it is created")
    parser.add_argument("--heartbeat-file", help="file touched after every round that succeeded (healthchecks)")
    args = parser.parse_args(argv)
    security: dict[str, Any] = {}
    if args.topic and args.kafka_connection:
        from sluice.connections.kafka import client_config, connection_fields

        security = client_config(connection_fields(args.kafka_connection))
        args.kafka_bootstrap = security.pop("bootstrap.servers")
    if args.topic and not args.kafka_bootstrap:
        parser.error("--topic needs --kafka-connection, --kafka-bootstrap or KAFKA_BOOTSTRAP_SERVERS")
    producer = DemoProducer(args.landing_root, seed=args.seed if args.seed is not None else int(time.time()))
    sink = (KafkaEventSink(args.kafka_bootstrap, args.topic, partitions=args.partitions, config=security)
            if args.topic else None)
    if sink is not None:
        sink.ensure_topic()
    while True:
        if sink is None:
            batch = producer.produce(files=args.files, lines=args.lines)
            report: dict[str, object] = {"files": len(batch.files), "orders": batch.orders,
                                         "malformed_orders": batch.malformed_orders}
        else:
            batch, messages = ProducedBatch(), 0
            for _ in range(args.files):
                part, records = producer.event_records(lines=args.lines)
                messages += sink.send(records)
                batch.add_events(part)
            report = {"topic": sink.topic, "messages": messages}
        report.update(events=batch.events, duplicates=batch.duplicates, late=batch.late, malformed=batch.malformed)
        print(json.dumps(report), flush=True)
        _beat(args.heartbeat_file)
        if not args.loop:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    raise SystemExit(main())
