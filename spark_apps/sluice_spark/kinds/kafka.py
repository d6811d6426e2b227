"""Kafka on the Spark side: the source (read, decode, lineage), the sink, and the check that Spark's Kafka connector
is on the classpath.

The brokers and the security settings arrive in the driver's environment
(:func:`sluice.connections.kafka.options_from_env`),
put there by the operator from the stream's Airflow connection; they never appear on the command line.

Source: ``readStream.format("kafka")`` with the catalog's options. Values are decoded with the declared schema, JSON
in PERMISSIVE mode (an undecodable value keeps its text in ``_corrupt_record``, so :mod:`sluice_spark.steps.quality`
routes it to the dead-letter table with a reason, like a malformed line of a file) or Avro binary with the inline
``value_schema`` (spark-avro). Every row keeps its lineage: ``_source_file`` is ``kafka://<topic>/<partition>/
<offset>``, ``_kafka_key`` the key as a string and ``_kafka_timestamp`` the broker's timestamp.

Sink: good rows go to the topic as ``to_json(struct(<data columns>))`` with an optional key column, exactly once:
one Kafka transaction per micro-batch from the driver (:class:`TransactionalTopic`), not Spark's Kafka writer,
which is at least once (a batch retried after a crash between its send and the checkpoint's commit sends its
records again). Dead letters go to the stream's Delta dead-letter table, exactly once.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

from sluice.connections.kafka import client_config_from_spark, options_from_env
from sluice.constants import (
    CORRUPT_COLUMN,
    KAFKA_KEY_COLUMN,
    KAFKA_TIMESTAMP_COLUMN,
    SOURCE_FILE_COLUMN,
    Envelope,
    FileFormat,
)
from sluice.errors import SluiceError
from sluice.kinds.kafka import KafkaSink, KafkaSource
from sluice.model.stream import StreamSpec, TriggerSpec
from sluice.paths import Roots
from sluice_spark import faults
from sluice_spark.drift.fields import parse_json_text
from sluice_spark.kinds.envelope import debezium_text
from sluice_spark.session import missing_classes
from sluice_spark.targets import GOOD_ROUTE, RAW_COLUMN, ROUTE_COLUMN
from sluice_spark.write.batches import BatchRouter, SinkRequest, sink_and_dead_letter, stream_commit_info

# A class of each jar the connector needs, and the jar's name.
CONNECTOR_CLASSES = {
    "org.apache.spark.sql.kafka010.KafkaSourceProvider": "spark-sql-kafka-0-10",
    "org.apache.kafka.clients.consumer.KafkaConsumer": "kafka-clients",
    "org.apache.commons.pool2.impl.GenericKeyedObjectPool": "commons-pool2",
    "org.apache.spark.kafka010.KafkaConfigUpdater": "spark-token-provider-kafka-0-10",
}
AVRO_CLASS = "org.apache.spark.sql.avro.AvroDataToCatalyst"
log = logging.getLogger(__name__)
SCALA_BINARY = "2.13"
_VALUE = "_kafka_value"
_TOMBSTONE = "_kafka_tombstone"
# A range backfill's offsets, as a source option only Sluice reads (popped before Spark sees the options).
RANGES_OPTION = "_sluice_backfill_ranges"


def _spark_version() -> str:
    import pyspark

    return pyspark.__version__


# Spark's Kafka source raises it when the checkpoint's offsets are not on the broker any more (failOnDataLoss).
DATA_LOSS_CLASS = "org.apache.spark.sql.kafka010.KafkaIllegalStateException"
_JAVA_CLASS = re.compile(r"(?:[a-z_][\w]*\.)+[A-Z][\w$]*")


def explain_failure(stream: StreamSpec, error: BaseException) -> str | None:
    """The choices a user has when Spark stopped because records the checkpoint expects are gone from the topic."""
    if DATA_LOSS_CLASS not in java_exception_classes(error):
        return None
    assert isinstance(stream.source, KafkaSource)
    return (f"stream '{stream.name}': the checkpoint's offsets are not on the brokers of {stream.source.origin} any "
            "more: a topic was deleted and recreated, or records were deleted (retention) before the stream read "
            "them. Spark stopped instead of skipping them (failOnDataLoss). To read the topic again from "
            "source.options.startingOffsets, reset the checkpoint (python -m sluice repair reset --stream "
            f"{stream.name}); to skip what is gone and go on from the earliest offsets there are, set "
            "source.options.failOnDataLoss: false")


def java_exception_classes(error: BaseException) -> list[str]:
    """The Java classes of a captured Spark error and of its causes, outermost first. pyspark keeps the Java
    throwable of most (``_origin``); one it has no Python class for keeps only its ``toString()``, which starts with
    the class's name."""
    classes: list[str] = []
    seen: BaseException | None = error
    for _ in range(20):
        if seen is None:
            break
        origin = getattr(seen, "_origin", None)
        if origin is not None:
            classes.append(str(origin.getClass().getName()))
        else:
            name = str(getattr(seen, "_desc", "") or "").split(":", 1)[0].strip()
            if _JAVA_CLASS.fullmatch(name):
                classes.append(name)
        seen = getattr(seen, "_cause", None)
    return classes


