"""Iceberg catalogs on a real PostgreSQL (tests/postgres.sh's throwaway server), through a catalog connection.

The connection's properties reach the process as its ``SLUICE_ICEBERG_CONN_<ID>`` variable, as the operator passes
them to spark-submit. Without Spark: a batch commits once, and another catalog object (another process) sees the
table and skips the replay. With spark-submit: a bronze stream writes an Iceberg table of the PostgreSQL catalog and
a silver stream reads it by snapshot into Delta, equal to the oracle.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from sluice.cli.demo_producer import DemoProducer
from sluice.connections.iceberg import env_name
from sluice.kinds.iceberg import catalog_properties
from sluice.storage.iceberg import IcebergTableFormat
from tests.helpers import expected_events, roots_in, write_catalog
from tests.spark.test_crash_recovery import submit
from tests.spark.test_iceberg_source import NOW, silver_rows, streams
from tests.throwaway_postgres import throwaway_postgres

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    with throwaway_postgres() as url:
        yield url


def test_a_postgres_catalog_through_a_connection_holds_the_table_and_its_batches(
        postgres: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env_name("pg_cat"), json.dumps({"type": "sql", "uri": postgres}))
    roots = roots_in(tmp_path)
    properties = catalog_properties("pg_cat", roots)
    assert properties["warehouse"] == (tmp_path / "lake" / "iceberg" / "warehouse").as_uri()
    table = IcebergTableFormat("lab.batches", properties)  # the database outlives the test: not bronze.events
    table.ensure(pa.schema([pa.field("id", pa.int64())]))
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
    assert table.commit_batch(rows, query_id="q", batch_id=0, metadata={})

    again = IcebergTableFormat("lab.batches", catalog_properties("pg_cat", roots))
    assert again.catalog.engine.url.get_backend_name() == "postgresql"
    assert not again.commit_batch(rows, query_id="q", batch_id=0, metadata={})
    assert sorted(again.table().scan().to_arrow().column("id").to_pylist()) == [1, 2, 3]
    assert again.batches("q") == [0]


def test_bronze_and_silver_through_the_postgres_catalog_equal_the_oracle(postgres: str, tmp_path: Path) -> None:
    bronze, silver = streams(catalog="pg_iceberg")
    bronze["sink"]["catalog"] = "pg_iceberg"
    catalog_path = write_catalog(tmp_path, bronze, silver)
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=44, malformed_rate=0.1)
    for index in range(2):
        producer.events_file(lines=25, now=NOW + dt.timedelta(minutes=index))
    variable = (env_name("pg_iceberg"), json.dumps({"type": "sql", "uri": postgres}))

    for stream in ("events", "silver"):
        run = submit(catalog_path, roots, variable, stream=stream)
        output, _ = run.communicate(timeout=300)
        assert run.returncode == 0, output[-3000:]
        assert postgres.split("@")[0].split(":")[-1] not in output  # the password never reaches the log

    expected_good, _ = expected_events(Path(roots.landing) / "events")
    assert silver_rows(roots) == expected_good
    # The table is the PostgreSQL catalog's, not the default SQLite one's.
    assert not (Path(roots.lake) / "iceberg" / "catalog.db").exists()
