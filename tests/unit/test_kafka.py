"""Kafka without a broker or a JVM: the catalog's Kafka source and sink, the Airflow connection mapped to Spark's and
confluent-kafka's settings, and the lag probe over a checkpoint in Spark's offsets layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import parse_catalog
from sluice.connections.kafka import (
    ConnectionFields,
    client_config,
    connection_fields,
    env_name,
    env_secrets,
    options_from_env,
    redact,
    scrub,
    secret_values,
    spark_options,
)
from sluice.constants import FileFormat, SinkFormat, SourceType
from sluice.errors import SluiceError
from tests.helpers import events_stream, roots_in
from tests.unit.test_catalog import catalog_with, rejects
from tests.unit.test_lag import spark_checkpoint

SCHEMA = {"event_id": "string not null", "amount": "decimal(12,2)", "event_time": "timestamp"}


def kafka_stream(name: str = "clicks", *, options: dict[str, Any] | None = None, **source: Any) -> dict[str, Any]:
    return {
        "name": name,
        "source": {"type": "kafka", "format": "json", "schema": dict(SCHEMA),
                   "options": {"subscribe": "clicks", "startingOffsets": "earliest"} if options is None else options,
                   **source},
        "sink": {"path": f"bronze/{name}", "engine": "rs"},
        "schedule": "*/5 * * * *",
    }


# --- catalog: source --------------------------------------------------------------------------------------------


def test_kafka_source_is_accepted_with_the_default_connection() -> None:
    stream = parse_catalog(catalog_with(kafka_stream(options={
        "subscribePattern": "clicks\\..*", "startingOffsets": {"clicks.eu": {"0": 5, "1": -2}},
        "maxOffsetsPerTrigger": 10000, "minOffsetsPerTrigger": 100, "maxTriggerDelay": "15m",
        "failOnDataLoss": False}))).get("clicks")
    source = stream.source
    assert (source.type, source.format, source.connection) == (SourceType.KAFKA, FileFormat.JSON, "sluice_kafka")
    assert source.location(roots_in(Path("/x"))) is None and source.table is None, "a kafka source has no path"
    assert source.options == {"subscribePattern": "clicks\\..*", "startingOffsets": '{"clicks.eu": {"0": 5, "1": -2}}',
                              "maxOffsetsPerTrigger": "10000", "minOffsetsPerTrigger": "100",
                              "maxTriggerDelay": "15m", "failOnDataLoss": "false"}
    assert parse_catalog(catalog_with(kafka_stream(connection="kafka_eu"))).get("clicks").source.connection == \
        "kafka_eu"


def test_subscribe_and_subscribe_pattern_together_are_refused_naming_the_field() -> None:
    rejects(catalog_with(kafka_stream(options={"subscribe": "a", "subscribePattern": "b.*"})),
            "stream 'clicks'", "source.options.subscribePattern:", "exactly one of subscribe, subscribePattern")


def test_a_kafka_source_must_subscribe_to_something() -> None:
    rejects(catalog_with(kafka_stream(options={"startingOffsets": "earliest"})), "source.options:",
            "exactly one of", "got none")
    rejects(catalog_with(kafka_stream(options={"assign": {"clicks": ["0"]}})), "source.options.assign:",
            '{"topic": [0, 1]}')


@pytest.mark.parametrize("key", ["kafka.sasl.jaas.config", "kafka.bootstrap.servers", "kafka.security.protocol",
                                 "kafka.ssl.truststore.password", "kafka.SASL.mechanism"])
def test_brokers_and_security_in_the_catalog_are_refused_pointing_at_the_connection(key: str) -> None:
    rejects(catalog_with(kafka_stream(options={"subscribe": "clicks", key: "x"})), "stream 'clicks'",
            f"source.options.{key}:", "put them in the Airflow connection", "sluice_kafka")


@pytest.mark.parametrize(("options", "fragments"), [
    ({"subscribe": "a", "startingOffsets": "oldest"}, ("source.options.startingOffsets:", "not valid JSON")),
    ({"subscribe": "a", "startingOffsets": {"a": {"0": "x"}}}, ("source.options.startingOffsets:", "-2 earliest")),
    ({"subscribe": "a", "maxOffsetsPerTrigger": 0}, ("source.options.maxOffsetsPerTrigger:", "integer from 1 to")),
    ({"subscribe": "a", "maxOffsetsPerTrigger": "²"}, ("source.options.maxOffsetsPerTrigger:", "integer from 1 to")),
    ({"subscribe": "a", "maxOffsetsPerTrigger": 10**30}, ("source.options.maxOffsetsPerTrigger:", "integer from 1")),
    ({"subscribe": "a", "maxTriggerDelay": "5m"}, ("source.options.maxTriggerDelay:", "minOffsetsPerTrigger")),
    ({"subscribe": "a", "maxOffsetsPerTrigger": 5, "minOffsetsPerTrigger": 9},
     ("source.options.minOffsetsPerTrigger:", "exceeds")),
    ({"subscribe": "a", "failOnDataLoss": "maybe"}, ("source.options.failOnDataLoss:", "true or false")),
    ({"subscribe": "a", "subscribePattern": None, "endingOffsets": "latest"},
     ("source.options.endingOffsets:", "not a supported kafka source option")),
    ({"subscribe": "a", "kafka.group.id": "g"}, ("source.options.kafka.group.id:", "not a supported")),
    ({"subscribePattern": "a("}, ("source.options.subscribePattern:", "regular expression")),
])
def test_bad_kafka_source_options(options: dict[str, Any], fragments: tuple[str, ...]) -> None:
    rejects(catalog_with(kafka_stream(options=options)), "stream 'clicks'", *fragments)


def test_kafka_source_shape_errors() -> None:
    rejects(catalog_with(kafka_stream(format="csv")), "source.format:", "json or avro")
    rejects(catalog_with(kafka_stream(path="clicks")), "source: unknown key(s) path")
    rejects(catalog_with(kafka_stream(format="avro")), "source.value_schema:", "Avro schema")
    rejects(catalog_with(kafka_stream(value_schema={"type": "record"})), "source.value_schema:", "only an avro")
    rejects(catalog_with(kafka_stream(connection="bad id")), "source.connection:", "Airflow connection id")
    rejects(catalog_with({**kafka_stream(), "trigger": {"max_files_per_trigger": 5}}), "trigger:",
            "maxOffsetsPerTrigger")
    no_schema = kafka_stream()
    del no_schema["source"]["schema"]
    rejects(catalog_with(no_schema), "source.schema:", "declared schema")


def test_avro_source_needs_a_record_schema_with_the_declared_fields() -> None:
    fields = [{"name": "event_id", "type": "string"}, {"name": "amount", "type": ["null", "double"]}]
    rejects(catalog_with(kafka_stream(format="avro", value_schema={"type": "record", "name": "E", "fields": fields})),
            "source.value_schema:", "no field(s) event_time")
    fields.append({"name": "event_time", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]})
    stream = parse_catalog(catalog_with(kafka_stream(format="avro", value_schema=json.dumps(
        {"type": "record", "name": "E", "fields": fields})))).get("clicks")
    assert stream.source.format is FileFormat.AVRO and json.loads(stream.source.value_schema or "")["name"] == "E"


def test_avro_is_only_a_kafka_value_format() -> None:
    stream = events_stream()
    stream["source"]["format"] = "avro"
    rejects(catalog_with(stream), "source.format:", "a files source cannot have format avro")


# --- catalog: sink ----------------------------------------------------------------------------------------------


def kafka_sink_stream(name: str = "to_kafka", **sink: Any) -> dict[str, Any]:
    return events_stream(name, sink={"format": "kafka", "topic": "events.bronze", **sink})


def test_kafka_sink_is_accepted_and_its_dead_letters_stay_in_delta() -> None:
    catalog = parse_catalog(catalog_with(kafka_sink_stream(key_column="event_id"),
                                         kafka_sink_stream("second", connection="kafka_eu")))
    sink = catalog.get("to_kafka").sink
    assert (sink.format, sink.topic, sink.connection, sink.key_column, sink.table) == (
        SinkFormat.KAFKA, "events.bronze", "sluice_kafka", "event_id", None)
    assert catalog.get("to_kafka").dead_letter_path == "_dead_letter/to_kafka"
    assert catalog.get("second").sink.connection == "kafka_eu"


def test_kafka_sink_errors_name_the_field() -> None:
    rejects(catalog_with(events_stream(sink={"format": "kafka"})), "stream 'events'", "sink.topic:", "is required")
    rejects(catalog_with(kafka_sink_stream(topic="no spaces")), "sink.topic:", "Kafka topic name")
    rejects(catalog_with(kafka_sink_stream(key_column="nope")), "sink.key_column:",
            "'nope' is not produced by the stream")
    rejects(catalog_with(kafka_sink_stream(path="bronze/x")), "sink: unknown key(s) path")
    rejects(catalog_with(events_stream(sink={"format": "parquet", "path": "x"})), "sink.format:",
            "expected one of delta, kafka")


# --- the connection -----------------------------------------------------------------------------------------------


def test_plaintext_connection_from_host_and_port() -> None:
    conn = ConnectionFields("sluice_kafka", host="broker", port=9092)
    assert spark_options(conn) == {"kafka.bootstrap.servers": "broker:9092", "kafka.security.protocol": "PLAINTEXT"}
    assert client_config(conn) == {"bootstrap.servers": "broker:9092", "security.protocol": "PLAINTEXT"}
    assert spark_options(ConnectionFields("c", host="a:1,b:2", port=9092))["kafka.bootstrap.servers"] == "a:1,b:2"
    with pytest.raises(SluiceError, match="names no brokers"):
        spark_options(ConnectionFields("c", extra={"group.id": "g"}))


def test_sasl_plain_over_ssl_from_the_providers_extra() -> None:
    conn = ConnectionFields("sluice_kafka", extra={
        "bootstrap.servers": "b1:9093,b2:9093", "group.id": "ignored", "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN", "sasl.username": "svc", "sasl.password": 'p"w\\d', "ssl.ca.location": "/ca.pem"})
    assert spark_options(conn) == {
        "kafka.bootstrap.servers": "b1:9093,b2:9093",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                                  'username="svc" password="p\\"w\\\\d";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/ca.pem",
    }
    assert client_config(conn) == {"bootstrap.servers": "b1:9093,b2:9093", "security.protocol": "SASL_SSL",
                                   "sasl.mechanism": "PLAIN", "sasl.username": "svc", "sasl.password": 'p"w\\d',
                                   "ssl.ca.location": "/ca.pem"}


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "scram-sha-512"])
def test_scram_takes_login_and_password_when_the_extra_has_none(mechanism: str) -> None:
    conn = ConnectionFields("sluice_kafka", host="broker:9094", login="svc", password="s3cret-value",
                            extra={"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": mechanism})
    options = spark_options(conn)
    assert options["kafka.sasl.mechanism"] == mechanism.upper()
    assert options["kafka.sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                                                 'username="svc" password="s3cret-value";')
    assert client_config(conn)["sasl.password"] == "s3cret-value"


def test_ssl_with_a_pkcs12_keystore_and_no_hostname_check() -> None:
    conn = ConnectionFields("c", extra={"bootstrap.servers": "b:9093", "security.protocol": "ssl",
                                        "ssl.ca.location": "/ca.pem", "ssl.keystore.location": "/client.p12",
                                        "ssl.keystore.password": "ks-pass", "ssl.endpoint.identification.algorithm":
                                        "none"})
    options = spark_options(conn)
    assert options["kafka.security.protocol"] == "SSL" and "kafka.sasl.jaas.config" not in options
    assert options["kafka.ssl.keystore.location"] == "/client.p12" and options["kafka.ssl.keystore.type"] == "PKCS12"
    assert options["kafka.ssl.keystore.password"] == "ks-pass"
    assert options["kafka.ssl.endpoint.identification.algorithm"] == ""
    assert client_config(conn)["ssl.endpoint.identification.algorithm"] == "none"
    assert client_config(conn)["ssl.keystore.location"] == "/client.p12"


def test_connection_errors_say_what_to_fix() -> None:
    with pytest.raises(SluiceError, match=r"needs sasl\.username and sasl\.password"):
        spark_options(ConnectionFields("c", host="b:1", extra={"security.protocol": "SASL_SSL"}))
    with pytest.raises(SluiceError, match=r"GSSAPI.*not supported"):
        spark_options(ConnectionFields("c", host="b:1", login="u", password="p", extra={
            "security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}))
    with pytest.raises(SluiceError, match="set it to SASL_SSL"):
        spark_options(ConnectionFields("c", host="b:1", extra={"sasl.mechanism": "PLAIN", "sasl.username": "u"}))
    with pytest.raises(SluiceError, match=r"ssl\.keystore\.location"):
        spark_options(ConnectionFields("c", host="b:1", extra={"security.protocol": "SSL",
                                                                "ssl.certificate.location": "/c.pem"}))
    with pytest.raises(SluiceError, match="cannot read; give the CA as PEM"):
        client_config(ConnectionFields("c", host="b:1", extra={"security.protocol": "SSL",
                                                               "ssl.truststore.location": "/t.jks"}))


def test_a_real_airflow_connection_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_KAFKA", json.dumps({
        "conn_type": "kafka", "extra": {"bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL",
                                        "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "svc",
                                        "sasl.password": "hunter2-secret"}}))
    conn = connection_fields("sluice_kafka")
    assert "hunter2-secret" not in repr(conn)
    assert 'password="hunter2-secret"' in spark_options(conn)["kafka.sasl.jaas.config"]
    with pytest.raises(SluiceError, match=r"'nowhere' is not defined.*airflow connections add nowhere"):
        connection_fields("nowhere")


def test_secrets_are_found_redacted_and_scrubbed() -> None:
    options = spark_options(ConnectionFields("c", host="b:1", login="u", password="pw-12345",
                                             extra={"security.protocol": "SASL_SSL"}))
    assert "pw-12345" in secret_values(options)
    assert redact(options)["kafka.sasl.jaas.config"] == "***"
    assert redact(options)["kafka.bootstrap.servers"] == "b:1"
    environ = {env_name("sluice-kafka.eu"): json.dumps(options)}
    assert env_name("sluice-kafka.eu") == "SLUICE_KAFKA_CONN_SLUICE_KAFKA_EU"
    assert options_from_env("sluice-kafka.eu", environ) == options
    message = f"failed with {options['kafka.sasl.jaas.config']} and then pw-12345"
    assert "pw-12345" not in scrub(message, env_secrets(environ))
    with pytest.raises(SluiceError, match="did not reach the driver"):
        options_from_env("other", environ)


# --- lag ----------------------------------------------------------------------------------------------------------


def test_lag_probe_reads_the_checkpoint_and_the_brokers_with_the_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No broker runs on this machine, so the brokers' watermarks are stubbed; the checkpoint is real files in
    Spark's layout, the connection a real Airflow connection from the environment."""
    import sluice.kinds.kafka as kafka_kind
    import sluice.lag.observe as lag

    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_KAFKA", json.dumps({
        "conn_type": "kafka", "host": "broker", "port": 9093, "login": "svc", "password": "probe-secret",
        "extra": {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}}))
    stream = parse_catalog(catalog_with(kafka_stream(options={"subscribePattern": "clicks.*"}))).get("clicks")
    roots = roots_in(tmp_path)
    spark_checkpoint(Path(stream.checkpoint_path(roots)), {0: '{"clicks":{"0":100,"1":40}}',
                                                           1: '{"clicks":{"0":150,"1":60}}'}, committed=[0])
    calls: list[tuple[dict[str, Any], list[str], str | None]] = []

    def watermarks(config: dict[str, Any], *, topics: list[str] = (), pattern: str | None = None,  # type: ignore[assignment]
                   timeout: float = 10.0) -> dict[tuple[str, int], tuple[int, int]]:
        calls.append((config, list(topics), pattern))
        return {("clicks", 0): (0, 180), ("clicks", 1): (0, 40), ("clicks.eu", 0): (10, 25)}

    monkeypatch.setattr(kafka_kind, "kafka_watermarks", watermarks)
    observation = lag.observe(stream, roots, now=1_795_000_100.0)
    assert calls == [({"bootstrap.servers": "broker:9093", "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                       "sasl.username": "svc", "sasl.password": "probe-secret"}, [], "clicks.*")]
    assert observation.source_type == "kafka" and observation.last_batch_id == 0
    assert observation.backlog.partitions == {"clicks:0": 80, "clicks:1": 0, "clicks.eu:0": 15}
    assert observation.backlog.records == 95 and observation.backlog.new_partitions == ["clicks.eu:0"]


def test_lag_probe_before_the_first_commit_follows_starting_offsets_and_assign(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sluice.kinds.kafka as kafka_kind
    import sluice.lag.observe as lag

    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_EU", json.dumps({"conn_type": "kafka", "host": "broker:9092"}))
    stream = parse_catalog(catalog_with(kafka_stream(connection="kafka_eu", options={
        "assign": {"clicks": [1]}, "startingOffsets": {"clicks": {"1": 30}}}))).get("clicks")
    roots = roots_in(tmp_path)
    spark_checkpoint(Path(stream.checkpoint_path(roots)), {}, committed=[])
    monkeypatch.setattr(kafka_kind, "kafka_watermarks", lambda config, topics=(), pattern=None, timeout=10.0: {
        ("clicks", 0): (0, 500), ("clicks", 1): (0, 100)})
    backlog = lag.observe(stream, roots).backlog
    assert backlog.partitions == {"clicks:1": 70}, "only the assigned partition, from its starting offset"