def kafka_maven_package() -> str:
    """The Maven coordinate of Spark's Kafka connector for the installed pyspark."""
    return f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY}:{_spark_version()}"


def avro_maven_package() -> str:
    return f"org.apache.spark:spark-avro_{SCALA_BINARY}:{_spark_version()}"


def require_kafka_connector(spark: SparkSession, stream: str) -> None:
    """Fail with how to provide Spark's Kafka connector when its classes do not load."""
    missing = missing_classes(spark, list(CONNECTOR_CLASSES))
    if missing:
        jars = ", ".join(CONNECTOR_CLASSES[name] for name in missing)
        raise SluiceError(
            f"stream '{stream}' reads or writes Kafka, but Spark's Kafka connector is not on the classpath (missing: "
            f"{jars}). `make venv` resolves it with Maven (python -m sluice jars, include/jvm/pom.xml) and Sluice's "
            "operators pass it to every run; an application started by hand needs the jars spark-sql-kafka-0-10, "
            f"kafka-clients, commons-pool2 and spark-token-provider-kafka-0-10 of Spark {_spark_version()} in "
            f"spark.jars (--jars), or --packages {kafka_maven_package()}"
        )


def require_avro(spark: SparkSession, stream: str) -> None:
    if missing_classes(spark, [AVRO_CLASS]):
        raise SluiceError(
            f"stream '{stream}' decodes Avro values, but spark-avro is not on the classpath. Provide it with "
            f"--packages {avro_maven_package()} (needs Maven Central) or its jar in spark.jars"
        )


def source_options(source: KafkaSource) -> dict[str, str]:
    """The connection's client options (from the driver's environment) and the catalog's source options."""
    return {**options_from_env(source.connection), **source.options}


def read(spark: SparkSession, stream: StreamSpec, roots: Roots, *, path: str | None, trigger: TriggerSpec) -> DataFrame:
    """The stream's Kafka topics as a streaming DataFrame of decoded records (see :func:`decode_records`). Kafka
    has no path and limits a batch with its own option (``maxOffsetsPerTrigger``)."""
    source = stream.source
    assert isinstance(source, KafkaSource)
    require_kafka_connector(spark, stream.name)
    if stream.source.format is FileFormat.AVRO:
        require_avro(spark, stream.name)
    options = source_options(source)
    ranges = options.pop(RANGES_OPTION, None)
    frame = spark.readStream.format("kafka").options(**options).load()
    if ranges is not None:  # a range backfill: only the planned offsets (Spark's streaming source has no end)
        frame = frame.where(in_ranges(json.loads(ranges)))
    return decode_records(frame, stream)


def in_ranges(ranges: list[dict[str, Any]]) -> Column:
    """Whether a Kafka record (Kafka's schema) is in one of the offset ranges (topic, partition, first, last)."""
    condition = F.lit(False)
    for part in ranges:
        condition = condition | ((F.col("topic") == F.lit(part["topic"]))
                                 & (F.col("partition") == F.lit(int(part["partition"])))
                                 & F.col("offset").between(int(part["first"]), int(part["last"])))
    return condition


