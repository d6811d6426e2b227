"""Iceberg tables of a real REST catalog (Apache Iceberg's own server classes on 127.0.0.1, the ``iceberg_rest``
fixture), through an Airflow connection of type http, as a deployment names one (``catalog: <conn_id>``).

The connection becomes pyiceberg's RestCatalog properties (:func:`sluice.connections.iceberg.catalog_properties`);
they reach the driver as its ``SLUICE_ICEBERG_CONN_<ID>`` variable, as the operator passes them to spark-submit.
Without Spark: a batch commits once, and another catalog object skips its replay. With spark-submit: a bronze
stream's Iceberg sink of the REST catalog, killed between its commits and rerun (the replayed batch skipped), then
a silver stream reading that table by snapshot into Delta, both equal to the oracle. The server is shared by the
session: each test names its own namespace.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pytest

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.connections.iceberg import CatalogConnection, env_name
from sluice.connections.iceberg import catalog_properties as connection_catalog
from sluice.kinds.iceberg import catalog_properties
from sluice.storage.iceberg import IcebergTableFormat
from tests.helpers import expected_events, roots_in, write_catalog
from tests.spark.test_crash_recovery import kill_at_then_rerun, submit
from tests.spark.test_iceberg import iceberg_rows, iceberg_table
from tests.spark.test_iceberg_source import NOW, silver_rows, streams

pytestmark = pytest.mark.spark


def rest_connection(conn_id: str, url: str) -> tuple[str, str]:
    """The variable the operator gives spark-submit for an Airflow connection of type http at ``url``."""
    connection = CatalogConnection(conn_id=conn_id, conn_type="http", host=url)
    return env_name(conn_id), json.dumps(connection_catalog(connection))


def test_a_rest_catalog_through_a_connection_holds_the_table_and_its_batches(
        iceberg_rest: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(*rest_connection("rest_cat", iceberg_rest))
    roots = roots_in(tmp_path)
    properties = catalog_properties("rest_cat", roots)
    assert (properties["type"], properties["uri"]) == ("rest", iceberg_rest)
    table = IcebergTableFormat("rest_unit.batches", properties)
    table.ensure(pa.schema([pa.field("id", pa.int64())]))
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
    assert table.commit_batch(rows, query_id="q", batch_id=0, metadata={})

    again = IcebergTableFormat("rest_unit.batches", catalog_properties("rest_cat", roots))
    assert type(again.catalog).__name__ == "RestCatalog"
    assert not again.commit_batch(rows, query_id="q", batch_id=0, metadata={})  # the replay: skipped
    assert sorted(again.table().scan().to_arrow().column("id").to_pylist()) == [1, 2, 3]
    assert again.batches("q") == [0]
    assert [commit.operation for commit in again.commits()] == ["append"]
    # The server wrote the table's metadata in its own warehouse, not under the lake root.
    assert "rest_unit" in again.table().metadata_location and str(tmp_path) not in again.table().metadata_location


def test_bronze_killed_and_rerun_then_silver_through_the_rest_catalog_equal_the_oracle(
        iceberg_rest: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bronze, silver = streams(catalog="rest_iceberg", table="rest_e2e.events")
    bronze["sink"].update(catalog="rest_iceberg", table="rest_e2e.events")
    catalog_path = write_catalog(tmp_path, bronze, silver)
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=45, malformed_rate=0.1)
    for index in range(3):
        producer.events_file(lines=25, now=NOW + dt.timedelta(minutes=index))
    monkeypatch.setenv(*rest_connection("rest_iceberg", iceberg_rest))  # submit() passes os.environ on
    summary_file = tmp_path / "summary.json"

    # Batch 1 committed to the REST catalog's table, not to the dead-letter table nor the checkpoint: the rerun
    # replays it and the table skips it.
    kill_at_then_rerun(catalog_path, roots, "between_commits:1", tmp_path / "faults", summary=summary_file)

    catalog = load_catalog(catalog_path)
    table = iceberg_table(catalog, roots)
    assert type(table.catalog).__name__ == "RestCatalog"
    expected_good, _ = expected_events(Path(roots.landing) / "events")
    assert iceberg_rows(table) == expected_good  # batch 1 once, not twice
    query_id = json.loads(summary_file.read_text())["streams"][0]["query_id"]
    assert table.batches(query_id) == [0, 1, 2]
    assert not (Path(roots.lake) / "iceberg" / "catalog.db").exists()  # the REST catalog's, not the default one

    run = submit(catalog_path, roots, stream="silver")
    output, _ = run.communicate(timeout=300)
    assert run.returncode == 0, output[-3000:]
    assert silver_rows(roots) == expected_good
