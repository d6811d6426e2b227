"""Bronze ingestion with real Spark and real Delta tables, checked against batch oracles."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.errors import SluiceError
from sluice.operations.jars import spark_jars
from sluice.storage.delta import DeltaSchemaMismatch, read_table
from sluice_spark.runner import run_streams
from tests.helpers import events_stream, expected_events, roots_in, table_rows, write_catalog

pytestmark = pytest.mark.spark

NOW = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)
BRONZE_COLUMNS = ["event_id", "event_type", "user_id", "amount", "event_date"]


def bronze(path: str) -> list[tuple[Any, ...]]:
    return [(*row[:4], row[4].isoformat()) for row in table_rows(path, BRONZE_COLUMNS)]


def spark_batch_oracle(spark: Any, landing: Path) -> list[tuple[Any, ...]]:
    """The same bronze query as a Spark batch job over the same files, written out by hand."""
    from pyspark.sql import functions as F

    frame = (
        spark.read.schema(
            "event_id STRING, event_type STRING, user_id STRING, session_id STRING, page STRING, "
            "amount STRING, currency STRING, event_time TIMESTAMP, _corrupt_record STRING"
        )
        .option("recursiveFileLookup", "true")
        .json(str(landing / "events"))
        .cache()
    )
    good = frame.where(
        F.col("_corrupt_record").isNull()
        & F.col("event_id").isNotNull() & F.col("event_type").isNotNull()
        & F.col("user_id").isNotNull() & F.col("event_time").isNotNull()
    ).select("event_id", F.lower(F.trim("event_type")), "user_id",
             # An amount that is not a number is rescued (the default drift policy): the row keeps a NULL amount.
             F.expr("try_cast(amount AS DECIMAL(12,2))"),
             F.date_format(F.to_date("event_time"), "yyyy-MM-dd"))
    return sorted((tuple(row) for row in good.collect()), key=repr)


@pytest.fixture
def events_catalog(tmp_path: Path) -> Any:
    return load_catalog(write_catalog(tmp_path, events_stream()))


@pytest.mark.parametrize(("engine", "driver_bytes", "write_path"),
                         [("rs", "0", None), ("rs", str(64 << 20), "driver"), ("jvm", "0", None)],
                         ids=["executors", "driver", "jvm"])
def test_stream_equals_batch_oracle_and_reconciles(spark: Any, tmp_path: Path, engine: str, driver_bytes: str,
                                                   write_path: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both write paths of the rs engine: a run's batches written by the executors' Python data source, or (a small
    run) collected to the driver and appended there; and delta-spark's writer (the jvm engine), which creates the
    table with its first batch."""
    if engine == "jvm" and not spark_jars():
        pytest.skip("needs the JVM jars (delta-spark): `make venv` with Maven")
    definition = events_stream()
    definition["sink"]["engine"] = engine
    events_catalog = load_catalog(write_catalog(tmp_path, definition))
    monkeypatch.setenv("SLUICE_DRIVER_WRITE_MAX_BYTES", driver_bytes)
    roots = roots_in(tmp_path)
    produced = DemoProducer(roots.landing, seed=11, malformed_rate=0.05).produce(files=3, lines=150, now=NOW)

    summary = run_streams(spark, events_catalog, ["events"], roots)

    stream = summary.streams[0]
    assert stream.status == "succeeded", stream.error
    assert stream.write_path == write_path
    expected_good, expected_bad = expected_events(Path(roots.landing) / "events")
    table = bronze(events_catalog.get("events").sink_path(roots))
    assert table == spark_batch_oracle(spark, Path(roots.landing)) == expected_good
    assert stream.input_rows == produced.event_lines == stream.output_rows + stream.dead_letter_rows
    assert (stream.output_rows, stream.dead_letter_rows) == (len(expected_good), expected_bad)
    first = 0 if engine == "rs" else None  # the rs engine creates the table before the first batch
    assert stream.delta_version_before == first
    assert stream.delta_version_after == stream.batches - (engine == "jvm")
    assert stream.engine == engine and stream.query_id


