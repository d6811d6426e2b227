"""``source.read: changes``: a stream that follows the inserts, updates and deletes of its upstream Delta table.

The oracle is plain Python: it applies the same changes in order (newest ``seq`` wins per key, a delete removes the
key) and keeps the change log Delta's change feed must show for them. The chain is bronze (``mode: merge``, and a
DELETE on it as a privacy request would make) -> silver (``read: changes``, appended: the change log) -> gold
(silver's appends merged by key, newest commit version wins: one row per key, a delete as its tombstone); beside
silver, bronze's changes merged straight by key on ``_commit_version`` give the same rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from sluice.catalog import load_catalog
from sluice.errors import SluiceError
from sluice.kinds.delta import delta_backlog, delta_next_version
from sluice.lag.observe import check
from sluice.storage.checkpoint import CheckpointReader
from sluice.storage.delta import read_table
from sluice_spark.runner import run_streams
from tests.helpers import needs_jvm_jars, roots_in, write_catalog

pytestmark = pytest.mark.spark

ENGINES = pytest.mark.parametrize("engine", ["rs", pytest.param("jvm", marks=needs_jvm_jars)])


def chain(engine: str) -> list[dict[str, Any]]:
    """The three streams of the chain, on one engine."""
    fields = {"id": "bigint not null", "value": "string", "seq": "bigint not null"}
    return [
        {"name": "items", "schedule": "*/5 * * * *", "transform": "identity", "checkpoint": "bronze/items",
         "source": {"type": "files", "format": "json", "path": "items", "schema": fields},
         "sink": {"path": "bronze/items", "mode": "merge", "keys": ["id"], "sequence_by": "seq", "engine": engine}},
        # Sluice reserves names that start with '_' for its own columns: the change log names Delta's change columns
        # for the streams that read it as appends.
        {"name": "items_changes", "checkpoint": "silver/items_changes",
         "transform": {"sql": "SELECT id, value, seq, _change_type AS change_type, _commit_version AS commit_version, "
                              "_commit_timestamp AS committed_at FROM source"},
         "source": {"type": "delta", "path": "bronze/items", "read": "changes", "schema": fields,
                    "schema_evolution": "none"},
         "sink": {"path": "silver/items_changes", "engine": engine}},
        {"name": "items_current", "transform": "identity", "checkpoint": "gold/items_current",
         "source": {"type": "delta", "path": "silver/items_changes", "schema_evolution": "none",
                    "schema": {**fields, "change_type": "string not null", "commit_version": "bigint not null"}},
         "sink": {"path": "gold/items_current", "mode": "merge", "keys": ["id"], "sequence_by": "commit_version",
                  "engine": engine}},
        # Bronze's changes applied by key as a change feed (sink.mode cdc): its deletes delete, so the table is
        # bronze's rows.
        {"name": "items_mirror", "transform": "identity", "checkpoint": "silver/items_mirror",
         "source": {"type": "delta", "path": "bronze/items", "read": "changes", "schema": fields,
                    "schema_evolution": "none"},
         "sink": {"path": "silver/items_mirror", "mode": "cdc", "keys": ["id"], "sequence_by": "_commit_version",
                  "cdc": {"delete_when": "_change_type = 'delete'",
                          "except_columns": ["_change_type", "_commit_timestamp"]},
                  "engine": engine}},
        # Bronze's changes merged straight into one row per key, ordered by the version that made them.
        {"name": "items_latest", "transform": "identity", "checkpoint": "silver/items_latest",
         "source": {"type": "delta", "path": "bronze/items", "read": "changes", "schema": fields,
                    "schema_evolution": "none"},
         "sink": {"path": "silver/items_latest", "mode": "merge", "keys": ["id"], "sequence_by": "_commit_version",
                  "engine": engine}},
    ]


class Oracle:
    """The bronze table as Python sees the changes, and the change feed they must make."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[str, int]] = {}
        self.log: list[tuple[int, str, int, str]] = []  # (id, value, seq, change type) in commit order

    def merge(self, batch: list[tuple[int, str, int]]) -> None:
        newest: dict[int, tuple[str, int]] = {}
        for key, value, seq in batch:
            if key not in newest or seq > newest[key][1]:
                newest[key] = (value, seq)
        for key, (value, seq) in sorted(newest.items()):
            if key not in self.rows:
                self.rows[key] = (value, seq)
                self.log.append((key, value, seq, "insert"))
            elif seq >= self.rows[key][1]:
                self.rows[key] = (value, seq)
                self.log.append((key, value, seq, "update_postimage"))

    def delete(self, keys: set[int]) -> None:
        for key in sorted(keys & set(self.rows)):
            value, seq = self.rows.pop(key)
            self.log.append((key, value, seq, "delete"))

    def current(self) -> dict[int, tuple[str, int, str]]:
        """The last change per key, as gold holds it."""
        last: dict[int, tuple[str, int, str]] = {}
        for key, value, seq, kind in self.log:
            last[key] = (value, seq, kind)
        return last


