"""The registries of the kinds agree: every source type and sink format has its core kind and its Spark reader or
writer, and every kind whose streams name a connection declares its credentials, which become the variables the
Spark side reads and the secrets the runs scrub. A kind added to one registry and not the others fails here, not in
a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.catalog import load_catalog
from sluice.constants import SinkFormat, SourceType
from sluice.kinds import SINK_KINDS, SOURCE_KINDS
from sluice.kinds.base import SinkKind, SourceKind
from sluice.kinds.credentials import needed, run_environment, run_secrets, scrub_secrets
from sluice.model.keys import Block
from sluice_spark.kinds import READERS, SINKS

KAFKA_CATALOG = Path(__file__).resolve().parents[2] / "include" / "sluice" / "streams_kafka.yaml"
PASSWORD = "registry-secret-4471"


def test_every_source_type_and_sink_format_has_a_core_kind_and_a_spark_side() -> None:
    assert set(SOURCE_KINDS) == set(READERS) == set(SourceType)
    assert set(SINK_KINDS) == set(SINKS) == set(SinkFormat)
    assert all(kind.type is key for key, kind in SOURCE_KINDS.items())
    assert all(kind.format is key for key, kind in SINK_KINDS.items())


def test_every_kind_declares_the_catalog_keys_of_its_own_section() -> None:
    """A kind's keys live in its own module: the catalog reference and the JSON Schema take them from the kind."""
    from sluice.catalog.keys import SINK_BLOCKS, SOURCE_BLOCKS

    def sections(kind: SourceKind | SinkKind, path: str) -> tuple[Block, ...]:
        """The kind's variants of the section; the rest are blocks inside it (``source.clean``)."""
        blocks = kind.catalog_blocks()
        assert all(block.path == path or block.path.startswith(f"{path}.") for block in blocks)
        return tuple(block for block in blocks if block.path == path)

    for key, kind in SOURCE_KINDS.items():
        assert sections(kind, "source"), f"{type(kind).__name__} declares no keys"
        assert {block.when for block in sections(kind, "source")} == {("type", key.value)}
    for key, kind in SINK_KINDS.items():
        assert sections(kind, "sink"), f"{type(kind).__name__} declares no keys"
        assert {block.when for block in sections(kind, "sink")} == {("format", key.value)}
    assert tuple(block for kind in SOURCE_KINDS.values() for block in sections(kind, "source")) == SOURCE_BLOCKS
    assert tuple(block for kind in SINK_KINDS.values() for block in sections(kind, "sink")) == SINK_BLOCKS


def test_a_kind_whose_streams_name_a_connection_declares_its_credentials() -> None:
    catalog = load_catalog(str(KAFKA_CATALOG))
    named = [(stream.source.connection, SOURCE_KINDS[stream.source.type]) for stream in catalog] + \
            [(stream.sink.connection, SINK_KINDS[stream.sink.format]) for stream in catalog]
    assert any(conn for conn, _ in named), "the Kafka catalog names a connection"
    for conn, kind in named:
        assert (conn is None) or kind.credentials is not None, f"{type(kind).__name__} names {conn} without credentials"
    assert set(needed(catalog)) == {conn for conn, _ in named if conn}


def test_a_kinds_credentials_reach_the_spark_side_and_are_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.connections.kafka import options_from_env

    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_KAFKA", json.dumps({
        "conn_type": "kafka", "extra": {"bootstrap.servers": "b1:9093", "security.protocol": "SASL_SSL",
                                        "sasl.mechanism": "PLAIN", "sasl.username": "u",
                                        "sasl.password": PASSWORD}}))
    catalog = load_catalog(str(KAFKA_CATALOG))
    env = run_environment(catalog)
    [(conn, _)] = needed(catalog).items()
    assert options_from_env(conn, env)["kafka.bootstrap.servers"] == "b1:9093", "what the Spark reader reads"
    assert PASSWORD in " ".join(run_secrets(env))
    assert PASSWORD not in scrub_secrets(f"login failed with password {PASSWORD}", env)
