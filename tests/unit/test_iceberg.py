"""The Iceberg sink's catalog section, and the table-format seam on both formats (no Spark): a batch commits once,
a replay of it is skipped, and the commits list the query and batch each carries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sluice.catalog import parse_catalog
from sluice.constants import CommitInfo, SinkFormat, SinkMode
from sluice.errors import SluiceError
from sluice.kinds.iceberg import IcebergSink
from sluice.storage.iceberg import IcebergTableFormat, default_catalog_properties
from sluice.storage.iceberg_files import PartitionTransform, parse_partition, write_data_files
from sluice.storage.tableformat import DeltaTableFormat, TableFormat
from tests.helpers import events_stream, roots_in
from tests.unit.test_catalog import catalog_with, rejects


def iceberg_stream(name: str = "to_iceberg", **sink: Any) -> dict[str, Any]:
    return events_stream(name, sink={"format": "iceberg", "table": "bronze.events", **sink})


# --- catalog -------------------------------------------------------------------------------------------------------


def test_iceberg_sink_is_accepted_and_its_dead_letters_stay_in_delta(tmp_path: Path) -> None:
    catalog = parse_catalog(catalog_with(iceberg_stream(), iceberg_stream(
        "merged", table="silver.events", mode="merge", keys=["event_id"], sequence_by="event_time")))
    sink = catalog.get("to_iceberg").sink
    assert isinstance(sink, IcebergSink)
    assert (sink.format, sink.identifier, sink.catalog, sink.mode, sink.table) == (
        SinkFormat.ICEBERG, "bronze.events", "default", SinkMode.APPEND, None)
    assert catalog.get("to_iceberg").dead_letter_path == "_dead_letter/to_iceberg"
    merged = catalog.get("merged").sink
    assert (merged.mode, merged.keys, merged.sequence_by) == (SinkMode.MERGE, ("event_id",), "event_time")
    lake = roots_in(tmp_path).lake
    assert sink.catalog_properties(roots_in(tmp_path)) == {
        "uri": f"sqlite:///{lake}/iceberg/catalog.db", "warehouse": f"file://{lake}/iceberg/warehouse"}


def test_iceberg_sink_errors_name_the_field() -> None:
    rejects(catalog_with(events_stream(sink={"format": "iceberg"})), "sink.table:", "is required")
    rejects(catalog_with(iceberg_stream(table="events")), "sink.table:", "namespace.table")
    rejects(catalog_with(iceberg_stream(table="bronze.ev-ents")), "sink.table:", "namespace.table")
    rejects(catalog_with(iceberg_stream(catalog="my rest!")), "sink.catalog:", "an Airflow connection id")
    rejects(catalog_with(iceberg_stream(mode="cdc")), "sink.mode:", "not cdc")
    rejects(catalog_with(iceberg_stream(mode="merge")), "sink.keys:", "needs the keys")
    rejects(catalog_with(iceberg_stream(keys=["event_id"])), "sink.keys:", "keys are for mode merge")
    rejects(catalog_with(iceberg_stream(mode="merge", keys=["nope"])), "sink.keys:", "'nope' is not produced")
    rejects(catalog_with(iceberg_stream(sequence_by="event_time")), "sink.sequence_by:", "for mode merge")
    rejects(catalog_with(iceberg_stream(path="bronze/x")), "sink: unknown key(s) path")
    rejects(catalog_with({**iceberg_stream(), "fan_out": [{"path": "bronze/clicks", "where": "event_type = 'click'"}]}),
            "fan_out[0].path", "by table")


def test_partition_transforms_are_parsed_and_refused_by_name() -> None:
    catalog = parse_catalog(catalog_with(iceberg_stream(partition_by=[
        "day(event_time)", "bucket(16, user_id)", "truncate(4, event_type)", "event_date", "identity(event_id)"])))
    sink = catalog.get("to_iceberg").sink
    assert isinstance(sink, IcebergSink)
    assert [parse_partition(text) for text in sink.partition_transforms or ()] == [
        PartitionTransform("day", "event_time"), PartitionTransform("bucket", "user_id", 16),
        PartitionTransform("truncate", "event_type", 4), PartitionTransform("identity", "event_date"),
        PartitionTransform("identity", "event_id")]
    for malformed in ("day(event_time", "days(event_time)", "bucket(user_id)", "bucket(0, user_id)", "a b"):
        rejects(catalog_with(iceberg_stream(partition_by=[malformed])), "sink.partition_by:", repr(malformed))
    rejects(catalog_with(iceberg_stream(partition_by=["day(event_time)", "hour(event_time)"])),
            "sink.partition_by:", "one transform per column")
    rejects(catalog_with(iceberg_stream(partition_by=["day(nope)"])), "sink.partition_by:", "'nope' is not produced")
    merged = parse_catalog(catalog_with(iceberg_stream(partition_by=["day(event_time)"], mode="merge",
                                                       keys=["event_id"]))).get("to_iceberg").sink
    assert isinstance(merged, IcebergSink) and merged.partition_transforms == ("day(event_time)",)
    # An empty list declares an unpartitioned table; none declares nothing (an existing table keeps its spec).
    unpartitioned, undeclared = (parse_catalog(catalog_with(stream)).get("to_iceberg").sink for stream in
                                 (iceberg_stream(partition_by=[]), iceberg_stream()))
    assert isinstance(unpartitioned, IcebergSink) and isinstance(undeclared, IcebergSink)
    assert (unpartitioned.partition_transforms, undeclared.partition_transforms) == ((), None)


def test_two_streams_cannot_write_one_iceberg_table() -> None:
    rejects(catalog_with(iceberg_stream("one"), iceberg_stream("two")), "stream 'two'", "sink.table:",
            "already used by stream 'one'")
    rejects(catalog_with(iceberg_stream("one"), events_stream("two", sink={"path": "iceberg/warehouse"})),
            "stream 'two'", "sink.path:", "holds the sink table")


def test_the_default_catalog_needs_a_local_lake_root() -> None:
    with pytest.raises(SluiceError, match="local lake root"):
        default_catalog_properties("s3://bucket/lake")


# --- the seam, on both formats ---------------------------------------------------------------------------------------

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])


def rows(*ids: int) -> pa.Table:
    return pa.table({"name": [f"n{i}" for i in ids], "id": list(ids)})  # not in the table's order: conformed


def tables(tmp_path: Path) -> list[TableFormat]:
    return [DeltaTableFormat(str(tmp_path / "delta" / "t")),
            IcebergTableFormat("db.t", default_catalog_properties(str(tmp_path / "lake")))]


@pytest.mark.parametrize("index", [0, 1], ids=["delta", "iceberg"])
def test_a_batch_commits_once_and_its_replay_is_skipped(tmp_path: Path, index: int) -> None:
    table = tables(tmp_path)[index]
    assert not table.exists() and table.recorded_batch("q1") is None and table.commits() == []
    assert table.ensure(SCHEMA) is True and table.ensure(SCHEMA) is False
    meta = {CommitInfo.STREAM: "s", CommitInfo.RUN: "r1"}
    assert table.commit_batch(rows(1, 2), query_id="q1", batch_id=0, metadata=meta) is True
    assert table.commit_batch(rows(3), query_id="q1", batch_id=1, metadata=meta) is True
    assert table.commit_batch(rows(1, 2), query_id="q1", batch_id=0, metadata=meta) is False  # a replay
    assert table.commit_batch(rows(3), query_id="q1", batch_id=1, metadata=meta) is False
    assert table.commit_batch(rows(9), query_id="q2", batch_id=0, metadata=meta) is True  # another query
    assert table.commit_batch(rows(), query_id="q2", batch_id=1, metadata=meta) is True  # nothing: no commit
    assert (table.recorded_batch("q1"), table.recorded_batch("q2"), table.recorded_batch("q3")) == (1, 0, None)
    assert table.batches("q1") == [0, 1] and table.batches("q2") == [0]
    batch_commits = [(c.query_id, c.batch_id, c.rows) for c in table.commits() if c.query_id]
    assert batch_commits == [("q1", 0, 2), ("q1", 1, 1), ("q2", 0, 1)]
    versions = [commit.version for commit in table.commits()]
    assert versions == sorted(versions)
    assert table.schema().names == ["id", "name"]
    if isinstance(table, IcebergTableFormat):
        read = table.table().scan().to_arrow()
    else:
        from sluice.storage.delta import read_table
        read = read_table(table.path)
    assert sorted(zip(read.column("id").to_pylist(), read.column("name").to_pylist(), strict=True)) == [
        (1, "n1"), (2, "n2"), (3, "n3"), (9, "n9")]


def test_an_iceberg_overwrite_and_an_upsert_commit_once(tmp_path: Path) -> None:
    table = IcebergTableFormat("db.t", default_catalog_properties(str(tmp_path / "lake")))
    table.ensure(SCHEMA)
    table.commit_batch(rows(1, 2), query_id="q", batch_id=0, metadata={})
    assert table.commit_batch(rows(5), query_id="q", batch_id=1, metadata={}, overwrite=True) is True
    assert table.table().scan().to_arrow().column("id").to_pylist() == [5]
    changed = pa.table({"id": [5, 6], "name": ["five", "six"]})
    assert table.upsert_batch(changed, ["id"], query_id="q", batch_id=2, metadata={}) is True
    assert table.upsert_batch(changed, ["id"], query_id="q", batch_id=2, metadata={}) is False
    read = table.table().scan().to_arrow().sort_by("id")
    assert read.to_pylist() == [{"id": 5, "name": "five"}, {"id": 6, "name": "six"}]
    assert table.recorded_batch("q") == 2
    older = pa.table({"id": [5, 7], "name": ["a5", "seven"]})  # "a5" sorts before the table's "five"
    assert table.upsert_batch(older, ["id"], query_id="q", batch_id=3, metadata={}, sequence_by="name") is True
    read = table.table().scan().to_arrow().sort_by("id")
    assert read.to_pylist() == [{"id": 5, "name": "five"}, {"id": 6, "name": "six"}, {"id": 7, "name": "seven"}]
    assert table.recorded_batch("q") == 3


def test_an_existing_iceberg_table_gains_the_columns_it_lacks(tmp_path: Path) -> None:
    table = IcebergTableFormat("db.t", default_catalog_properties(str(tmp_path / "lake")))
    table.ensure(SCHEMA)
    wider = pa.schema([*SCHEMA, pa.field("extra", pa.float64(), nullable=False)])  # Spark's NOT NULL of a literal
    assert table.ensure(wider) is False
    assert table.schema().names == ["id", "name", "extra"]
    assert not table.table().schema().find_field("extra").required, "a later run's NULL must be admitted"
    with pytest.raises(SluiceError, match="cannot take the stream's columns"):
        table.ensure(pa.schema([pa.field("id", pa.string()), pa.field("other", pa.int32())]))


@pytest.mark.parametrize("index", [0, 1], ids=["delta", "iceberg"])
def test_the_health_gate_s_reads_of_the_seam(tmp_path: Path, index: int) -> None:
    """The query ids a stream committed, newest first, and the commit to roll back to for a checkpoint behind."""
    table = tables(tmp_path)[index]
    table.ensure(SCHEMA)
    for query, batch, stream in (("q1", 0, "s"), ("q1", 1, "s"), ("q2", 0, "s"), ("q3", 0, "other")):
        table.commit_batch(rows(batch), query_id=query, batch_id=batch, metadata={CommitInfo.STREAM: stream})
    assert table.query_ids("s") == ["q2", "q1"] and table.query_ids("nobody") == []
    of_batch = {(c.query_id, c.batch_id): (c.snapshot_id if c.snapshot_id is not None else c.version)
                for c in table.commits()}
    assert table.version_holding("q1", 0) == of_batch[("q1", 0)]
    assert table.version_holding("q1", 1) == of_batch[("q3", 0)]  # the newest: nothing past batch 1 anywhere
    assert table.version_holding("q1", -1) == (0 if index == 0 else None)  # Delta's version 0 is the empty table


def test_expiry_keeps_the_checkpoint_s_last_batch_and_orphans_go(tmp_path: Path) -> None:
    import time

    from sluice.storage.iceberg import expire_snapshots, remove_orphan_files

    table = IcebergTableFormat("db.t", default_catalog_properties(str(tmp_path / "lake")))
    table.ensure(SCHEMA)
    table.commit_batch(rows(1, 2), query_id="q", batch_id=0, metadata={})
    table.commit_batch(rows(5), query_id="q", batch_id=1, metadata={}, overwrite=True)  # batch 0's file replaced
    table.commit_batch(rows(6), query_id="q", batch_id=2, metadata={})
    later = time.time() + 10

    def batches() -> set[str]:
        return {s.summary.additional_properties.get(CommitInfo.BATCH, "") for s in table.table().snapshots()}

    assert expire_snapshots(table, older_than=later, query_id="q", last_batch=0, dry_run=True) == []
    assert remove_orphan_files(table, older_than=later) == []  # every file is still some snapshot's
    assert expire_snapshots(table, older_than=later, query_id="q", last_batch=1)
    assert "0" not in batches() and {"1", "2"} <= batches()
    [orphan] = remove_orphan_files(table, older_than=later)
    assert not Path(orphan).exists() and remove_orphan_files(table, older_than=later) == []
    assert sorted(table.table().scan().to_arrow().column("id").to_pylist()) == [5, 6]
    assert table.recorded_batch("q") == 2 and table.commit_batch(rows(6), query_id="q", batch_id=2,
                                                                  metadata={}) is False


@pytest.mark.parametrize("index", [0, 1], ids=["delta", "iceberg"])
def test_the_newest_value_comes_from_file_statistics(tmp_path: Path, index: int) -> None:
    """What the lag shows as the newest event time when the stream has no watermark: the files' upper bounds."""
    import datetime as dt

    table = tables(tmp_path)[index]
    assert table.newest_value("at") is None  # no table yet
    stamps = pa.schema([pa.field("id", pa.int64()), pa.field("at", pa.timestamp("us", tz="UTC"))])
    table.ensure(stamps)
    assert table.newest_value("at") is None  # no file yet
    newest = dt.datetime(2026, 11, 22, 8, 30, tzinfo=dt.timezone.utc)
    for batch, at in enumerate((newest, newest - dt.timedelta(hours=1))):
        table.commit_batch(pa.table({"id": [batch], "at": pa.array([at], pa.timestamp("us", tz="UTC"))}),
                           query_id="q", batch_id=batch, metadata={})
    assert table.newest_value("at") == newest and table.newest_value("nope") is None