def decode_records(frame: DataFrame, stream: StreamSpec) -> DataFrame:
    """Kafka records (Kafka's schema: binary ``key`` and ``value``, ``topic``, ``partition``, ``offset``,
    ``timestamp``; streaming or batch) as the declared columns, ``_corrupt_record`` (the value's text when it does
    not decode), ``_source_file`` (``kafka://topic/partition/offset``), ``_kafka_key`` and ``_kafka_timestamp``.

    A NULL value (a tombstone) is corrupt with an empty text: a bronze table has no row for it; under a Debezium
    envelope it is the delete of its key.
    """
    source = stream.source
    lineage = {
        SOURCE_FILE_COLUMN: F.concat(F.lit("kafka://"), F.col("topic"), F.lit("/"), F.col("partition").cast("string"),
                                     F.lit("/"), F.col("offset").cast("string")),
        KAFKA_KEY_COLUMN: F.col("key").cast("string"),
        KAFKA_TIMESTAMP_COLUMN: F.col("timestamp"),
    }
    if source.format is FileFormat.AVRO:
        value, corrupt = _decode_avro(stream)
        staged = frame.select(value.alias(_VALUE), corrupt.alias(CORRUPT_COLUMN),
                              *[column.alias(name) for name, column in lineage.items()])
        columns = [F.col(f"{_VALUE}.`{column.name}`").cast(column.sql_type).alias(column.name)
                   for column in source.schema.columns]
        return staged.select(*columns, CORRUPT_COLUMN, *lineage)
    # JSON, under the source's drift policy (:mod:`sluice_spark.drift.fields`).
    text = F.col("value").cast("string")
    tombstone = F.col("value").isNull()
    if source.envelope is Envelope.DEBEZIUM:  # a tombstone deletes its key (:mod:`sluice_spark.kinds.envelope`)
        text = debezium_text(text, source, key=F.col("key").cast("string"), timestamp=F.col("timestamp"),
                             stream=stream.name)
        tombstone = F.lit(False)
    decoded = parse_json_text(frame, text, source.read_schema, source.schema_evolution, {},
                              {**lineage, _TOMBSTONE: tombstone})
    tombstone = F.when(F.col(_TOMBSTONE), F.lit("")).otherwise(F.col(CORRUPT_COLUMN))
    return decoded.withColumn(CORRUPT_COLUMN, tombstone).drop(_TOMBSTONE)


def _decode_avro(stream: StreamSpec) -> tuple[Column, Column]:
    from pyspark.sql.avro.functions import from_avro

    source = stream.source
    if not isinstance(source, KafkaSource) or source.value_schema is None:
        raise SluiceError(f"stream '{stream.name}': an avro kafka source needs source.value_schema")
    decoded = from_avro(F.col("value"), source.value_schema, {"mode": "PERMISSIVE"})
    # The raw bytes, as base64 text: the dead-letter table keeps text.
    corrupt = F.when(F.col("value").isNull(), F.lit("")).otherwise(F.when(decoded.isNull(), F.base64("value")))
    return decoded, corrupt


# --- sink -----------------------------------------------------------------------------------------------------


def kafka_records(rows: DataFrame, data_columns: list[str], key_column: str | None) -> DataFrame:
    """Rows as Kafka records: ``value`` is the JSON of the data columns, ``key`` the key column as a string."""
    value = F.to_json(F.struct(*[F.col(f"`{name}`") for name in data_columns])).alias("value")
    if key_column is None:
        return rows.select(value)
    return rows.select(F.col(f"`{key_column}`").cast("string").alias("key"), value)


