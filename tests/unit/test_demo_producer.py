from __future__ import annotations

import csv
import json
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from sluice.cli.demo_producer import DemoProducer, EventRecord, KafkaEventSink, encode_kafka_message, main
from tests.helpers import expected_events


def test_counts_match_the_files(tmp_path: Path) -> None:
    producer = DemoProducer(tmp_path, seed=3, malformed_rate=0.1, duplicate_rate=0.1, late_rate=0.2)
    batch = producer.produce(files=2, lines=100, now=datetime(2026, 3, 29, 1, 30, tzinfo=timezone.utc))
    lines = [line for path in batch.files if path.suffix == ".json" for line in path.read_text().splitlines()]
    assert len(lines) == batch.event_lines
    assert batch.malformed > 0 and batch.duplicates > 0 and batch.late > 0
    good, bad = expected_events(tmp_path / "events", rescue=False)
    assert (len(good), bad) == (batch.events + batch.duplicates, batch.malformed)
    rescued_good, rescued_bad = expected_events(tmp_path / "events")
    assert len(rescued_good) - len(good) == bad - rescued_bad > 0, "an amount that is not a number is rescued"
    ids = [json.loads(line)["event_id"] for line in lines if line.endswith("}") and "twelve" not in line]
    assert len(ids) > len(set(ids)), "duplicates repeat an event_id"
    with next(p for p in batch.files if p.suffix == ".csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == batch.orders + batch.malformed_orders


def test_files_appear_atomically(tmp_path: Path) -> None:
    DemoProducer(tmp_path, seed=1).produce(files=3)
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")], "no temporary file is left behind"


def test_same_seed_same_data(tmp_path: Path) -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    first = DemoProducer(tmp_path / "a", seed=5).produce(files=1, now=now)
    second = DemoProducer(tmp_path / "b", seed=5).produce(files=1, now=now)
    assert first.files[0].read_text() == second.files[0].read_text()


def test_kafka_message_is_the_file_line_keyed_by_user(tmp_path: Path) -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    produced, records = DemoProducer(tmp_path, seed=9, malformed_rate=0.2).event_records(lines=50, now=now)
    assert len(records) == produced.event_lines and produced.malformed > 0
    for record in records:
        key, value = encode_kafka_message(record)
        assert key == record.user_id.encode() and value.decode("utf-8") == record.line
        assert b"\n" not in value, "one record per message, no line terminator"
        if record.line.endswith("}") and "twelve" not in record.line:
            assert json.loads(value)["user_id"] == record.user_id
    file = DemoProducer(tmp_path, seed=9, malformed_rate=0.2).events_file(lines=50, now=now).files[0]
    assert file.read_text().splitlines() == [record.line for record in records], "Kafka and files carry one feed"


class FakeProducer:
    """Stands in for confluent_kafka.Producer: records what is produced and reports deliveries on flush."""

    def __init__(self, fail: set[int] | None = None, full_once: bool = False) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.callbacks: list[Any] = []
        self.fail = fail or set()
        self.full_once = full_once

    def produce(self, topic: str, *, key: bytes, value: bytes, on_delivery: Any) -> None:
        if self.full_once:
            self.full_once = False
            raise BufferError("Local: Queue full")
        self.sent.append((topic, key, value))
        self.callbacks.append(on_delivery)

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        for index, callback in enumerate(self.callbacks):
            callback("Broker: Not enough in-sync replicas" if index in self.fail else None, None)
        return 0


def test_kafka_sink_sends_every_record_in_order() -> None:
    records = [EventRecord("u1", '{"a": 1}'), EventRecord("u2", '{"a": 2'), EventRecord("u1", '{"a": 3}')]
    fake = FakeProducer(full_once=True)
    assert KafkaEventSink("kafka:9092", "demo.events", producer=fake).send(records) == 3
    assert fake.sent == [("demo.events", b"u1", b'{"a": 1}'), ("demo.events", b"u2", b'{"a": 2'),
                         ("demo.events", b"u1", b'{"a": 3}')]


def test_kafka_sink_raises_when_a_message_is_not_delivered() -> None:
    sink = KafkaEventSink("kafka:9092", "demo.events", producer=FakeProducer(fail={1}))
    with pytest.raises(RuntimeError, match=r"1 of 2 message\(s\) not delivered: Broker: Not enough"):
        sink.send([EventRecord("u1", "{}"), EventRecord("u2", "{}")])


@pytest.mark.parametrize(("servers", "topic", "partitions", "message"), [
    ("", "t", 1, "bootstrap_servers"), ("kafka:9092", "", 1, "topic"), ("kafka:9092", "t", 0, "partitions")])
def test_kafka_sink_checks_its_arguments(servers: str, topic: str, partitions: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KafkaEventSink(servers, topic, partitions=partitions)


def test_topic_without_bootstrap_servers_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    with pytest.raises(SystemExit):
        main(["--topic", "demo.events"])
    assert "--topic needs --kafka-connection, --kafka-bootstrap" in capsys.readouterr().err


def test_heartbeat_file_is_written_after_a_round(tmp_path: Path) -> None:
    heartbeat = tmp_path / "alive"
    assert main(["--landing-root", str(tmp_path / "landing"), "--files", "1", "--lines", "5",
                 "--heartbeat-file", str(heartbeat)]) == 0
    assert heartbeat.exists()


@pytest.mark.kafka
def test_events_reach_a_real_broker(kafka: Any) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic = f"sluice-demo-{uuid.uuid4().hex[:8]}"
    sink = KafkaEventSink(kafka.bootstrap, topic, partitions=2, config=kafka.client_config())
    assert sink.ensure_topic() is True and sink.ensure_topic() is False
    _, records = DemoProducer(Path("unused"), seed=4).event_records(lines=30)
    assert sink.send(records) == len(records)
    consumer = Consumer({**kafka.client_config(), "group.id": topic, "enable.auto.commit": False})
    ends = [consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1] for partition in (0, 1)]
    consumer.close()
    assert sum(ends) == len(records)