ROUNDS = [
    [(key, f"v{key}", 1) for key in range(8)],
    # updates (one late and older, which changes nothing), a key twice in one batch, new keys
    [(1, "late", 0), (2, "two", 5), (3, "three", 5), (3, "three-again", 6), (8, "eight", 1), (9, "nine", 1)],
    [(2, "two-more", 7), (10, "ten", 1), (4, "four", 9)],
]


def land(tmp_path: Path, number: int, batch: list[tuple[int, str, int]]) -> None:
    folder = tmp_path / "landing" / "items"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": key, "value": value, "seq": seq}) for key, value, seq in batch]
    (folder / f"batch-{number}.json").write_text("\n".join(lines) + "\n", encoding="utf-8")


def delete_from_bronze(spark: Any, engine: str, path: str, keys: set[int]) -> None:
    """A DELETE on bronze by its own engine, outside Sluice (a privacy request)."""
    predicate = f"id IN ({', '.join(map(str, sorted(keys)))})"
    if engine == "rs":
        DeltaTable(path).delete(predicate)
    else:
        from delta.tables import DeltaTable as SparkDeltaTable

        SparkDeltaTable.forPath(spark, path).delete(predicate)


def run(spark: Any, catalog: Any, names: list[str], roots: Any) -> None:
    summary = run_streams(spark, catalog, names, roots)
    assert summary.ok, [stream.error for stream in summary.streams]


def silver_log(path: str) -> list[tuple[int, str, int, str]]:
    rows = read_table(path, ["id", "value", "seq", "change_type", "commit_version"]).to_pylist()
    ordered = sorted(rows, key=lambda row: (row["commit_version"], row["id"]))
    return [(row["id"], row["value"], row["seq"], row["change_type"]) for row in ordered]


def gold_rows(path: str, change_type: str = "change_type") -> dict[int, tuple[str, int, str]]:
    rows = read_table(path, ["id", "value", "seq", change_type]).to_pylist()
    return {row["id"]: (row["value"], row["seq"], row[change_type]) for row in rows}


def assert_follows(tmp_path: Path, oracle: Oracle) -> None:
    lake = tmp_path / "lake"
    bronze = {row["id"]: (row["value"], row["seq"]) for row in read_table(str(lake / "bronze" / "items"),
                                                                          ["id", "value", "seq"]).to_pylist()}
    assert bronze == oracle.rows
    assert silver_log(str(lake / "silver" / "items_changes")) == oracle.log
    gold = gold_rows(str(lake / "gold" / "items_current"))
    assert gold == oracle.current()
    assert {key: (value, seq) for key, (value, seq, kind) in gold.items() if kind != "delete"} == oracle.rows
    if (lake / "silver" / "items_mirror").exists():
        mirror = read_table(str(lake / "silver" / "items_mirror"), ["id", "value", "seq"]).to_pylist()
        assert {row["id"]: (row["value"], row["seq"]) for row in mirror} == oracle.rows
    if (lake / "silver" / "items_latest").exists():
        assert gold_rows(str(lake / "silver" / "items_latest"), "_change_type") == oracle.current()