def test_each_partition_transform_agrees_with_pyiceberg_s_own(tmp_path: Path) -> None:
    """Sluice computes partition values with pyarrow (pyiceberg's vectorised transforms need pyiceberg-core); each
    data file's partition equals pyiceberg's Python transform of every row it holds, NULLs and negatives included,
    and the table's rows are the rows written."""
    import datetime as dt

    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

    times = [dt.datetime(1969, 12, 31, 23, 30, tzinfo=dt.timezone.utc), None,
             *(dt.datetime(2026, 1 + i % 12, 1 + i % 28, i % 24, 59, tzinfo=dt.timezone.utc) for i in range(30))]
    data = pa.table({"id": pa.array([-7, None, *range(30)], pa.int64()),
                     "name": ["émile", None, *(f"name{i % 4}" for i in range(30))],
                     "ts": pa.array(times, pa.timestamp("us", tz="UTC")),
                     "day": pa.array([t.date() if t else None for t in times], pa.date32())})
    for index, spec in enumerate([["year(ts)", "truncate(3, name)"], ["month(ts)", "truncate(5, id)"],
                                  ["day(ts)", "bucket(3, name)"], ["hour(ts)", "bucket(5, id)"],
                                  ["day(day)", "bucket(4, id)"], ["name", "identity(id)"]]):
        table = IcebergTableFormat(f"db.t{index}", default_catalog_properties(str(tmp_path / "lake")))
        table.ensure(data.schema, spec)
        assert table.partitioning == [text.replace("identity(id)", "id") for text in spec]
        metadata, _ = table.writer_state()
        files = write_data_files(metadata, table.table().io, data)
        assert table.append_files(files, query_id="q", batch_id=0, metadata={}) is True
        iceberg = table.table()
        schema = iceberg.schema()
        fields = [(field.transform.transform(schema.find_field(field.source_id).field_type),
                   schema.find_column_name(field.source_id)) for field in iceberg.spec().fields]
        for data_file in files:
            import pyarrow.parquet as pq

            written = pq.read_table(data_file.file_path.removeprefix("file://"))
            for row in written.to_pylist():
                values = []
                for apply, column in fields:
                    value = row[column]
                    if isinstance(value, dt.datetime):
                        value = int(value.timestamp() * 1_000_000)
                    elif isinstance(value, dt.date):
                        value = (value - dt.date(1970, 1, 1)).days
                    values.append(None if value is None else apply(value))
                assert values == list(data_file.partition), (spec, row)
        assert sorted(iceberg.scan().to_arrow().to_pylist(), key=repr) == sorted(data.to_pylist(), key=repr)
    one_day = IcebergTableFormat("db.t2", default_catalog_properties(str(tmp_path / "lake"))).table().scan(
        row_filter=And(GreaterThanOrEqual("ts", "2026-03-03T00:00:00+00:00"),
                       LessThan("ts", "2026-03-04T00:00:00+00:00")))
    assert len(list(one_day.plan_files())) == 1
    assert one_day.to_arrow().column("id").to_pylist() == [2]


