"""Iceberg catalogs through Airflow connections, and the Iceberg source's planning, without Spark.

A connection becomes pyiceberg catalog properties (PostgreSQL: a SQL catalog; http/iceberg: a REST catalog) and
reaches the driver as one variable whose secrets are masked and scrubbed (the PostgreSQL catalog on a real server:
tests/spark/test_iceberg_postgres.py; the REST catalog is tested for its mapping and refusals only).
The source's planning reads snapshot histories written by pyiceberg: appends are read, a compaction passed over,
an overwrite refused (naming the table and the snapshot) unless skipped, and the lag counts what is unread.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sluice.catalog import load_catalog
from sluice.connections.iceberg import (
    CatalogConnection,
    catalog_properties,
    connection_properties,
    env_name,
    redact,
)
from sluice.constants import SourceType
from sluice.errors import CatalogError, SluiceError
from sluice.kinds import SOURCE_KINDS
from sluice.kinds.credentials import needed, run_secrets, scrub_secrets
from sluice.kinds.iceberg import ICEBERG_CREDENTIALS, IcebergSink, IcebergSource
from sluice.storage.checkpoint import CheckpointReader
from sluice.storage.iceberg import IcebergTableFormat, default_catalog_properties
from sluice.storage.iceberg_snapshots import IcebergSourceError, check_readable, history_after
from tests.helpers import events_stream, roots_in, write_catalog

SECRET = "s3cr3t/p@ss:word"


def silver(**source: Any) -> dict[str, Any]:
    return {"name": "silver", "transform": "identity", "checkpoint": "silver/events", "schedule": "*/5 * * * *",
            "source": {"type": "iceberg", "table": "bronze.events", "schema": {"id": "bigint not null"}, **source},
            "sink": {"path": "silver/events"}}


def test_a_postgres_connection_is_a_sql_catalog_its_password_quoted() -> None:
    conn = CatalogConnection("pg_cat", "postgres", host="db", port=5433, schema="iceberg", login="sluice",
                             password=SECRET, extra={"warehouse": "s3://lake/iceberg"})
    properties = catalog_properties(conn)
    assert properties == {"type": "sql", "warehouse": "s3://lake/iceberg",
                          "uri": "postgresql+psycopg2://sluice:s3cr3t%2Fp%40ss%3Aword@db:5433/iceberg"}
    assert SECRET not in repr(conn)
    assert redact(properties)["uri"] == "***" and redact(properties)["warehouse"] == "s3://lake/iceberg"
    uri_only = CatalogConnection("any", "generic", extra={"uri": "sqlite:////tmp/x.db"})
    assert catalog_properties(uri_only) == {"uri": "sqlite:////tmp/x.db", "type": "sql"}


def test_an_http_connection_is_a_rest_catalog_with_its_token_or_credential() -> None:
    token = catalog_properties(CatalogConnection("rest", "http", host="catalog", port=8181, password=SECRET,
                                                 extra={"warehouse": "lake"}))
    assert token == {"type": "rest", "uri": "http://catalog:8181", "token": SECRET, "warehouse": "lake"}
    client = catalog_properties(CatalogConnection("rest", "iceberg", host="https://polaris.example/api/catalog",
                                                  login="client", password=SECRET,
                                                  extra={"scope": "PRINCIPAL_ROLE:ALL"}))
    assert client == {"type": "rest", "uri": "https://polaris.example/api/catalog", "credential": f"client:{SECRET}",
                      "scope": "PRINCIPAL_ROLE:ALL"}
    assert redact(client) == {**client, "credential": "***"}


@pytest.mark.parametrize(("conn", "message"), [
    (CatalogConnection("kafka_cat", "kafka", host="broker"), "Iceberg catalog connection 'kafka_cat' is of type "
                                                             "'kafka'; expected postgres"),
    (CatalogConnection("pg", "postgres"), "Iceberg catalog connection 'pg' (postgres) names no host"),
    (CatalogConnection("rest", "http"), "Iceberg catalog connection 'rest' (http) names no host"),
])
def test_a_connection_that_is_no_catalog_is_refused_naming_it(conn: CatalogConnection, message: str) -> None:
    with pytest.raises(SluiceError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        catalog_properties(conn)


def test_the_connection_reaches_the_driver_as_one_variable_whose_secrets_are_scrubbed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PG_CAT", json.dumps({"conn_type": "postgres", "host": "db", "port": 5432,
                                                          "login": "sluice", "password": SECRET,
                                                          "schema": "iceberg"}))
    env = ICEBERG_CREDENTIALS.environment("pg_cat")
    assert list(env) == [env_name("pg_cat")] == ["SLUICE_ICEBERG_CONN_PG_CAT"]
    assert SECRET not in ICEBERG_CREDENTIALS.described(env)
    assert connection_properties("pg_cat", env)["uri"].startswith("postgresql+psycopg2://sluice:")
    secrets = run_secrets(env)
    assert SECRET in secrets and env[env_name("pg_cat")] in secrets
    assert scrub_secrets(f"could not connect with {SECRET}", env) == "could not connect with ***"
    with pytest.raises(SluiceError, match="must be a JSON object of pyiceberg catalog properties"):
        connection_properties("pg_cat", {env_name("pg_cat"): json.dumps({"uri": "x"})})


def test_the_catalog_names_a_connection_that_runs_need(tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(
        tmp_path, events_stream(sink={"format": "iceberg", "table": "bronze.events", "catalog": "pg_cat"}),
        silver(catalog="rest_cat")))
    sink, source = catalog.get("events").sink, catalog.get("silver").source
    assert isinstance(sink, IcebergSink) and isinstance(source, IcebergSource)
    assert (sink.connection, source.connection) == ("pg_cat", "rest_cat")
    assert set(needed(catalog)) == {"pg_cat", "rest_cat"}
    with pytest.raises(CatalogError, match=r"source\.catalog.*expected default or an Airflow connection id"):
        load_catalog(write_catalog(tmp_path, silver(catalog="not a conn!")))


@pytest.mark.parametrize(("source", "field", "message"), [
    ({"format": "delta"}, "source.format", "an iceberg source cannot have format delta"),
    ({"options": {"startingVersion": 0}}, "source.options.startingVersion", "not a supported iceberg source option"),
    ({"options": {"streaming-skip-delete-snapshots": "yes"}}, "source.options.streaming-skip-delete-snapshots",
     "expected true or false"),
    ({"table": "events"}, "source.table", "expected an Iceberg identifier"),
])
def test_an_iceberg_source_refuses_what_it_cannot_read(tmp_path: Path, source: dict[str, Any], field: str,
                                                       message: str) -> None:
    with pytest.raises(CatalogError, match=f"{field}.*{message}"):
        load_catalog(write_catalog(tmp_path, silver(**source)))


def _table(properties: dict[str, str]) -> IcebergTableFormat:
    table = IcebergTableFormat("bronze.events", properties)
    table.ensure(pa.schema([pa.field("id", pa.int64())]))
    return table


def _append(table: IcebergTableFormat, ids: list[int]) -> None:
    table.table().append(pa.table({"id": pa.array(ids, pa.int64())}))


def test_the_source_plans_appends_refuses_an_overwrite_and_measures_its_lag(tmp_path: Path) -> None:
    roots = roots_in(tmp_path)
    table = _table(default_catalog_properties(roots.lake))
    _append(table, [1, 2])
    _append(table, [3])
    catalog = load_catalog(write_catalog(tmp_path, silver()))
    reader = CheckpointReader(catalog.get("silver").checkpoint_path(roots))

    backlog = SOURCE_KINDS[SourceType.ICEBERG].backlog(catalog.get("silver"), roots, reader)

    assert (backlog.versions, backlog.files, backlog.records) == (2, 2, 3)
    waiting = history_after(table.table(), None, identifier="bronze.events")
    assert [snapshot.operation for snapshot in waiting] == ["append", "append"]
    assert history_after(table.table(), waiting[0].offset, identifier="bronze.events") == waiting[1:]
    table.table().delete("id = 1")
    overwrite = history_after(table.table(), waiting[-1].offset, identifier="bronze.events")[0]
    with pytest.raises(IcebergSourceError, match=f"^Iceberg table bronze.events: snapshot {overwrite.snapshot_id} "
                                                 f"is an {overwrite.operation}, which removes or rewrites rows"):
        check_readable(overwrite, {}, identifier="bronze.events")
    assert not check_readable(overwrite, {"streaming-skip-overwrite-snapshots": "true",
                                          "streaming-skip-delete-snapshots": "true"}, identifier="bronze.events")
    with pytest.raises(IcebergSourceError, match="snapshot 42, which the checkpoint read up to, is no longer"):
        history_after(table.table(), {"snapshot": 42, "sequence": 9}, identifier="bronze.events")


def test_the_stream_reader_plans_whole_snapshots_within_its_limit_and_reads_them_after_pickling(
        tmp_path: Path) -> None:
    """The ``sluice_iceberg`` reader driven as Spark drives it, without a JVM: AvailableNow reads what was committed
    before it started, a file limit cuts batches at whole snapshots, and a partition read after crossing to an
    executor (pickled) gives the snapshot's rows."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles

    from sluice_spark.rs.iceberg import IcebergDataSource
    from sluice_spark.rs.iceberg_source import IcebergStreamReader

    table = _table(default_catalog_properties(str(tmp_path / "lake")))
    for first in (1, 3, 5):
        _append(table, [first, first + 1])
    options = {"table": "bronze.events", "catalog": "default", "lakeRoot": str(tmp_path / "lake")}
    reader = IcebergStreamReader(IcebergDataSource(options).schema(), options)
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    _append(table, [99])  # after the query started: the next run's

    one = reader.latestOffset(start, ReadMaxFiles(1))
    rest = reader.latestOffset(one, ReadAllAvailable())

    def rows(begin: dict[str, int], end: dict[str, int]) -> list[int]:
        parts = pickle.loads(pickle.dumps(reader.partitions(begin, end)))
        executor = pickle.loads(pickle.dumps(reader))
        return sorted(row["id"] for part in parts for batch in executor.read(part) for row in batch.to_pylist())

    assert rows(start, one) == [1, 2]
    assert rows(one, rest) == [3, 4, 5, 6]
    assert reader.latestOffset(rest, ReadAllAvailable()) == rest


def test_an_iceberg_source_without_a_schedule_runs_on_the_stream_that_writes_its_table(tmp_path: Path) -> None:
    bronze = events_stream(sink={"format": "iceberg", "table": "bronze.events"})
    unscheduled = {**silver(), "schedule": None}
    del unscheduled["schedule"]
    catalog = load_catalog(write_catalog(tmp_path, bronze, unscheduled))
    assert [upstream.name for upstream in catalog.upstreams_of(catalog.get("silver"))] == ["events"]
    # The same identifier in another catalog is another table: no upstream, so a schedule is required.
    with pytest.raises(CatalogError, match=r"no stream of the catalog writes 'bronze\.events'") as refused:
        load_catalog(write_catalog(tmp_path, bronze, {**unscheduled, "source": {**unscheduled["source"],
                                                                                 "catalog": "iceberg_pg"}}))
    assert refused.value.field == "schedule"
    with pytest.raises(CatalogError, match="schedule"):
        load_catalog(write_catalog(tmp_path, unscheduled))