@ENGINES
def test_silver_and_gold_follow_an_upserted_and_deleted_bronze(spark: Any, tmp_path: Path, engine: str) -> None:
    catalog = load_catalog(write_catalog(tmp_path, *chain(engine)))
    roots = roots_in(tmp_path)
    bronze = str(tmp_path / "lake" / "bronze" / "items")
    oracle = Oracle()
    for number, batch in enumerate(ROUNDS):
        land(tmp_path, number, batch)
        run(spark, catalog, ["items"], roots)
        oracle.merge(batch)
        if number == 1:
            delete_from_bronze(spark, engine, bronze, {5, 9})
            oracle.delete({5, 9})
        assert check(catalog.get("items_changes"), roots).observation.backlog.versions > 0
        run(spark, catalog, ["items_changes", "items_latest", "items_mirror"], roots)
        assert check(catalog.get("items_changes"), roots).observation.backlog.versions == 0
        run(spark, catalog, ["items_current"], roots)
        assert_follows(tmp_path, oracle)
    assert DeltaTable(bronze).metadata().configuration.get("delta.enableChangeDataFeed") == "true"
    # Nothing new: the runs change nothing.
    before = [DeltaTable(str(tmp_path / "lake" / table)).version() for table in ("silver/items_changes",
                                                                                 "gold/items_current")]
    run(spark, catalog, ["items_changes", "items_current"], roots)
    assert [DeltaTable(str(tmp_path / "lake" / table)).version() for table in ("silver/items_changes",
                                                                              "gold/items_current")] == before
    assert_follows(tmp_path, oracle)


@ENGINES
def test_a_table_without_its_change_feed_is_refused_naming_it(spark: Any, tmp_path: Path, engine: str) -> None:
    """A table no stream of the catalog writes, without the change feed: refused before any query, naming the table;
    with the change feed turned on later, the versions before it fail naming the first."""
    streams = chain(engine)[1:3]
    streams[0] = {**streams[0], "schedule": "*/5 * * * *"}
    catalog = load_catalog(write_catalog(tmp_path, *streams))
    roots = roots_in(tmp_path)
    bronze = str(tmp_path / "lake" / "bronze" / "items")
    write_deltalake(bronze, pa.table({"id": pa.array([1, 2], pa.int64()), "value": ["a", "b"],
                                      "seq": pa.array([1, 1], pa.int64())}))
    with pytest.raises(SluiceError, match=r"bronze/items does not record its changes \(delta.enableChangeDataFeed is "
                                          r"not true at version 0\)"):
        run_streams(spark, catalog, ["items_changes"], roots)
    DeltaTable(bronze).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    failed = run_streams(spark, catalog, ["items_changes"], roots).streams[0]
    assert failed.status == "failed"
    said = {"rs": "version 0 was committed while the table did not record its changes",
            "jvm": "the Delta table bronze/items has no change data for version 0: it was committed before the table "
                   "recorded its changes"}
    assert said[engine] in (failed.error or ""), failed.error