@pytest.mark.parametrize("spec", [[], ["day(day)", "bucket(2, source)"]], ids=["unpartitioned", "partitioned"])
def test_a_replace_overwrites_exactly_the_filtered_rows_and_twice_is_the_same(tmp_path: Path, spec: list[str]) -> None:
    """A backfill's replace of the rows of two source files, in one overwrite snapshot, against the oracle of the
    rows: the other files' rows stay, a data file holding rows of both kinds is rewritten without the replaced
    ones; a second backfill of the same range gives the same table; a replay of a batch writes nothing."""
    import datetime as dt

    def events(source: str, ids: range, tag: str) -> pa.Table:
        return pa.table({"id": pa.array(list(ids), pa.int64()), "tag": [tag] * len(ids),
                         "day": pa.array([dt.date(2026, 11, 20 + i % 3) for i in ids], pa.date32()),
                         "source": [source] * len(ids)})

    table = IcebergTableFormat("db.t", default_catalog_properties(str(tmp_path / "lake")))
    first = pa.concat_tables([events("a.json", range(0, 10), "live"), events("b.json", range(10, 20), "live"),
                              events("c.json", range(20, 30), "live")])
    table.ensure(first.schema, spec)
    table.commit_batch(first, query_id="live", batch_id=0, metadata={})  # a, b and c share data files
    again = pa.concat_tables([events("b.json", range(10, 20), "backfill"), events("c.json", range(20, 25), "backfill")])
    replaced = "source IN ('b.json', 'c.json')"

    def oracle() -> list[tuple[int, str]]:
        return sorted([(i, "live") for i in range(10)] + [(i, "backfill") for i in range(10, 25)])

    def held() -> list[tuple[int, str]]:
        return sorted((row["id"], row["tag"]) for row in table.table().scan().to_arrow().to_pylist())

    assert table.replace_batch(again, replaced, query_id="backfill-1", batch_id=0, metadata={}) is True
    assert held() == oracle()
    assert table.commits()[-1].operation == "overwrite" and table.batches("backfill-1") == [0]
    assert table.replace_batch(again, replaced, query_id="backfill-1", batch_id=0, metadata={}) is False
    assert table.replace_batch(again, replaced, query_id="backfill-2", batch_id=0, metadata={}) is True
    assert held() == oracle()
    assert len(table.table().snapshots()) == 3  # the live batch and one overwrite per backfill


