"""An Iceberg sink's fan-out tables in the catalog (no Spark): Iceberg tables of the sink's catalog by identifier,
claimed like the sink's table, seen by health and maintenance through the table-format seam, and refused, with the
field named, where they are not of the sink's format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sluice.catalog import parse_catalog
from sluice.constants import TableRole
from sluice.kinds import table_formats
from sluice.kinds.iceberg import IcebergSink
from sluice.storage.iceberg import IcebergTableFormat
from sluice.storage.tableformat import DeltaTableFormat
from tests.helpers import events_stream, roots_in
from tests.unit.test_catalog import catalog_with, rejects

CLICKS = {"table": "bronze.clicks", "where": "event_type = 'click'", "columns": ["event_id", "user_id", "amount"],
          "partition_by": ["bucket(4, user_id)"]}


def fanned(*fan_out: dict[str, Any], name: str = "events", **sink: Any) -> dict[str, Any]:
    return events_stream(name, sink={"format": "iceberg", "table": f"bronze.{name}", **sink}, fan_out=list(fan_out))


def test_an_iceberg_sinks_fan_out_tables_are_iceberg_tables_of_its_catalog(tmp_path: Path) -> None:
    catalog = parse_catalog(catalog_with(fanned(CLICKS, {"table": "lake.bronze.views", "where": "amount > 0"})))
    stream = catalog.get("events")
    clicks, views = stream.patterns.fan_out
    assert (clicks.table, clicks.path, clicks.partition_by) == ("bronze.clicks", "", ("bucket(4, user_id)",))
    assert views.table == "lake.bronze.views"
    assert isinstance(stream.sink, IcebergSink)
    table_sink = stream.sink.fan_out_sink(clicks)
    assert (table_sink.identifier, table_sink.catalog, table_sink.partition_transforms) == (
        "bronze.clicks", "default", ("bucket(4, user_id)",))
    # Claimed like the sink's table: the default catalog's warehouse folder of each.
    assert [(w.field, w.path) for w in stream.written_paths if w.what == "fan-out table"] == [
        ("fan_out[0].table", "iceberg/warehouse/bronze/clicks"),
        ("fan_out[1].table", "iceberg/warehouse/lake.bronze/views")]
    roots = roots_in(tmp_path)
    # No Delta table of the stream's, but its dead-letter one; health and maintenance reach them through the seam.
    assert [table.role for table in stream.tables(roots)] == [TableRole.DEAD_LETTER]
    assert stream.table_paths == []
    formats = table_formats(stream, roots)
    assert [name for name, _ in formats] == ["sink", "dead_letter", "fan_out[0]", "fan_out[1]"]
    assert [type(table) for _, table in formats] == [IcebergTableFormat, DeltaTableFormat, IcebergTableFormat,
                                                     IcebergTableFormat]
    assert [table.identifier for _, table in formats if isinstance(table, IcebergTableFormat)] == [
        "bronze.events", "bronze.clicks", "lake.bronze.views"]


def test_an_empty_partition_by_unpartitions_a_fan_out_table_and_none_keeps_its_spec(tmp_path: Path) -> None:
    """``partition_by: []`` given unpartitions the fan-out table (one spec update, its rows kept); left out, the
    table keeps the spec it has, as a sink's."""
    import pyarrow as pa

    plain = {key: value for key, value in CLICKS.items() if key != "partition_by"}
    stream = parse_catalog(catalog_with(fanned({**plain, "partition_by": []}, {**plain, "table": "bronze.kept"}))
                           ).get("events")
    assert isinstance(stream.sink, IcebergSink)
    emptied, kept = (stream.sink.fan_out_sink(spec) for spec in stream.patterns.fan_out)
    assert (emptied.partition_transforms, kept.partition_transforms) == ((), None)
    rows = pa.table({"event_id": ["a", "b"], "user_id": ["u1", "u2"], "amount": [1.0, 2.0]})
    roots = roots_in(tmp_path)
    for sink in (emptied, kept):
        table = IcebergTableFormat(sink.identifier, sink.catalog_properties(roots))
        table.ensure(rows.schema, ["bucket(4, user_id)"])
        table.commit_batch(rows, query_id="q", batch_id=0, metadata={})
        table.ensure(rows.schema, sink.partition_transforms)
        assert table.partitioning == ([] if sink is emptied else ["bucket(4, user_id)"]), sink.identifier
        assert sorted(table.table().scan().to_arrow().column("event_id").to_pylist()) == ["a", "b"]


def test_an_iceberg_source_reading_a_fan_out_table_runs_on_its_writers_commits() -> None:
    silver = {"name": "clicks_silver", "transform": "identity", "sink": {"path": "silver/clicks"},
              "checkpoint": "silver/clicks",
              "source": {"type": "iceberg", "table": "bronze.clicks", "schema": {"event_id": "string"}}}
    catalog = parse_catalog(catalog_with(fanned(CLICKS), silver))
    upstream = catalog.upstream_of(catalog.get("clicks_silver"))
    assert upstream is not None and upstream.name == "events"


def test_fan_out_tables_not_of_the_sinks_format_are_refused_by_field() -> None:
    rejects(catalog_with(fanned({"path": "bronze/clicks", "where": "amount > 0"})), "fan_out[0].path",
            "an Iceberg table of the sink's catalog by table")
    rejects(catalog_with(events_stream(fan_out=[CLICKS])), "fan_out[0].table", "a Delta table by path")
    rejects(catalog_with(fanned({**CLICKS, "path": "bronze/clicks"})), "fan_out[0].table", "not both")
    rejects(catalog_with(fanned({**CLICKS, "table": "clicks"})), "fan_out[0].table", "namespace.table")
    rejects(catalog_with(fanned({**CLICKS, "partition_by": ["day(event_time"]})), "fan_out[0].partition_by")
    rejects(catalog_with(fanned({**CLICKS, "partition_by": ["day(event_date)", "event_date"]})),
            "fan_out[0].partition_by", "one transform per column")
    # A transform of a column the fan-out table does not keep.
    rejects(catalog_with(fanned({**CLICKS, "partition_by": ["day(event_date)"]})), "fan_out[0].partition_by",
            "event_date")
    rejects(catalog_with(fanned({**CLICKS, "where": "nope > 1"})), "fan_out[0].where")
    kafka = events_stream(sink={"format": "kafka", "topic": "t"},
                          fan_out=[CLICKS])
    rejects(catalog_with(kafka), "fan_out", "takes no fan_out")
    # One table, one writer: a fan-out table that is another stream's sink table.
    rejects(catalog_with(fanned(CLICKS), fanned(name="clicks")), "bronze/clicks")
