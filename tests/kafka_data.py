"""Kafka test data: a stream definition, records, and the oracle that decodes them with the json module alone."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from typing import Any


def kafka_stream(name: str = "clicks", engine: str = "rs", **source: Any) -> dict[str, Any]:
    return {"name": name,
            "source": {"type": "kafka", "format": "json", "options": {"subscribe": "clicks",
                                                                      "startingOffsets": "earliest"},
                       "schema": {"event_id": "string not null", "amount": "decimal(12,2)", "at": "timestamp"},
                       **source},
            "sink": {"path": f"bronze/{name}", "engine": engine}, "schedule": "*/5 * * * *"}


def expected(values: list[bytes | None], *, rescue: bool) -> tuple[list[tuple[Any, ...]], int]:
    """The good rows and the dead-letter count, decided with the json module alone: an amount that is not a number
    is rescued (the row's amount is NULL) under ``rescue``, and a dead letter otherwise."""
    good, bad = [], 0
    for value in values:
        try:
            record = json.loads(value) if value is not None else None
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or record.get("event_id") is None:
            bad += 1
            continue
        try:
            amount = None if record.get("amount") is None else Decimal(str(record["amount"])).quantize(Decimal("0.01"))
        except ArithmeticError:
            if not rescue:
                bad += 1
                continue
            amount = None
        good.append((record["event_id"], amount))
    return sorted(good), bad


def new_topic(kafka: Any, partitions: int = 1) -> str:
    from sluice.cli.kafka_broker import create_topic

    topic = f"sluice-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, partitions)
    return topic


def produce(kafka: Any, topic: str, values: list[bytes], partitions: int = 1) -> None:
    from confluent_kafka import Producer

    producer = Producer(kafka.client_config())
    for index, value in enumerate(values):
        producer.produce(topic, value=value, key=f"k{index}".encode(), partition=index % partitions)
    assert producer.flush(30) == 0


def clicks(offset: int, count: int) -> list[bytes]:
    return [json.dumps({"event_id": f"e{i}", "amount": i / 4}).encode() for i in range(offset, offset + count)]


def consume(kafka: Any, topic: str, expected_count: int, *, isolation: str = "read_committed",
            idle_seconds: float = 3.0) -> list[tuple[str | None, dict[str, Any]]]:
    """Every record of ``topic`` (key, decoded value) a consumer with ``isolation`` reads: until it has
    ``expected_count`` and then nothing more for ``idle_seconds`` (so that a duplicate would be seen)."""
    import time

    from confluent_kafka import Consumer

    consumer = Consumer({**kafka.client_config(), "group.id": f"check-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "isolation.level": isolation, "enable.auto.commit": False})
    consumer.subscribe([topic])
    received: list[tuple[str | None, dict[str, Any]]] = []
    deadline = time.monotonic() + 60
    quiet_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                if len(received) >= expected_count and time.monotonic() - quiet_since > idle_seconds:
                    break
                continue
            quiet_since = time.monotonic()
            key = message.key().decode() if message.key() is not None else None
            received.append((key, json.loads(message.value())))
    finally:
        consumer.close()
    return received