def test_a_backfill_s_row_filter_replaces_its_files_rows_in_its_time_range(tmp_path: Path) -> None:
    """The plan's filter (files read, and the event-time range): rows of other files, and rows of the files read
    outside the range, stay."""
    import datetime as dt

    from sluice.model.predicates import RowFilter
    from sluice.storage.iceberg import iceberg_filter

    utc = dt.timezone.utc
    times = [dt.datetime(2026, 11, 20, hour, tzinfo=utc) for hour in range(0, 24, 4)]
    held = pa.table({"id": list(range(12)), "source": ["a.json"] * 6 + ["b.json"] * 6,
                     "ts": pa.array(times * 2, pa.timestamp("us", tz="UTC"))})
    table = IcebergTableFormat("db.t", default_catalog_properties(str(tmp_path / "lake")))
    table.ensure(held.schema, ["day(ts)"])
    table.commit_batch(held, query_id="live", batch_id=0, metadata={})
    start, end = dt.datetime(2026, 11, 20, 4, tzinfo=utc), dt.datetime(2026, 11, 20, 12, tzinfo=utc)
    replaced = RowFilter(file_column="source", files=("b.json",), time_column="ts", start=start, end=end)
    again = pa.table({"id": [107, 108], "source": ["b.json"] * 2,
                      "ts": pa.array([times[1], times[2]], pa.timestamp("us", tz="UTC"))})
    assert table.count(replaced) == 2 and table.distinct("source") == {"a.json", "b.json"}
    assert table.distinct("source", RowFilter(time_column="ts", start=times[5], end=end + dt.timedelta(days=1))) \
        == {"a.json", "b.json"}
    for query, given in (("backfill-1", iceberg_filter(replaced)), ("backfill-2", replaced)):  # the plan's filter
        assert table.replace_batch(again, given, query_id=query, batch_id=0, metadata={})
        assert sorted(table.table().scan().to_arrow().column("id").to_pylist()) == [
            0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 107, 108]


