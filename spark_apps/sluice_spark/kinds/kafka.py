"""Kafka on the Spark side: the source (read, decode, lineage), the sink, and the check that Spark's Kafka connector
is on the classpath.

The brokers and the security settings arrive in the driver's environment
(:func:`sluice.connections.kafka.options_from_env`),
put there by the operator from the stream's Airflow connection; they never appear on the command line.

Source: ``readStream.format("kafka")`` with the catalog's options. Values are decoded with the declared schema, JSON
in PERMISSIVE mode (an undecodable value keeps its text in ``_corrupt_record``, so :mod:`sluice_spark.quality`
routes it to the dead-letter table with a reason, like a malformed line of a file) or Avro binary with the inline
``value_schema`` (spark-avro). Every row keeps its lineage: ``_source_file`` is ``kafka://<topic>/<partition>/
<offset>``, ``_kafka_key`` the key as a string and ``_kafka_timestamp`` the broker's timestamp.

Sink: good rows go to the topic as ``to_json(struct(<data columns>))`` with an optional key column; dead letters go
to the stream's Delta dead-letter table, exactly once. Spark's Kafka sink is **at least once**: a batch that is
retried after a failure (a crash between the send and the checkpoint's commit) sends its records again, so
consumers must tolerate duplicates (dedupe on the key, or on ``_source_file`` lineage carried in the value).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

from sluice.connections.kafka import options_from_env
from sluice.constants import (
    CORRUPT_COLUMN,
    KAFKA_KEY_COLUMN,
    KAFKA_TIMESTAMP_COLUMN,
    SOURCE_FILE_COLUMN,
    FileFormat,
)
from sluice.errors import SluiceError
from sluice.kinds.kafka import KafkaSink, KafkaSource
from sluice.model.stream import StreamSpec, TriggerSpec
from sluice.paths import Roots
from sluice_spark.drift import parse_json_text
from sluice_spark.session import missing_classes
from sluice_spark.targets import GOOD_ROUTE, RAW_COLUMN, ROUTE_COLUMN
from sluice_spark.writers import BatchRouter, SinkRequest, sink_and_dead_letter, stream_commit_info

# A class of each jar the connector needs, and the jar's name.
CONNECTOR_CLASSES = {
    "org.apache.spark.sql.kafka010.KafkaSourceProvider": "spark-sql-kafka-0-10",
    "org.apache.kafka.clients.consumer.KafkaConsumer": "kafka-clients",
    "org.apache.commons.pool2.impl.GenericKeyedObjectPool": "commons-pool2",
    "org.apache.spark.kafka010.KafkaConfigUpdater": "spark-token-provider-kafka-0-10",
}
AVRO_CLASS = "org.apache.spark.sql.avro.AvroDataToCatalyst"
SCALA_BINARY = "2.13"
_VALUE = "_kafka_value"
_TOMBSTONE = "_kafka_tombstone"


def _spark_version() -> str:
    import pyspark

    return pyspark.__version__


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
            f"{jars}). Provide it with --packages {kafka_maven_package()} (needs Maven Central; in Airflow, "
            "spark_submit_kwargs={'packages': ...} or the Spark connection), or put the jars spark-sql-kafka-0-10, "
            "kafka-clients, commons-pool2 and spark-token-provider-kafka-0-10 of Spark "
            f"{_spark_version()} in spark.jars (--jars) or Spark's jars directory"
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
    frame = spark.readStream.format("kafka").options(**source_options(source)).load()
    return decode_records(frame, stream)


def decode_records(frame: DataFrame, stream: StreamSpec) -> DataFrame:
    """Kafka records (Kafka's schema: binary ``key`` and ``value``, ``topic``, ``partition``, ``offset``,
    ``timestamp``; streaming or batch) as the declared columns, ``_corrupt_record`` (the value's text when it does
    not decode), ``_source_file`` (``kafka://topic/partition/offset``), ``_kafka_key`` and ``_kafka_timestamp``.

    A NULL value (a tombstone) is corrupt with an empty text: a bronze table has no row for it.
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
    # JSON, under the source's drift policy (:mod:`sluice_spark.drift`).
    decoded = parse_json_text(frame, F.col("value").cast("string"), source.read_schema, source.schema_evolution, {},
                              {**lineage, _TOMBSTONE: F.col("value").isNull()})
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


def send_records(records: DataFrame, options: dict[str, str], topic: str) -> None:
    """Write Kafka records (``key``, ``value``) to ``topic`` with Spark's batch Kafka writer."""
    records.write.format("kafka").options(**options).option("topic", topic).save()


def check_sink(spark: SparkSession, stream: StreamSpec) -> None:
    """Before any table is created: Spark's Kafka writer must be on the classpath."""
    require_kafka_connector(spark, stream.name)


def sink_writer(request: SinkRequest) -> DataStreamWriter:
    """A ``DataStreamWriter`` (without trigger or checkpoint) that sends the good rows of each micro-batch to the
    stream's topic and commits its dead letters to the Delta dead-letter table.

    At least once for the topic: Spark's Kafka writer has no transactions, so a batch that runs again after a
    failure sends its records again. The dead-letter table stays exactly once (transaction id = query id + batch
    id). ``request.sent`` receives the records sent per batch id, for the run's row reconciliation.
    """
    stream, sink = request.stream, request.stream.sink
    assert isinstance(sink, KafkaSink)
    options = options_from_env(sink.connection)

    def send(batch: DataFrame, batch_id: int) -> bool:
        records = kafka_records(batch.where(F.col(ROUTE_COLUMN) == GOOD_ROUTE), request.data_columns, sink.key_column)
        count = records.count()
        if count:
            send_records(records, options, sink.topic)
        request.sent[batch_id] = count
        return True

    router = BatchRouter([sink_and_dead_letter(request.targets)[1]], engine=request.engine, route_column=ROUTE_COLUMN,
                         query_id=request.query_id,
                         commit_info=stream_commit_info(request.commit_info, stream=stream.name,
                                                        query_id=request.query_id),
                         before=send, example_column=RAW_COLUMN)
    return request.frame.writeStream.foreachBatch(router)