def test_dead_letter_rows_keep_raw_record_reason_and_source(spark: Any, tmp_path: Path) -> None:
    """Under ``schema_evolution: none``, a value that does not fit its type makes its record a dead letter."""
    events_catalog = load_catalog(write_catalog(tmp_path, events_stream(source={
        **events_stream()["source"], "schema_evolution": "none"})))
    roots = roots_in(tmp_path)
    folder = Path(roots.landing) / "events"
    folder.mkdir(parents=True)
    good = {"event_id": "e1", "event_type": " Click ", "user_id": "u1", "event_time": "2026-11-22T10:00:00Z"}
    lines = [
        json.dumps(good),
        '{"event_id": "e2", "event_type": "click"',
        json.dumps({**good, "event_id": "e3", "amount": "twelve"}),
        json.dumps({k: v for k, v in good.items() if k != "user_id"} | {"event_id": "e4"}),
        json.dumps({**good, "event_id": "e5", "event_time": "yesterday"}),
        "[1, 2, 3]",
    ]
    (folder / "batch.json").write_text("\n".join(lines) + "\n")

    summary = run_streams(spark, events_catalog, ["events"], roots)

    assert summary.streams[0].status == "succeeded", summary.streams[0].error
    assert bronze(events_catalog.get("events").sink_path(roots)) == [("e1", "click", "u1", None, "2026-11-22")]
    dead = read_table(events_catalog.get("events").dead_letter_table_path(roots)).to_pylist()
    reasons = sorted((row["reason"], row["raw_record"]) for row in dead)
    assert [reason for reason, _ in reasons] == [
        "field 'amount': cannot parse 'twelve' as DECIMAL(12,2)",
        "field 'event_time': cannot parse 'yesterday' as TIMESTAMP",
        "malformed JSON record",
        "malformed JSON record",
        "missing required field 'user_id'",
    ]
    assert {raw for _, raw in reasons} >= {lines[1], lines[2], lines[4], lines[5]}
    assert all(row["source_file"].endswith("/events/batch.json") and row["stream"] == "events" for row in dead)
    assert all(isinstance(row["ingested_at"], dt.datetime) for row in dead)


def test_rerun_without_new_files_adds_no_version(spark: Any, tmp_path: Path, events_catalog: Any) -> None:
    roots = roots_in(tmp_path)
    DemoProducer(roots.landing, seed=2).produce(files=2, now=NOW)
    run_streams(spark, events_catalog, ["events"], roots)
    path = events_catalog.get("events").sink_path(roots)
    version, rows = DeltaTable(path).version(), bronze(path)

    again = run_streams(spark, events_catalog, ["events"], roots).streams[0]

    assert again.status == "succeeded"
    assert (again.batches, again.input_rows, again.output_rows) == (0, 0, 0)
    assert DeltaTable(path).version() == version
    assert bronze(path) == rows


def test_new_files_add_exactly_the_new_rows(spark: Any, tmp_path: Path, events_catalog: Any) -> None:
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=4)
    producer.produce(files=2, now=NOW)
    run_streams(spark, events_catalog, ["events"], roots)
    path = events_catalog.get("events").sink_path(roots)
    before = bronze(path)

    later = producer.produce(files=1, now=NOW + dt.timedelta(days=1))
    second = run_streams(spark, events_catalog, ["events"], roots).streams[0]

    assert second.input_rows == later.event_lines
    after = bronze(path)
    assert len(after) - len(before) == later.events + later.duplicates == second.output_rows
    assert after == expected_events(Path(roots.landing) / "events")[0]


def test_trigger_limit_splits_batches_and_delta_log_is_checkpointed(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, events_stream(trigger={"max_files_per_trigger": 1})))
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=9, malformed_rate=0.0)
    for index in range(11):
        producer.events_file(lines=5, now=NOW + dt.timedelta(minutes=index))

    stream = run_streams(spark, catalog, ["events"], roots).streams[0]

    assert stream.batches == 11 and stream.batch_ids == list(range(11))
    path = catalog.get("events").sink_path(roots)
    assert DeltaTable(path).version() == 11
    assert list((Path(path) / "_delta_log").glob("*.checkpoint.parquet")), "delta.checkpointInterval=10 applies"
    transactions = DeltaTable(path).transaction_version(stream.query_id)
    assert transactions == 10


def test_files_carry_statistics_and_partitions(spark: Any, tmp_path: Path, events_catalog: Any) -> None:
    roots = roots_in(tmp_path)
    DemoProducer(roots.landing, seed=5, late_rate=0.5).produce(files=2, now=NOW)
    run_streams(spark, events_catalog, ["events"], roots)
    table = DeltaTable(events_catalog.get("events").sink_path(roots))
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert table.metadata().partition_columns == ["event_date"]
    assert len({row["partition.event_date"] for row in actions}) >= 2, "late events land in earlier partitions"
    assert sum(row["num_records"] for row in actions) == len(bronze(table.table_uri))
    assert all(row["min.event_time"] is not None for row in actions)