@pytest.mark.parametrize("spec", [[], ["bucket(2, id)"]], ids=["unpartitioned", "partitioned"])
def test_a_kafka_offset_range_replaces_exactly_its_records_rows(tmp_path: Path, spec: list[str]) -> None:
    """A Kafka range backfill's filter on an Iceberg table: the rows whose lineage ``kafka://<topic>/<partition>/
    <offset>`` is in one of the ranges, offsets compared as numbers (9 < 10 < 100, which text orders otherwise),
    another topic sharing the prefix's start and NULL lineage left alone; counted, listed and replaced exactly, twice
    the same table. The oracle parses each lineage with Python."""
    from sluice.model.predicates import RowFilter

    lineage = ([f"kafka://t/0/{offset}" for offset in (0, 1, 2, 9, 10, 11, 100)]
               + [f"kafka://t/1/{offset}" for offset in (8, 9, 10, 99, 100, 101, 1000)]
               + ["kafka://t2/0/5", "kafka://t/0/x", None])
    held = pa.table({"id": pa.array(range(len(lineage)), pa.int64()), "tag": ["live"] * len(lineage),
                     "_source_file": pa.array(lineage, pa.string())})
    ranges = (("t", 0, 2, 10), ("t", 1, 9, 100))
    replaced = RowFilter(file_column="_source_file", offsets=ranges)

    def in_range(value: str | None) -> bool:
        if value is None:
            return False
        topic, partition, offset = value.removeprefix("kafka://").split("/")
        return offset.isdigit() and any(topic == t and int(partition) == p and first <= int(offset) <= last
                                        for t, p, first, last in ranges)

    chosen = [i for i, value in enumerate(lineage) if in_range(value)]
    assert len(chosen) == 7
    table = IcebergTableFormat("db.k", default_catalog_properties(str(tmp_path / "lake")))
    table.ensure(held.schema, spec)
    table.commit_batch(held, query_id="live", batch_id=0, metadata={})
    assert table.count(replaced) == len(chosen)
    assert table.distinct("_source_file", replaced) == {lineage[i] for i in chosen}
    again = pa.table({"id": pa.array(chosen, pa.int64()), "tag": ["backfill"] * len(chosen),
                      "_source_file": pa.array([lineage[i] for i in chosen], pa.string())})
    expected = sorted((i, "backfill" if i in chosen else "live") for i in range(len(lineage)))
    for query in ("backfill-1", "backfill-2"):
        assert table.replace_batch(again, replaced, query_id=query, batch_id=0, metadata={}) is True
        assert sorted((row["id"], row["tag"]) for row in table.table().scan().to_arrow().to_pylist()) == expected
    assert table.replace_batch(again, replaced, query_id="backfill-2", batch_id=0, metadata={}) is False


