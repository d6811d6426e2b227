"""Kafka on a real local Spark: the value decode and dead-letter split on a batch DataFrame with Kafka's schema, and
streams against the session's real broker (tests/conftest.py, KRaft with SASL/PLAIN) with Spark's Kafka connector
from the jars `make venv` resolved, on both Delta engines."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import parse_catalog
from sluice.connections.kafka import env_name
from sluice.constants import KAFKA_KEY_COLUMN, RESCUED_COLUMN, SOURCE_FILE_COLUMN
from sluice.errors import SluiceError
from sluice_spark.kinds.kafka import decode_records, kafka_records, require_avro
from sluice_spark.session import missing_classes
from sluice_spark.steps.quality import RAW_COLUMN, REASON_COLUMN, flag_dead_letters
from tests.helpers import roots_in, table_rows
from tests.kafka_data import clicks, consume, expected, kafka_stream, new_topic, produce

pytestmark = pytest.mark.spark

KAFKA_SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"
T = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def catalog_of(*streams: dict[str, Any]) -> Any:
    return parse_catalog({"version": 1, "streams": list(streams)})


def test_avro_without_spark_avro_names_the_package(spark: Any) -> None:
    """spark-avro is not among the pinned jars: an Avro-valued stream says which package to add."""
    assert missing_classes(spark, ["org.apache.spark.sql.avro.AvroDataToCatalyst"])
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


# --- against a real broker (the session's, tests/conftest.py) ------------------------------------------------------


def connect(kafka: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection's Spark options in the driver's environment, as the operator hands them over."""
    monkeypatch.setenv(env_name("sluice_kafka"), json.dumps(kafka.spark_options()))


@pytest.mark.parametrize("engine", ["rs", "jvm"])
def test_a_kafka_stream_ingests_a_topic_into_delta_exactly_once(spark: Any, tmp_path: Path, kafka: Any,
                                                                 monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    """Three partitions, a per-trigger limit that cuts the backlog into batches, malformed records as dead letters,
    then a run that finds nothing, then a run that finds only what came since: the table is the oracle's each time."""
    from sluice_spark.runner import run_streams

    topic = new_topic(kafka, partitions=3)
    connect(kafka, monkeypatch)
    first = [*clicks(0, 40), b"{broken", b'{"amount": 1}']
    produce(kafka, topic, first, partitions=3)
    catalog = catalog_of(kafka_stream(engine=engine, options={"subscribe": topic, "startingOffsets": "earliest",
                                                              "maxOffsetsPerTrigger": 15}))
    roots = roots_in(tmp_path)
    table = catalog.get("clicks").sink_path(roots)
    [run] = run_streams(spark, catalog, ["clicks"], roots).streams
    assert run.status == "succeeded", run.error
    good, bad = expected(first, rescue=True)
    assert (run.input_rows, run.output_rows, run.dead_letter_rows) == (len(first), len(good), bad)
    assert run.batches == 3, "42 records at most 15 a trigger"
    assert sorted(table_rows(table, ["event_id", "amount"])) == good
    assert run_streams(spark, catalog, ["clicks"], roots).streams[0].input_rows == 0, "nothing new"
    later = clicks(40, 10)
    produce(kafka, topic, later, partitions=3)
    [again] = run_streams(spark, catalog, ["clicks"], roots).streams
    assert again.input_rows == len(later)
    assert sorted(table_rows(table, ["event_id", "amount"])) == expected(first + later, rescue=True)[0]


def test_starting_offsets_latest_reads_only_what_arrives_after_the_first_run(spark: Any, tmp_path: Path, kafka: Any,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_spark.runner import run_streams

    topic = new_topic(kafka, partitions=2)
    connect(kafka, monkeypatch)
    produce(kafka, topic, clicks(0, 6), partitions=2)
    catalog = catalog_of(kafka_stream(options={"subscribe": topic, "startingOffsets": "latest"}))
    roots = roots_in(tmp_path)
    assert run_streams(spark, catalog, ["clicks"], roots).streams[0].input_rows == 0
    produce(kafka, topic, clicks(6, 4), partitions=2)
    [run] = run_streams(spark, catalog, ["clicks"], roots).streams
    assert run.input_rows == 4
    assert sorted(table_rows(catalog.get("clicks").sink_path(roots), ["event_id", "amount"])) == \
        expected(clicks(6, 4), rescue=True)[0]


def test_a_topic_deleted_and_recreated_stops_the_stream_with_a_clear_error(spark: Any, tmp_path: Path, kafka: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint's offsets are past the new topic's end: Spark would skip or fail with a stack trace; the run
    fails naming the topic, the offsets and the choices (failOnDataLoss, a reset), and writes nothing."""
    from confluent_kafka.admin import AdminClient

    from sluice.cli.kafka_broker import create_topic
    from sluice_spark.runner import run_streams

    topic = new_topic(kafka, partitions=1)
    connect(kafka, monkeypatch)
    produce(kafka, topic, clicks(0, 8))
    catalog = catalog_of(kafka_stream(options={"subscribe": topic, "startingOffsets": "earliest"}))
    roots = roots_in(tmp_path)
    assert run_streams(spark, catalog, ["clicks"], roots).streams[0].output_rows == 8
    admin = AdminClient(kafka.client_config())
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 120  # the broker removes a deleted topic's partitions in the background
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"the broker still lists the deleted topic {topic}"
        time.sleep(0.1)
    create_topic(kafka, topic, 1)
    produce(kafka, topic, clicks(100, 3))
    [run] = run_streams(spark, catalog, ["clicks"], roots).streams
    assert run.status == "failed" and not run.retryable
    assert topic in run.error and "failOnDataLoss: false" in run.error and "repair reset" in run.error, run.error
    assert sorted(table_rows(catalog.get("clicks").sink_path(roots), ["event_id", "amount"])) == \
        expected(clicks(0, 8), rescue=True)[0]


def test_a_stream_sends_its_good_rows_to_a_topic_and_its_dead_letters_to_delta(
        spark: Any, tmp_path: Path, kafka: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_spark.runner import run_streams

    topic = new_topic(kafka)
    connect(kafka, monkeypatch)
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
    received = dict(consume(kafka, topic, 5))
    assert sorted(received) == [f"o{i}" for i in range(5)]
    assert received["o3"]["amount"] == 3 and "_ingested_at" in received["o3"]
    dead = table_rows(catalog.get("orders_out").dead_letter_table_path(roots), ["raw_record"])
    assert dead == [("{broken",)]
    [again] = run_streams(spark, catalog, ["orders_out"], roots).streams
    assert again.input_rows == 0 and len(consume(kafka, topic, 5)) == 5, "each record once"