def test_csv_stream_with_header(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog()
    stream_spec = catalog.get("orders_bronze")
    roots = roots_in(tmp_path)
    produced = DemoProducer(roots.landing, seed=8, malformed_rate=0.2).orders_file(rows=30, now=NOW)

    stream = run_streams(spark, catalog, ["orders_bronze"], roots, engine=None).streams[0]

    assert stream.status == "succeeded", stream.error
    assert (stream.output_rows, stream.dead_letter_rows) == (produced.orders, produced.malformed_orders)
    rows = read_table(stream_spec.sink_path(roots)).to_pylist()
    assert all(isinstance(row["amount"], Decimal) and row["_source_file"].endswith(".csv") for row in rows)
    # The amount is required: a value that does not fit it is a dead letter even under the rescue policy.
    dead = read_table(stream_spec.dead_letter_table_path(roots)).to_pylist()
    assert {row["reason"] for row in dead} == {"field 'amount': cannot parse 'n/a' as DECIMAL(12,2)"}
    assert all(row["raw_record"].count(",") == 5 for row in dead), "the CSV line as it arrived"
    assert stream.rescued_rows == 0 and all(row["_rescued_data"] is None for row in rows)


def test_csv_with_reordered_columns_lands_each_value_under_its_name(spark: Any, tmp_path: Path) -> None:
    """The bundled orders stream rescues (the default): its files' columns are found by their headers."""
    roots = roots_in(tmp_path)
    folder = Path(roots.landing) / "orders"
    folder.mkdir(parents=True)
    (folder / "export.csv").write_text("user_id,order_id,amount,currency,status,ordered_at\n"
                                       "u1,o1,9.50,EUR,paid,2026-11-22T10:00:00Z\n")

    stream = run_streams(spark, load_catalog(), ["orders_bronze"], roots).streams[0]

    assert stream.status == "succeeded", stream.error
    [row] = read_table(load_catalog().get("orders_bronze").sink_path(roots)).to_pylist()
    assert (row["order_id"], row["user_id"], row["amount"], row["status"]) == ("o1", "u1", Decimal("9.50"), "paid")


def test_csv_under_none_with_reordered_columns_fails_loudly_instead_of_swapping_values(spark: Any,
                                                                                       tmp_path: Path) -> None:
    spec = {"name": "orders", "source": {"type": "files", "format": "csv", "path": "orders",
                                         "options": {"header": True}, "schema_evolution": "none",
                                         "schema": {"order_id": "string not null", "user_id": "string"}},
            "sink": {"path": "bronze/orders", "engine": "rs"}, "schedule": "@hourly"}
    catalog = load_catalog(write_catalog(tmp_path, spec))
    roots = roots_in(tmp_path)
    folder = Path(roots.landing) / "orders"
    folder.mkdir(parents=True)
    (folder / "export.csv").write_text("user_id,order_id\nu1,o1\n")

    stream = run_streams(spark, catalog, ["orders"], roots).streams[0]

    assert stream.status == "failed" and "header" in stream.error.lower()
    assert DeltaTable(catalog.get("orders").sink_path(roots)).version() == 0


def test_parquet_stream(spark: Any, tmp_path: Path) -> None:
    stream_def = {
        "name": "users",
        "source": {"type": "files", "format": "parquet", "path": "users",
                   "schema": {"user_id": "string not null", "country": "string", "signup_day": "date"}},
        "sink": {"path": "bronze/users", "engine": "rs"},
        "schedule": "@hourly",
    }
    catalog = load_catalog(write_catalog(tmp_path, stream_def))
    roots = roots_in(tmp_path)
    folder = Path(roots.landing) / "users"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"user_id": ["u1", None, "u3"], "country": ["DE", "FR", None],
                             "signup_day": [dt.date(2026, 1, 1)] * 3}), folder / "part-0.parquet")

    stream = run_streams(spark, catalog, ["users"], roots).streams[0]

    assert (stream.input_rows, stream.output_rows, stream.dead_letter_rows) == (3, 2, 1)
    assert table_rows(catalog.get("users").sink_path(roots), ["user_id", "country"]) == [("u1", "DE"), ("u3", None)]
    dead = read_table(catalog.get("users").dead_letter_table_path(roots)).to_pylist()
    assert dead[0]["reason"] == "missing required field 'user_id'"
    assert json.loads(dead[0]["raw_record"]) == {"country": "FR", "signup_day": "2026-01-01"}


def test_existing_table_with_another_schema_is_refused(spark: Any, tmp_path: Path, events_catalog: Any) -> None:
    roots = roots_in(tmp_path)
    DeltaTable.create(events_catalog.get("events").sink_path(roots), schema=pa.schema([("other", pa.string())]))
    with pytest.raises(DeltaSchemaMismatch, match="Evolve the table or point the stream at a new table"):
        run_streams(spark, events_catalog, ["events"], roots)


def test_transform_that_drops_columns_is_refused(spark: Any, tmp_path: Path, events_catalog: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_spark.steps import transforms

    monkeypatch.setattr(transforms, "bronze_events", lambda frame: frame.select("event_id"))
    with pytest.raises(SluiceError, match="dropped column"):
        run_streams(spark, events_catalog, ["events"], roots_in(tmp_path))


def test_two_streams_in_one_application(spark: Any, tmp_path: Path) -> None:
    roots = roots_in(tmp_path)
    DemoProducer(roots.landing, seed=6).produce(files=1, now=NOW)
    summary = run_streams(spark, load_catalog(), ["events_bronze", "orders_bronze"], roots)
    assert [s.stream for s in summary.streams] == ["events_bronze", "orders_bronze"]
    assert summary.ok and all(s.output_rows > 0 for s in summary.streams)
    assert len({s.query_id for s in summary.streams}) == 2