@pytest.mark.parametrize("spec", [["day(ts)"], ["day(ts)", "bucket(2, id)"], ["region"]],
                         ids=["day", "day-and-bucket", "identity"])
def test_a_merge_into_a_partitioned_table_equals_the_oracle(tmp_path: Path, spec: list[str]) -> None:
    """A merge by ``id`` into a table partitioned by ``day(ts)`` (and more), against the oracle of the newest row per
    key (``sequence_by: version``): a late update of a key in an older day rewrites that day's file alone; a key
    whose new row is in another day leaves its old one; an older row changes nothing; a replayed batch is
    skipped; a batch of older rows only still commits, to be held."""
    import datetime as dt

    utc = dt.timezone.utc

    def rows(*items: tuple[str, int, int, str]) -> pa.Table:
        return pa.table({"id": pa.array([item[0] for item in items], pa.string()),
                         "ts": pa.array([dt.datetime(2026, 11, day, 10, tzinfo=utc) for _, day, _, _ in items],
                                        pa.timestamp("us", tz="UTC")),
                         "version": pa.array([item[2] for item in items], pa.int64()),
                         "region": [item[3] for item in items]})

    table = IcebergTableFormat("db.merged", default_catalog_properties(str(tmp_path / "lake")))
    table.ensure(rows(("a", 1, 0, "eu")).schema, spec)
    oracle: dict[str, tuple[Any, ...]] = {}

    def merge(batch_id: int, batch: pa.Table) -> bool:
        for row in batch.to_pylist():
            if row["id"] not in oracle or row["version"] >= oracle[row["id"]][2]:
                oracle[row["id"]] = (row["id"], row["ts"], row["version"], row["region"])
        return table.upsert_batch(batch, ["id"], query_id="q", batch_id=batch_id, metadata={}, sequence_by="version")

    def held() -> list[tuple[Any, ...]]:
        read = table.table().scan().to_arrow().to_pylist()
        return sorted((row["id"], row["ts"], row["version"], row["region"]) for row in read)

    def files() -> set[str]:
        return {task.file.file_path for task in table.table().scan().plan_files()}

    assert merge(0, rows(("a", 20, 1, "eu"), ("b", 20, 1, "us"), ("c", 21, 1, "eu"), ("d", 22, 1, "us")))
    assert held() == sorted(oracle.values())
    newest_day = {task.file.file_path for task in table.table().scan(row_filter="id == 'd'").plan_files()}
    # Late: a's update stays in the older day 20; e is new in day 20.
    assert merge(1, rows(("a", 20, 2, "eu"), ("e", 20, 1, "eu")))
    assert held() == sorted(oracle.values())
    assert newest_day <= files(), "day 22's file holds none of the keys: not rewritten"
    # c moves from day 21 to day 20 (and region), d's row is older than the table's: unchanged.
    assert merge(2, rows(("c", 20, 3, "us"), ("d", 19, 0, "eu")))
    assert held() == sorted(oracle.values())
    assert [row[0] for row in held()].count("c") == 1
    assert not table.upsert_batch(rows(("c", 23, 9, "eu")), ["id"], query_id="q", batch_id=2, metadata={},
                                  sequence_by="version"), "a replay"
    assert held() == sorted(oracle.values())
    assert merge(3, rows(("b", 20, 0, "eu")))  # older only: nothing changes, the batch is held
    assert held() == sorted(oracle.values()) and table.batches("q") == [0, 1, 2, 3]
    assert table.partitioning == spec