def test_the_rs_reader_reads_each_versions_changes_once(spark: Any, tmp_path: Path) -> None:
    """``sluice_delta`` with ``readChangeFeed``: exactly the versions after the checkpoint's, once; the lag counts the
    versions of an update or a delete as waiting."""
    table, checkpoint = str(tmp_path / "t"), str(tmp_path / "ckpt")
    schema = pa.schema([("id", pa.int64()), ("value", pa.string())])
    DeltaTable.create(table, schema=schema, configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(table, pa.table({"id": [1, 2, 3], "value": ["a", "b", "c"]}, schema=schema), mode="append")
    batches: list[list[tuple[Any, ...]]] = []

    def run() -> None:
        def collect(frame: Any, _: int) -> None:
            batches.append(sorted((row.id, row.value, row._change_type, row._commit_version)
                                  for row in frame.collect()))

        query = (spark.readStream.format("sluice_delta").option("readChangeFeed", "true").load(table)
                 .writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()

    run()
    assert batches == [[(1, "a", "insert", 1), (2, "b", "insert", 1), (3, "c", "insert", 1)]]
    DeltaTable(table).merge(pa.table({"id": [2, 4], "value": ["B", "d"]}, schema=schema), "t.id = s.id",
                            source_alias="s", target_alias="t").when_matched_update_all() \
        .when_not_matched_insert_all().execute()
    DeltaTable(table).delete("id = 1")
    offset = CheckpointReader(checkpoint).committed_source_offset()
    assert delta_backlog(table, delta_next_version(offset), changes=True).versions == 2
    assert delta_backlog(table, delta_next_version(offset), changes=True).bytes > 0
    batches.clear()
    run()
    assert batches == [[(1, "a", "delete", 3), (2, "B", "update_postimage", 2), (4, "d", "insert", 2)]]
    batches.clear()
    run()
    assert batches == []


@pytest.mark.slow
@ENGINES
def test_sigkill_in_the_chain_then_rerun_gives_the_oracles_tables(spark: Any, tmp_path: Path, engine: str) -> None:
    """The changes reader killed before its commit, and gold killed between its table's commit and its dead-letter
    table's (its rerun replays the batch): each rerun leaves the tables the oracle computes, and gold's replayed batch
    commits nothing to its table. Only the killed runs need an application of their own; each rerun is the session's,
    through the runner's own code, as the setup runs are."""
    from tests.spark.test_crash_recovery import DRIVER, kill_application, submit, wait_for

    catalog_path = write_catalog(tmp_path, *chain(engine))
    catalog, roots = load_catalog(catalog_path), roots_in(tmp_path)
    oracle = Oracle()
    for number, batch in enumerate(ROUNDS[:2]):
        land(tmp_path, number, batch)
        run(spark, catalog, ["items"], roots)
        oracle.merge(batch)
    delete_from_bronze(spark, engine, str(tmp_path / "lake" / "bronze" / "items"), {5, 9})
    oracle.delete({5, 9})
    gold = str(tmp_path / "lake" / "gold" / "items_current")
    for stream, point in (("items_changes", "before_commit"), ("items_current", "between_commits")):
        faults = tmp_path / f"faults-{stream}"
        faults.mkdir()
        crashed = submit(catalog_path, roots, ("SLUICE_FAULT_POINT", point), ("SLUICE_FAULT_DIR", str(faults)),
                         DRIVER, log=faults / "crashed.log", stream=stream)
        wait_for(faults / f"{point}.reached", crashed, faults / "crashed.log")
        kill_application(crashed, faults / f"{point}.reached")
        committed = DeltaTable(gold).version() if stream == "items_current" else None
        run(spark, catalog, [stream], roots)
        if committed is not None:
            assert DeltaTable(gold).version() == committed, "the replayed batch committed again"
    assert_follows(tmp_path, oracle)


def test_the_rs_reader_stops_at_an_ending_version(spark: Any, tmp_path: Path) -> None:
    """A range backfill's bound: ``startingVersion`` to ``endingVersion``, both included, appends or changes."""
    table = str(tmp_path / "t")
    schema = pa.schema([("id", pa.int64())])
    DeltaTable.create(table, schema=schema, configuration={"delta.enableChangeDataFeed": "true"})
    for first in (0, 10, 20, 30):
        write_deltalake(table, pa.table({"id": list(range(first, first + 3))}, schema=schema), mode="append")
    for changes in ("false", "true"):
        rows: list[int] = []
        query = (spark.readStream.format("sluice_delta").option("readChangeFeed", changes)
                 .option("startingVersion", "2").option("endingVersion", "3").load(table).writeStream
                 .foreachBatch(lambda frame, _, into=rows: into.extend(row.id for row in frame.collect()))
                 .option("checkpointLocation", str(tmp_path / f"ckpt-{changes}")).trigger(availableNow=True).start())
        query.awaitTermination()
        assert sorted(rows) == [10, 11, 12, 20, 21, 22]
