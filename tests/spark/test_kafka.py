"""Kafka on a real local Spark: the connector check, the value decode and dead-letter split, and the sink's records.

Spark's Kafka connector (spark-sql-kafka-0-10) is not on this machine's classpath (Maven Central is unreachable)
and no broker runs here, so the decode is tested on a batch DataFrame with Kafka's schema, and the end-to-end tests
run only where ``KAFKA_BOOTSTRAP_SERVERS`` names a broker and the connector jars are provided.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import parse_catalog
from sluice.connections.kafka import env_name
from sluice.constants import KAFKA_KEY_COLUMN, RESCUED_COLUMN, SOURCE_FILE_COLUMN
from sluice.errors import SluiceError
from sluice_spark.kinds.kafka import CONNECTOR_CLASSES, decode_records, kafka_records, require_avro
from sluice_spark.quality import RAW_COLUMN, REASON_COLUMN, flag_dead_letters
from sluice_spark.session import missing_classes
from tests.helpers import events_stream, roots_in, table_rows

pytestmark = pytest.mark.spark

KAFKA_SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"
T = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def kafka_stream(name: str = "clicks", **source: Any) -> dict[str, Any]:
    return {"name": name,
            "source": {"type": "kafka", "format": "json", "options": {"subscribe": "clicks",
                                                                      "startingOffsets": "earliest"},
                       "schema": {"event_id": "string not null", "amount": "decimal(12,2)", "at": "timestamp"},
                       **source},
            "sink": {"path": f"bronze/{name}", "engine": "rs"}, "schedule": "*/5 * * * *"}


def catalog_of(*streams: dict[str, Any]) -> Any:
    return parse_catalog({"version": 1, "streams": list(streams)})


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


def test_without_the_connector_jars_a_kafka_stream_fails_before_any_table_is_created(spark: Any,
                                                                                      tmp_path: Path) -> None:
    from sluice_spark.runner import run_streams

    if not missing_classes(spark, list(CONNECTOR_CLASSES)):
        pytest.skip("Spark's Kafka connector is on this classpath; the missing-jars error cannot be provoked")
    roots = roots_in(tmp_path)
    catalog = catalog_of(kafka_stream(), events_stream("to_kafka", sink={"format": "kafka", "topic": "out"}))
    for name in ("clicks", "to_kafka"):
        with pytest.raises(SluiceError) as caught:
            run_streams(spark, catalog, [name], roots)
        message = str(caught.value)
        assert f"stream '{name}'" in message
        assert "spark-sql-kafka-0-10" in message and "kafka-clients" in message and "commons-pool2" in message
        assert f"--packages org.apache.spark:spark-sql-kafka-0-10_2.13:{spark.version}" in message
        assert "spark.jars" in message
    lake = Path(roots.lake)
    assert not lake.exists() or not list(lake.rglob("_delta_log")), "no table may be created"


def test_avro_without_spark_avro_names_the_package(spark: Any) -> None:
    if not missing_classes(spark, ["org.apache.spark.sql.avro.AvroDataToCatalyst"]):
        pytest.skip("spark-avro is on this classpath")
    with pytest.raises(SluiceError, match=f"spark-avro_2.13:{spark.version}"):
        require_avro(spark, "clicks")


@pytest.mark.parametrize("policy", ["none", "rescue"])
def test_json_values_decode_with_the_declared_schema_and_bad_ones_become_dead_letters(spark: Any,
                                                                                      policy: str) -> None:
    stream = catalog_of(kafka_stream(schema_evolution=policy)).get("clicks")
    values: list[bytes | None] = [
        b'{"event_id": "e1", "amount": 12.5, "at": "2026-11-22T12:00:00Z"}',
        b'{"event_id": "e2", "amount": "twelve"}',
        b"not json at all",
        None,
        b'{"amount": 3}',
        b"[1, 2]",
        b'{"event_id": "e3", "extra": true}',
    ]
    rows = [(f"k{i}".encode() if i % 2 else None, value, "clicks", i % 2, 100 + i, T) for i, value in
            enumerate(values)]
    frame = flag_dead_letters(decode_records(spark.createDataFrame(rows, KAFKA_SCHEMA), stream), stream)
    result = {row[SOURCE_FILE_COLUMN]: row.asDict() for row in frame.collect()}

    good, bad = expected(values, rescue=policy == "rescue")
    assert sorted((r["event_id"], r["amount"]) for r in result.values() if r[REASON_COLUMN] is None) == good
    assert sum(r[REASON_COLUMN] is not None for r in result.values()) == bad
    assert result["kafka://clicks/0/100"]["at"] == datetime(2026, 11, 22, 12, 0)
    assert result["kafka://clicks/1/101"][KAFKA_KEY_COLUMN] == "k1"
    if policy == "rescue":  # kept beside the typed columns, as it arrived
        assert result["kafka://clicks/1/101"][REASON_COLUMN] is None
        assert json.loads(result["kafka://clicks/1/101"][RESCUED_COLUMN]) == {"amount": "twelve"}
        assert json.loads(result["kafka://clicks/0/106"][RESCUED_COLUMN]) == {"extra": True}
        assert result["kafka://clicks/0/100"][RESCUED_COLUMN] is None
    else:
        assert result["kafka://clicks/1/101"][REASON_COLUMN] == ("field 'amount': cannot parse 'twelve' as "
                                                                 "DECIMAL(12,2)")
        assert result["kafka://clicks/1/101"][RAW_COLUMN] == values[1].decode()  # type: ignore[union-attr]
        assert RESCUED_COLUMN not in result["kafka://clicks/0/106"]
    assert result["kafka://clicks/0/102"][REASON_COLUMN] == "malformed JSON record"
    assert result["kafka://clicks/0/102"][RAW_COLUMN] == "not json at all"
    assert result["kafka://clicks/1/103"][REASON_COLUMN] == "malformed JSON record", "a tombstone has no row"
    assert result["kafka://clicks/0/104"][REASON_COLUMN] == "missing required field 'event_id'"


def test_sink_records_are_the_data_columns_as_json_with_the_key(spark: Any) -> None:
    frame = spark.createDataFrame([("e1", Decimal("1.50"), 7)], "event_id string, amount decimal(12,2), n int")
    [record] = kafka_records(frame, ["event_id", "amount"], "n").collect()
    assert record["key"] == "7"
    assert json.loads(record["value"]) == {"event_id": "e1", "amount": 1.5}
    assert kafka_records(frame, ["n"], None).columns == ["value"]


# --- against a real broker ------------------------------------------------------------------------------------------

needs_broker = pytest.mark.skipif(not os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
                                  reason="needs a Kafka broker: set KAFKA_BOOTSTRAP_SERVERS (none runs on this "
                                         "machine), and Spark's Kafka connector jars on the classpath")


@needs_broker
def test_a_kafka_stream_ingests_a_topic_into_delta(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from sluice_spark.runner import run_streams

    if missing_classes(spark, list(CONNECTOR_CLASSES)):
        pytest.skip("Spark's Kafka connector jars are not on the classpath")
    servers = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    topic = f"sluice-{uuid.uuid4().hex[:8]}"
    AdminClient({"bootstrap.servers": servers}).create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    values = [json.dumps({"event_id": f"e{i}", "amount": i / 4}).encode() for i in range(20)] + [b"{broken"]
    producer = Producer({"bootstrap.servers": servers})
    for index, value in enumerate(values):
        producer.produce(topic, value=value, partition=index % 2)
    producer.flush(30)
    monkeypatch.setenv(env_name("sluice_kafka"), json.dumps({"kafka.bootstrap.servers": servers}))
    stream = kafka_stream(options={"subscribe": topic, "startingOffsets": "earliest"})
    catalog = catalog_of(stream)
    roots = roots_in(tmp_path)
    summary = run_streams(spark, catalog, ["clicks"], roots)
    [run] = summary.streams
    good, bad = expected(values, rescue=True)
    assert run.status == "succeeded", run.error
    assert (run.input_rows, run.output_rows, run.dead_letter_rows) == (len(values), len(good), bad)
    table = catalog.get("clicks").sink_path(roots)
    assert sorted(table_rows(table, ["event_id", "amount"])) == good
    again = run_streams(spark, catalog, ["clicks"], roots).streams[0]
    assert again.input_rows == 0, "a second run finds nothing new"


@needs_broker
def test_a_stream_sends_its_good_rows_to_a_topic_and_its_dead_letters_to_delta(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient, NewTopic

    from sluice_spark.runner import run_streams

    if missing_classes(spark, list(CONNECTOR_CLASSES)):
        pytest.skip("Spark's Kafka connector jars are not on the classpath")
    servers = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    topic = f"sluice-out-{uuid.uuid4().hex[:8]}"
    AdminClient({"bootstrap.servers": servers}).create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    monkeypatch.setenv(env_name("sluice_kafka"), json.dumps({"kafka.bootstrap.servers": servers}))
    roots = roots_in(tmp_path)
    landing = Path(roots.landing) / "orders"
    landing.mkdir(parents=True)
    lines = [json.dumps({"order_id": f"o{i}", "amount": i}) for i in range(5)] + ["{broken"]
    (landing / "part-0.json").write_text("\n".join(lines) + "\n")
    catalog = catalog_of({"name": "orders_out", "source": {"type": "files", "format": "json", "path": "orders",
                                                           "schema": {"order_id": "string not null", "amount": "int"}},
                          "sink": {"format": "kafka", "topic": topic, "key_column": "order_id", "engine": "rs"},
                          "schedule": "*/5 * * * *"})
    [run] = run_streams(spark, catalog, ["orders_out"], roots).streams
    assert run.status == "succeeded", run.error
    assert (run.input_rows, run.output_rows, run.dead_letter_rows) == (6, 5, 1)
    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"t-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    received: dict[str, dict[str, Any]] = {}
    try:
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                received[message.key().decode()] = json.loads(message.value())
            if len(received) == 5:
                break
    finally:
        consumer.close()
    assert sorted(received) == [f"o{i}" for i in range(5)]
    assert received["o3"]["amount"] == 3 and "_ingested_at" in received["o3"]
    dead = table_rows(catalog.get("orders_out").dead_letter_table_path(roots), ["raw_record"])
    assert dead == [("{broken",)]


def test_the_kafka_sink_routes_good_rows_to_the_topic_and_dead_letters_to_delta(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's Kafka-sink wiring on real Spark and a real Delta dead-letter table. No broker runs here and the
    connector is missing, so the one call that hands records to Spark's Kafka writer is replaced by a collector."""
    import sluice_spark.kinds.kafka as spark_kafka
    from sluice_spark.runner import run_streams

    sent: list[tuple[str, dict[str, str], list[tuple[str, str]]]] = []
    monkeypatch.setattr(spark_kafka, "require_kafka_connector", lambda spark, stream: None)
    monkeypatch.setattr(spark_kafka, "send_records", lambda records, options, topic: sent.append(
        (topic, options, [(row["key"], row["value"]) for row in records.collect()])))
    monkeypatch.setenv(env_name("sluice_kafka"), json.dumps({"kafka.bootstrap.servers": "broker:9092"}))
    roots = roots_in(tmp_path)
    landing = Path(roots.landing) / "orders"
    landing.mkdir(parents=True)
    lines = [json.dumps({"order_id": f"o{i}", "amount": i}) for i in range(4)] + ["{broken", '{"amount": 1}']
    (landing / "part-0.json").write_text("\n".join(lines) + "\n")
    catalog = catalog_of({"name": "orders_out", "source": {"type": "files", "format": "json", "path": "orders",
                                                           "schema": {"order_id": "string not null", "amount": "int"}},
                          "sink": {"format": "kafka", "topic": "orders.bronze", "key_column": "order_id",
                                   "engine": "rs"},
                          "expectations": {"positive": {"check": "amount > 0", "on_violation": "drop"}},
                          "schedule": "*/5 * * * *"})
    [run] = run_streams(spark, catalog, ["orders_out"], roots).streams
    assert run.status == "succeeded", run.error
    assert (run.input_rows, run.output_rows, run.dead_letter_rows, run.dropped_rows) == (6, 3, 2, 1)
    assert run.delta_version_before is None and run.delta_version_after is None
    [(topic, options, records)] = sent
    assert (topic, options) == ("orders.bronze", {"kafka.bootstrap.servers": "broker:9092"})
    values = {key: json.loads(value) for key, value in records}
    assert sorted(values) == ["o1", "o2", "o3"]  # o0 broke the drop rule
    assert values["o2"]["amount"] == 2 and values["o2"]["_source_file"].endswith("part-0.json")
    dead = sorted(table_rows(catalog.get("orders_out").dead_letter_table_path(roots), ["raw_record", "reason"]))
    assert dead == [('{"amount":1}', "missing required field 'order_id'"), ("{broken", "malformed JSON record")]
    assert not (Path(roots.lake) / "_delta_log").exists(), "a Kafka sink creates no table at the lake root"
    assert run_streams(spark, catalog, ["orders_out"], roots).streams[0].input_rows == 0