def test_files_written_by_separate_tasks_commit_as_one_append_once(tmp_path: Path) -> None:
    """The writer of an append beside a jvm dead-letter table, without Spark: each task's rows become data files
    (``write_task_files``, what ``mapInArrow`` runs), their pickled ``DataFile``s are committed by the driver as one
    append snapshot; a task with no rows writes nothing; the replay's files are removed, not committed."""
    import pickle

    from sluice_spark.kinds.iceberg import write_task_files

    table = IcebergTableFormat("db.tasks", default_catalog_properties(str(tmp_path / "lake")))
    table.ensure(SCHEMA, ["bucket(2, id)"])
    metadata, catalog = table.writer_state()

    def tasks(*groups: list[int]) -> list[Any]:
        written = []
        for ids in groups:
            batches = [batch for batch in rows(*ids).to_batches()] if ids else []
            for out in write_task_files(metadata, catalog, iter(batches)):
                written += [pickle.loads(item) for item in out.column("file").to_pylist()]
        return written

    files = tasks([1, 2, 3], [4, 5, 6], [])
    assert len(files) >= 2 and sum(int(f.record_count) for f in files) == 6
    assert table.append_files(files, query_id="q", batch_id=0, metadata={}) is True
    assert sorted(table.table().scan().to_arrow().column("id").to_pylist()) == [1, 2, 3, 4, 5, 6]
    assert len(table.table().snapshots()) == 1
    replay = tasks([1, 2, 3])
    assert table.append_files(replay, query_id="q", batch_id=0, metadata={}) is False
    assert not any(Path(f.file_path.removeprefix("file://")).exists() for f in replay)
    assert sorted(table.table().scan().to_arrow().column("id").to_pylist()) == [1, 2, 3, 4, 5, 6]


def test_a_changed_partition_spec_evolves_the_table_and_every_row_stays(tmp_path: Path) -> None:
    """``partition_by`` changed on an existing table: one spec update; the files written before keep their spec,
    the later ones take the new one; scans, a filter on the old spec's column and a replace see every row as the
    oracle has it. The same spec again, or none (None), changes nothing."""
    import datetime as dt


    def batch(ids: range) -> pa.Table:
        return pa.table({"id": pa.array(list(ids), pa.int64()), "tag": ["live"] * len(ids),
                         "day": pa.array([dt.date(2026, 11, 20 + i % 3) for i in ids], pa.date32()),
                         "_source_file": [f"f{i % 2}.json" for i in ids]})

    table = IcebergTableFormat("db.evolving", default_catalog_properties(str(tmp_path / "lake")))
    table.ensure(batch(range(1)).schema, ["day(day)"])
    table.commit_batch(batch(range(0, 12)), query_id="q", batch_id=0, metadata={})
    table.ensure(batch(range(1)).schema, ["bucket(2, id)", "identity(tag)"])
    assert sorted(table.partitioning) == ["bucket(2, id)", "tag"]
    specs = len(table.table().specs())
    for same in (["tag", "bucket(2, id)"], None):
        table.ensure(batch(range(1)).schema, same)
        assert len(table.table().specs()) == specs and sorted(table.partitioning) == ["bucket(2, id)", "tag"]
    table.commit_batch(batch(range(12, 20)), query_id="q", batch_id=1, metadata={})
    files = table.table().inspect.data_files()
    spec_of = dict(zip(files.column("file_path").to_pylist(), files.column("spec_id").to_pylist(), strict=True))
    assert len(set(spec_of.values())) == 2
    assert_every_row_stays(table, batch, 20)
    with pytest.raises(SluiceError, match="hour"):
        table.ensure(batch(range(1)).schema, ["hour(day)"])


