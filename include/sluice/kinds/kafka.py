"""The Kafka source and the Kafka sink.

A Kafka source reads topics (``subscribe``, ``subscribePattern`` or ``assign``) and decodes each value with the
declared schema (``format`` json, or avro with the writer's ``value_schema``). A Kafka sink sends each good row as
one record to a topic, exactly once (one Kafka transaction per micro-batch); its dead-letter table is still Delta.
Neither names a broker: the brokers and the security settings come from the Airflow connection the stream names
(:mod:`sluice.connections.kafka`).

The lag of a Kafka source is each partition's end offset on the brokers minus the checkpoint's offset of the last
committed batch, read with confluent-kafka (no JVM).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from sluice.connections.kafka import (
    DEFAULT_CONNECTION,
    client_config,
    connection_fields,
    env_name,
    env_secrets,
    is_connection_setting,
    redact,
    spark_options,
)
from sluice.constants import (
    KAFKA_KEY_COLUMN,
    KAFKA_TIMESTAMP_COLUMN,
    SOURCE_FILE_COLUMN,
    DeltaEngine,
    FileFormat,
    SchemaEvolution,
    SinkFormat,
    SinkMode,
    SourceType,
)
from sluice.errors import CatalogError, SluiceError
from sluice.kinds.base import ENVELOPE_KEYS, Backlog, Credentials, SinkKind, SourceKind, read_envelope, schema_evolution
from sluice.limits import KAFKA_MAX_OFFSETS_PER_TRIGGER
from sluice.model.keys import SCHEMA, Block, Key, Type, choices
from sluice.model.schema import parse_schema
from sluice.model.section import Section
from sluice.model.sinks import SinkSpec
from sluice.model.sources import SourceSpec
from sluice.times import parse_duration

if TYPE_CHECKING:
    from sluice.model.stream import StreamSpec
    from sluice.paths import Roots
    from sluice.storage.checkpoint import CheckpointReader


@dataclass(frozen=True, kw_only=True)
class KafkaSource(SourceSpec):
    """Kafka topics, read with the Airflow ``connection``; ``format`` is the value encoding (json, or avro with the
    writer's ``value_schema``)."""

    type: ClassVar[SourceType] = SourceType.KAFKA
    lineage: ClassVar[Mapping[str, str]] = {SOURCE_FILE_COLUMN: "STRING", KAFKA_KEY_COLUMN: "STRING",
                                            KAFKA_TIMESTAMP_COLUMN: "TIMESTAMP"}
    connection: str = DEFAULT_CONNECTION
    value_schema: str | None = None

    @property
    def origin(self) -> str:
        topics = self.options.get("subscribe") or self.options.get("subscribePattern") or self.options.get("assign")
        return f"topics {topics} (connection {self.connection})"


@dataclass(frozen=True, kw_only=True)
class KafkaSink(SinkSpec):
    """A Kafka topic written exactly once (Kafka transactions), through the Airflow ``connection``; ``key_column``
    becomes each record's key. Its rows are appended: a topic cannot be upserted or rewritten."""

    format: ClassVar[SinkFormat] = SinkFormat.KAFKA
    topic: str
    connection: str = DEFAULT_CONNECTION
    key_column: str | None = None

    @property
    def destination(self) -> str:
        return f"topic {self.topic} (connection {self.connection})"


# The drift policies each value encoding follows: an Avro value is decoded with the writer's schema, which names its
# fields.
VALUE_POLICIES = {
    FileFormat.JSON: (SchemaEvolution.RESCUE, SchemaEvolution.ADD_NEW_COLUMNS, SchemaEvolution.FAIL_ON_NEW_COLUMNS,
                      SchemaEvolution.NONE),
    FileFormat.AVRO: (SchemaEvolution.NONE,),
}
SUBSCRIPTIONS = ("subscribe", "subscribePattern", "assign")
# Spark Kafka source options a catalog may set. Client settings other than these few are the connection's business.
SOURCE_OPTIONS = frozenset(
    {*SUBSCRIPTIONS, "startingOffsets", "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
     "failOnDataLoss", "kafka.isolation.level", "kafka.fetch.max.bytes",
     "kafka.max.partition.fetch.bytes", "kafka.request.timeout.ms"}
)
_POSITIVE_OPTIONS = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger")
_BOOLEAN_OPTIONS = ("failOnDataLoss",)


def check_source_options(raw: Mapping[Any, Any], *, stream: str, field: str) -> dict[str, str]:
    """The Kafka source options of a catalog entry, validated: exactly one of subscribe, subscribePattern and
    assign; startingOffsets earliest, latest or per-partition JSON; positive per-trigger limits. A broker or
    security setting is refused: it belongs in the Airflow connection."""

    def error(key: str, message: str) -> CatalogError:
        return CatalogError(message, stream=stream, field=f"{field}.{key}")

    options: dict[str, str] = {}
    for key, value in raw.items():
        key = str(key)
        if value is None:  # YAML's `key:` with nothing after it: not set
            continue
        if is_connection_setting(key):
            raise error(key, "brokers and security settings are not catalog options; put them in the Airflow "
                             f"connection the stream names (source.connection, default {DEFAULT_CONNECTION!r})")
        if key not in SOURCE_OPTIONS:
            raise error(key, f"not a supported kafka source option; allowed: {', '.join(sorted(SOURCE_OPTIONS))}")
        if isinstance(value, Mapping | list):
            if key not in ("startingOffsets", "assign"):
                raise error(key, "expected a scalar value")
            value = json.dumps(value)
        options[key] = str(value).lower() if isinstance(value, bool) else str(value)
    chosen = [key for key in SUBSCRIPTIONS if key in options]
    if len(chosen) != 1:
        raise CatalogError(f"set exactly one of {', '.join(SUBSCRIPTIONS)}; got "
                           f"{', '.join(chosen) if chosen else 'none'}", stream=stream,
                           field=f"{field}.{chosen[1]}" if len(chosen) > 1 else field)
    if "subscribePattern" in options:
        try:
            re.compile(options["subscribePattern"])
        except re.error as exc:
            raise error("subscribePattern", f"not a valid regular expression: {exc}") from None
    if "assign" in options:
        assigned = _json_option(options["assign"], error, "assign")
        if not isinstance(assigned, dict) or not all(
            isinstance(parts, list) and all(isinstance(p, int) and not isinstance(p, bool) for p in parts)
            for parts in assigned.values()
        ):
            raise error("assign", 'expected JSON such as {"topic": [0, 1]}')
    if "subscribe" in options and not all(topic.strip() for topic in options["subscribe"].split(",")):
        raise error("subscribe", f"expected comma-separated topic names, got {options['subscribe']!r}")
    starting = options.get("startingOffsets")
    if starting is not None and starting not in ("earliest", "latest"):
        offsets = _json_option(starting, error, "startingOffsets")
        if not isinstance(offsets, dict) or not all(
            isinstance(parts, dict) and all(isinstance(o, int) and not isinstance(o, bool) for o in parts.values())
            for parts in offsets.values()
        ):
            raise error("startingOffsets", 'expected earliest, latest or JSON such as {"topic": {"0": 42, "1": -2}} '
                        "(-2 earliest, -1 latest)")
    for key in _POSITIVE_OPTIONS:
        if key in options and (not re.fullmatch(r"[0-9]{1,16}", options[key])
                               or not 0 < int(options[key]) <= KAFKA_MAX_OFFSETS_PER_TRIGGER):
            raise error(key, f"must be an integer from 1 to {KAFKA_MAX_OFFSETS_PER_TRIGGER}, got {options[key]!r}")
    for key in _BOOLEAN_OPTIONS:
        if key in options and options[key] not in ("true", "false"):
            raise error(key, f"expected true or false, got {options[key]!r}")
    if "maxTriggerDelay" in options:
        if "minOffsetsPerTrigger" not in options:
            raise error("maxTriggerDelay", "only applies with minOffsetsPerTrigger")
        try:
            parse_duration(options["maxTriggerDelay"])
        except SluiceError as exc:
            raise error("maxTriggerDelay", str(exc)) from None
    if ("maxOffsetsPerTrigger" in options and "minOffsetsPerTrigger" in options
            and int(options["minOffsetsPerTrigger"]) > int(options["maxOffsetsPerTrigger"])):
        raise error("minOffsetsPerTrigger", "exceeds maxOffsetsPerTrigger")
    return options


def _json_option(text: str, error: Any, key: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(key, f"not valid JSON ({exc.msg})") from None


def check_avro_schema(raw: object, *, stream: str, field: str, columns: Iterable[str] = ()) -> str:
    """An inline Avro schema (a mapping or its JSON text) of record type that has every declared column, as JSON
    text."""
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CatalogError(f"not valid JSON ({exc.msg})", stream=stream, field=field) from None
    else:
        parsed = raw
    if not isinstance(parsed, Mapping) or parsed.get("type") != "record" or not isinstance(parsed.get("fields"), list):
        raise CatalogError('expected an Avro record schema: {"type": "record", "name": ..., "fields": [...]}',
                           stream=stream, field=field)
    names = {f.get("name") for f in parsed["fields"] if isinstance(f, Mapping)}
    missing = [column for column in columns if column not in names]
    if missing:
        raise CatalogError(f"the Avro record has no field(s) {', '.join(missing)} of the declared schema",
                           stream=stream, field=field)
    return json.dumps(parsed, sort_keys=True)


def check_connection_id(value: object, *, stream: str, field: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
        raise CatalogError(f"expected an Airflow connection id, got {value!r}", stream=stream, field=field)
    return value


def check_topic(value: object, *, stream: str, field: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", value):
        raise CatalogError(f"expected a Kafka topic name (letters, digits, '.', '_', '-'), got {value!r}",
                           stream=stream, field=field)
    return value


# --- lag -----------------------------------------------------------------------------------------------------

Watermarks = Mapping[tuple[str, int], tuple[int, int]]


def kafka_backlog(processed: Mapping[str, Mapping[str, int]] | None, watermarks: Watermarks, *,
                  starting_offsets: str | Mapping[str, Mapping[str, int]] = "latest") -> Backlog:
    """Offsets behind per partition: the broker's end offset minus the checkpoint's, for every partition the
    broker has. ``processed`` is the Kafka source's offset JSON of the last committed batch (``{topic: {partition:
    next offset}}``, as in ``offsets/N``); ``watermarks`` maps (topic, partition) to the (earliest, end) offsets.

    Without a committed batch the first run starts at ``startingOffsets`` (Spark's default for a stream: latest,
    so nothing is behind; ``earliest``; or per-partition JSON where -2 is earliest and -1 latest). With one, a
    partition the checkpoint does not know is new, and Spark reads it from its earliest offset. A checkpoint offset
    below the earliest one means retention deleted data the stream never read; it counts from the earliest offset
    and is noted.
    """
    backlog = Backlog(records=0)
    total = 0
    for (topic, partition), (earliest, end) in sorted(watermarks.items()):
        key = f"{topic}:{partition}"
        if processed is None:
            offset = _starting_offset(starting_offsets, topic, partition, earliest, end)
        elif str(partition) in processed.get(topic, {}):
            offset = int(processed[topic][str(partition)])
        else:
            offset = earliest
            backlog.new_partitions.append(key)
        if offset < earliest:
            backlog.notes.append(f"{key}: offsets {offset}..{earliest - 1} were deleted by retention before the "
                                 "stream read them")
            offset = earliest
        backlog.partitions[key] = max(end - offset, 0)
        total += backlog.partitions[key]
    backlog.records = total
    backlog.arrivals = frozenset(f"{topic}:{partition}@{end}" for (topic, partition), (_, end) in watermarks.items()
                                 if backlog.partitions.get(f"{topic}:{partition}"))
    return backlog


def _starting_offset(starting: str | Mapping[str, Mapping[str, int]], topic: str, partition: int, earliest: int,
                     end: int) -> int:
    if isinstance(starting, str):
        if starting not in ("earliest", "latest"):
            raise SluiceError(f"startingOffsets {starting!r}: expected earliest, latest or per-partition offsets")
        return earliest if starting == "earliest" else end
    offset = int(starting.get(topic, {}).get(str(partition), -1))
    return earliest if offset == -2 else end if offset == -1 else offset


def kafka_watermarks(config: Mapping[str, Any], *, topics: Sequence[str] = (), pattern: str | None = None,
                     timeout: float = 10.0) -> dict[tuple[str, int], tuple[int, int]]:
    """(earliest, end) offsets of every partition of the topics, or of the topics matching ``pattern``, from the
    broker (confluent-kafka). ``config`` is librdkafka configuration: ``bootstrap.servers`` and any security
    settings, from an Airflow connection."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"group.id": "sluice-lag-probe", "enable.auto.commit": False, **config})
    try:
        metadata = consumer.list_topics(timeout=timeout)
        wanted = [name for name in metadata.topics if (name in topics) or (pattern and re.fullmatch(pattern, name))]
        missing = [name for name in topics if name not in metadata.topics]
        if missing:
            raise SluiceError(f"Kafka topic(s) {', '.join(missing)} do not exist on {config.get('bootstrap.servers')}")
        marks = {}
        for name in wanted:
            for partition in metadata.topics[name].partitions:
                marks[(name, partition)] = consumer.get_watermark_offsets(TopicPartition(name, partition),
                                                                          timeout=timeout)
        return marks
    finally:
        consumer.close()


def subscribed_topics(options: Mapping[str, str]) -> list[str]:
    """The topics a source's options name (``assign`` or ``subscribe``); none for ``subscribePattern``."""
    if "assign" in options:
        return list(json.loads(options["assign"]))
    return [topic.strip() for topic in options.get("subscribe", "").split(",") if topic.strip()]


def source_watermarks(options: Mapping[str, str], config: Mapping[str, Any]) -> dict[tuple[str, int], tuple[int, int]]:
    """(earliest, end) offsets of every partition a source's options read (only the assigned ones under
    ``assign``)."""
    marks = kafka_watermarks(config, topics=subscribed_topics(options), pattern=options.get("subscribePattern"))
    if "assign" in options:
        assigned: dict[str, list[int]] = json.loads(options["assign"])
        marks = {key: mark for key, mark in marks.items() if key[1] in assigned.get(key[0], [])}
    return marks


class KafkaCredentials(Credentials):
    """A Kafka connection reaches the driver as one ``SLUICE_KAFKA_CONN_<ID>`` variable: the JSON of its Spark
    ``kafka.*`` options (:mod:`sluice.connections.kafka`)."""

    def environment(self, conn_id: str) -> dict[str, str]:
        return {env_name(conn_id): json.dumps(spark_options(connection_fields(conn_id)))}

    def secrets(self, environ: Mapping[str, str]) -> list[str]:
        return env_secrets(environ)

    def described(self, env: Mapping[str, str]) -> str:
        return "; ".join(f"Kafka, {redact(json.loads(text))}" for text in env.values())


KAFKA_CREDENTIALS = KafkaCredentials()


_KAFKA_SOURCE = Block(
    "source (kafka)", "source", "Topics of a Kafka cluster; brokers and security come from an Airflow connection.",
    (
        Key("type", Type.CHOICE, "the source kind", required=True, choices=("kafka",)),
        Key("format", Type.CHOICE, "the record values' encoding", default=FileFormat.JSON,
            choices=choices(VALUE_POLICIES)),
        SCHEMA,
        Key("value_schema", Type.AVRO, "the writer's Avro schema, inline (format avro only, where it is required)"),
        Key("options", Type.OPTIONS, "Spark Kafka source options: exactly one of subscribe, subscribePattern, "
            "assign; no broker or security setting (those are the connection's)", required=True,
            choices=tuple(sorted(SOURCE_OPTIONS))),
        Key("connection", Type.STRING, "the Airflow connection with the brokers and security settings",
            default=DEFAULT_CONNECTION),
        Key("schema_evolution", Type.CHOICE, "what the stream does with fields the schema does not declare (json: "
            "rescue, add_new_columns, fail_on_new_columns, none; avro: none)", default=SchemaEvolution.RESCUE,
            default_text="rescue (json), none (avro)",
            choices=choices(dict.fromkeys(p for ps in VALUE_POLICIES.values() for p in ps))),
        *ENVELOPE_KEYS,
    ),
    when=("type", "kafka"),
    one_option_of=SUBSCRIPTIONS,
)

_KAFKA_SINK = Block(
    "sink (kafka)", "sink", "A Kafka topic, written exactly once with Kafka transactions.",
    (
        Key("format", Type.CHOICE, "the sink kind", required=True, choices=("kafka",)),
        Key("topic", Type.STRING, "the topic", required=True),
        Key("connection", Type.STRING, "the Airflow connection with the brokers and security settings",
            default=DEFAULT_CONNECTION),
        Key("key_column", Type.STRING, "the output column that becomes each record's key"),
        Key("engine", Type.CHOICE, "the Delta engine of the dead-letter table", default=DeltaEngine.AUTO,
            choices=choices(DeltaEngine)),
        Key("mode", Type.CHOICE, "a topic takes appended rows only", default=SinkMode.APPEND, choices=("append",)),
    ),
    when=("format", "kafka"),
)


class KafkaSourceKind(SourceKind):
    type = SourceType.KAFKA
    credentials = KAFKA_CREDENTIALS
    trigger_limits = False
    measures_bytes = False
    # Backfilled by offsets per partition or by the records' timestamps (sluice.operations.kafka_range).
    backfill_refusal = None

    def catalog_blocks(self) -> tuple[Block, ...]:
        return (_KAFKA_SOURCE,)

    def parse(self, section: Section) -> KafkaSource:
        """Value encoding, declared schema, subscription options and the connection's name."""
        stream = section.stream or ""
        value_format = section.enum("format", FileFormat, FileFormat.JSON)
        if value_format not in (FileFormat.JSON, FileFormat.AVRO):
            raise section.error("format", f"a kafka source's format is its value encoding: json or avro, got "
                                          f"{value_format.value}")
        if "schema" not in section.raw or section.raw["schema"] is None:
            raise section.error("schema", "a kafka source needs a declared schema of its values")
        schema = parse_schema(section.get("schema", Mapping), stream=stream, field=section.field("schema"))
        value_schema = section.get("value_schema", (str, Mapping))
        if value_format is FileFormat.AVRO:
            if value_schema is None:
                raise section.error("value_schema", "an avro kafka source needs the writer's Avro schema (inline)")
            value_schema = check_avro_schema(value_schema, stream=stream, field=section.field("value_schema"),
                                             columns=schema.names)
        elif value_schema is not None:
            raise section.error("value_schema", "only an avro kafka source has a value_schema; json values are "
                                                "decoded with the declared schema")
        options = check_source_options(section.get("options", Mapping, {}, required=True), stream=stream,
                                       field=section.field("options"))
        connection = _connection(section)
        policy = schema_evolution(section, VALUE_POLICIES[value_format], f"kafka {value_format.value}")
        unwrap, schema = read_envelope(section, schema, json=value_format is FileFormat.JSON)
        section.done()
        return KafkaSource(format=value_format, schema=schema, options=options, connection=connection,
                           value_schema=value_schema, schema_evolution=policy, envelope=unwrap.envelope,
                           envelope_tiebreak=unwrap.tiebreak, envelope_truncate=unwrap.truncate)

    def backlog(self, stream: StreamSpec, roots: Roots, reader: CheckpointReader) -> Backlog:
        """The offsets the next run reads: the checkpoint's offsets of the last committed batch against the brokers'
        watermarks, read with the stream's Airflow connection (its brokers and security)."""
        source = stream.source
        assert isinstance(source, KafkaSource)
        options = source.options
        marks = source_watermarks(options, client_config(connection_fields(source.connection)))
        starting = options.get("startingOffsets", "latest")
        return kafka_backlog(reader.committed_source_offset(), marks,
                             starting_offsets=json.loads(starting) if starting.startswith("{") else starting)


class KafkaSinkKind(SinkKind):
    format = SinkFormat.KAFKA
    credentials = KAFKA_CREDENTIALS
    backfill_refusal = "backfills replace or append Delta rows, and a topic cannot be rewritten"

    def catalog_blocks(self) -> tuple[Block, ...]:
        return (_KAFKA_SINK,)

    def parse(self, section: Section) -> KafkaSink:
        """The topic, the connection, an optional key column. Its dead-letter table's engine may be set."""
        topic = check_topic(section.get("topic", str, required=True), stream=section.stream or "",
                            field=section.field("topic"))
        sink = KafkaSink(topic=topic, connection=_connection(section), key_column=section.get("key_column", str),
                         engine=section.enum("engine", DeltaEngine, DeltaEngine.AUTO))
        mode = section.enum("mode", SinkMode, SinkMode.APPEND)
        section.done()
        if mode is not SinkMode.APPEND:
            raise section.error("mode", "a kafka sink takes appended rows: Sluice sends each row once per batch, "
                                        "and a topic cannot be upserted or rewritten")
        return sink

    def asset_uri(self, sink: SinkSpec) -> tuple[str, str]:
        """A topic, under its connection's name (not its brokers, which a deployment may move)."""
        assert isinstance(sink, KafkaSink)
        return f"sluice://kafka/{sink.connection}/{sink.topic}", "kafka"

    def check_output(self, sink: SinkSpec, columns: list[str], *, stream: str) -> None:
        assert isinstance(sink, KafkaSink)
        if sink.key_column is not None and sink.key_column not in columns:
            raise CatalogError(f"key column {sink.key_column!r} is not produced by the stream; output columns: "
                               f"{', '.join(columns)}", stream=stream, field="sink.key_column")


def _connection(section: Section) -> str:
    return check_connection_id(section.get("connection", str, DEFAULT_CONNECTION), stream=section.stream or "",
                               field=section.field("connection"))