class TransactionalTopic:
    """Exactly-once delivery of a stream's micro-batches to one topic, from the driver.

    Each batch is one Kafka transaction of a transactional producer whose ``transactional.id`` is the query id, so
    a new run of the stream fences the producer of a killed one (its open transaction is aborted). The transaction
    also commits, for the consumer group ``sluice-sink-<query id>``, an offset that is the batch id + 1: that offset
    becomes visible with the records, atomically. A batch that Spark replays (its records committed, Spark's own
    commit not written before a crash) finds its offset there and sends nothing. Consumers that read with
    ``isolation.level=read_committed`` see each record once; ``read_uncommitted`` ones may also see the records of
    an aborted transaction.
    """

    def __init__(self, config: dict[str, str], topic: str, query_id: str) -> None:
        self.config, self.topic, self.query_id = config, topic, query_id
        self.group = f"sluice-sink-{query_id}"

    def send(self, records: DataFrame, batch_id: int) -> int:
        """Send ``records`` (``key``, ``value``) as one transaction for ``batch_id``; the records the topic holds
        for that batch (sent now, or before a replay). The clients live for one batch: a run keeps no connection
        open between batches, and leaves none behind."""
        from confluent_kafka import Consumer, Producer, TopicPartition

        rows = records.toArrow()
        producer = Producer({**self.config, "transactional.id": f"sluice-{self.query_id}",
                             "enable.idempotence": True, "acks": "all", "linger.ms": 5})
        # First: fence a killed run's producer and abort its open transaction. Until then the group's offset that
        # transaction would commit is pending, and reading it waits for the transaction's timeout.
        producer.init_transactions(60)
        consumer = Consumer({**self.config, "group.id": self.group, "enable.auto.commit": False,
                             "isolation.level": "read_committed"})
        try:
            [marker] = consumer.committed([TopicPartition(self.topic, 0)], timeout=30)
            if marker.offset is not None and marker.offset > batch_id:
                log.info("batch %s is in topic %s already (transaction of query %s); not sent again", batch_id,
                         self.topic, self.query_id)
                return rows.num_rows
            producer.begin_transaction()
            values = rows.column("value").to_pylist()
            keys = rows.column("key").to_pylist() if "key" in rows.column_names else [None] * len(values)
            for key, value in zip(keys, values, strict=True):
                while True:
                    try:
                        producer.produce(self.topic, value=value, key=key)
                        break
                    except BufferError:  # the local queue is full: let deliveries drain it
                        producer.poll(0.1)
            producer.send_offsets_to_transaction([TopicPartition(self.topic, 0, batch_id + 1)],
                                                 consumer.consumer_group_metadata(), 60)
            # The records are on the broker and the transaction is open: a kill from here on leaves an aborted
            # transaction's records in the log (committing would flush them anyway; this only orders it).
            producer.flush(60)
            faults.reach("before_commit", batch_id)
            producer.commit_transaction(120)
            return rows.num_rows
        finally:
            consumer.close()


def sink_writer(request: SinkRequest) -> DataStreamWriter:
    """A ``DataStreamWriter`` (without trigger or checkpoint) that sends the good rows of each micro-batch to the
    stream's topic and commits its dead letters to the Delta dead-letter table.

    Exactly once for the topic, through Kafka's transactions (:class:`TransactionalTopic`), and for the dead-letter
    table (transaction id = query id + batch id). ``request.sent`` receives the records the topic holds per batch
    id, for the run's row reconciliation.
    """
    stream, sink = request.stream, request.stream.sink
    assert isinstance(sink, KafkaSink)
    topic = TransactionalTopic(client_config_from_spark(options_from_env(sink.connection)), sink.topic,
                               request.query_id)

    def send(batch: DataFrame, batch_id: int) -> bool:
        records = kafka_records(batch.where(F.col(ROUTE_COLUMN) == GOOD_ROUTE), request.data_columns, sink.key_column)
        request.sent[batch_id] = topic.send(records, batch_id)
        faults.reach("between_commits", batch_id)
        return True

    router = BatchRouter([sink_and_dead_letter(request.targets)[1]], engine=request.engine, route_column=ROUTE_COLUMN,
                         query_id=request.query_id,
                         commit_info=stream_commit_info(request.commit_info, stream=stream.name,
                                                        query_id=request.query_id),
                         before=send, example_column=RAW_COLUMN)
    return request.frame.writeStream.foreachBatch(router)