def test_a_removed_partition_field_then_an_empty_spec_unpartition_the_table_and_every_row_stays(
        tmp_path: Path) -> None:
    """``partition_by`` with a field fewer removes that field; ``[]`` unpartitions the table; each is one spec
    update, and none (None) changes nothing. The files written before keep their spec, the later ones are written
    unpartitioned (no partition value, one file a batch); scans, a filter on a removed field's column and a replace
    see every row as the oracle (the rows committed) has it."""
    import datetime as dt


    def batch(ids: range) -> pa.Table:
        return pa.table({"id": pa.array(list(ids), pa.int64()), "tag": ["live"] * len(ids),
                         "day": pa.array([dt.date(2026, 11, 20 + i % 3) for i in ids], pa.date32()),
                         "_source_file": [f"f{i % 2}.json" for i in ids]})

    schema = batch(range(1)).schema
    table = IcebergTableFormat("db.unpartitioning", default_catalog_properties(str(tmp_path / "lake")))
    table.ensure(schema, ["day(day)", "bucket(2, id)"])
    table.commit_batch(batch(range(0, 12)), query_id="q", batch_id=0, metadata={})
    current = lambda: table.table().spec().spec_id  # noqa: E731
    first = current()
    table.ensure(schema, ["bucket(2, id)"])
    assert table.partitioning == ["bucket(2, id)"] and current() != first
    table.commit_batch(batch(range(12, 20)), query_id="q", batch_id=1, metadata={})
    second, updates = current(), len(table.table().metadata.metadata_log)
    table.ensure(schema, [])
    assert table.partitioning == [] and table.table().spec().is_unpartitioned() and current() not in (first, second)
    updates += 1
    assert len(table.table().metadata.metadata_log) == updates, "one metadata commit"
    table.ensure(schema, None)
    table.ensure(schema, [])
    assert len(table.table().metadata.metadata_log) == updates, "nothing to change"
    table.commit_batch(batch(range(20, 30)), query_id="q", batch_id=2, metadata={})

    files = table.table().inspect.data_files()
    spec_ids = files.column("spec_id").to_pylist()
    assert spec_ids.count(current()) == 1, "the last batch: one file, in no partition"
    assert spec_ids.count(first) >= 3 and spec_ids.count(second) >= 2, "every earlier file keeps its spec"
    assert_every_row_stays(table, batch, 30)
    assert table.table().spec().is_unpartitioned()


def assert_every_row_stays(table: IcebergTableFormat, batch: Any, count: int) -> None:
    """Rows ``0..count`` of ``batch`` (tag ``live``) committed across specs: a scan, a filter on the day column and a
    replace of the even rows (file ``f0.json``) each see them as the oracle has them."""
    from sluice.model.predicates import RowFilter

    rows = lambda: sorted((r["id"], r["tag"]) for r in table.table().scan().to_arrow().to_pylist())  # noqa: E731
    assert rows() == [(i, "live") for i in range(count)]
    one_day = table.table().scan(row_filter="day = '2026-11-21'").to_arrow().column("id").to_pylist()
    assert sorted(one_day) == [i for i in range(count) if i % 3 == 1]
    again = batch(range(0, count, 2)).set_column(1, "tag", pa.array(["backfill"] * len(range(0, count, 2))))
    assert table.replace_batch(again, RowFilter(file_column="_source_file", files=("f0.json",)), query_id="b",
                               batch_id=0, metadata={})
    assert rows() == [(i, "backfill" if i % 2 == 0 else "live") for i in range(count)]
