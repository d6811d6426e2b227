"""mode: cdc on both Delta engines, against an oracle in plain Python that applies the same changes in sequence order:
shuffled arrival across batches, duplicates, deletes before and after late upserts, a key deleted and recreated,
type 2 histories compared row by row, and a replayed batch that changes nothing."""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sluice.constants import CDC_END_COLUMN, CDC_START_COLUMN, DeltaEngine, SinkMode
from sluice.model.sinks import CdcSpec
from sluice.storage.delta import ensure_table, read_table, table_version
from sluice_spark.targets import TableTarget
from sluice_spark.write.cdc import tombstones_path
from sluice_spark.write.tables import table_writer
from tests.helpers import needs_jvm_jars

pytestmark = [pytest.mark.spark, needs_jvm_jars]

ENGINES = pytest.mark.parametrize("engine", ["rs", "jvm"])
SCHEMA = "id long, name string, tier string, seq long, op string"
DATA = ("id", "name", "tier", "seq")
Change = tuple[int, str | None, str | None, int, str]  # id, name, tier, seq, op


# -- the oracle ------------------------------------------------------------------------------------------------------

def in_order(changes: Iterable[Change]) -> dict[int, list[Change]]:
    """Each key's distinct changes in sequence order; at one sequence a delete comes last (it wins)."""
    keyed: dict[int, list[Change]] = {}
    for change in sorted(set(changes), key=lambda c: (c[3], c[4] == "d")):
        keyed.setdefault(change[0], []).append(change)
    return keyed


def type1(changes: Iterable[Change]) -> list[tuple[Any, ...]]:
    """The newest change of each key, when it is not a delete."""
    return sorted(last[:4] for last in (history[-1] for history in in_order(changes).values()) if last[4] != "d")


def type2(changes: Iterable[Change], tracked: tuple[int, ...] = (1, 2)) -> list[tuple[Any, ...]]:
    """Every version of each key: an upsert opens one when none is open or a tracked column changed, else it updates
    the open one in place; a delete closes it."""
    rows = []
    for history in in_order(changes).values():
        current: list[Any] | None = None
        for change in history:
            if change[4] == "d":
                if current is not None:
                    current[5] = change[3]
                    rows.append(tuple(current))
                current = None
            elif current is not None and all(current[i] == change[i] for i in tracked):
                current[:4] = change[:4]
            else:
                if current is not None:
                    current[5] = change[3]
                    rows.append(tuple(current))
                current = [*change[:4], change[3], None]
        if current is not None:
            rows.append(tuple(current))
    return sorted(rows, key=lambda row: (row[0], row[4]))


# -- the feed --------------------------------------------------------------------------------------------------------

def feed(seed: int, keys: int = 12, changes: int = 90) -> list[Change]:
    """Changes of a few keys, each with its own sequence (a value per sequence, so that no two upserts of a key are
    alike): a quarter of them deletes, a tenth repeated."""
    rng = random.Random(seed)
    sequences = rng.sample(range(1, 10_000), changes)
    made: list[Change] = []
    for sequence in sequences:
        key = rng.randrange(keys)
        if rng.random() < 0.25:
            made.append((key, None, None, sequence, "d"))
        else:
            made.append((key, f"n{sequence}", rng.choice(["free", "pro", "team"]), sequence, "u"))
    made += rng.sample(made, changes // 10)
    rng.shuffle(made)
    return made


def target(path: str, scd_type: int, track: tuple[str, ...] = ()) -> TableTarget:
    columns = tuple((name, name) for name in DATA)
    return TableTarget(0, path, columns, mode=SinkMode.CDC, keys=("id",), sequence_by="seq",
                       cdc=CdcSpec(delete_when="op = 'd'", scd_type=scd_type, except_columns=("op",),
                                   track_history_columns=track))


def create(path: str, scd_type: int) -> None:
    fields = [pa.field("id", pa.int64()), pa.field("name", pa.string()), pa.field("tier", pa.string()),
              pa.field("seq", pa.int64())]
    if scd_type == 2:
        fields += [pa.field(CDC_START_COLUMN, pa.int64()), pa.field(CDC_END_COLUMN, pa.int64())]
    ensure_table(path, pa.schema(fields), (), name="customers")


def apply(spark: Any, engine: str, table: TableTarget, batches: list[list[Change]], *, query: str = "q",
          first: int = 0) -> list[bool]:
    writer = table_writer(DeltaEngine(engine))
    return [writer.write(spark.createDataFrame(batch, SCHEMA), table, query_id=query, batch_id=first + index,
                         metadata={"sluice.queryId": query, "sluice.batchId": first + index})
            for index, batch in enumerate(batches)]


def rows(path: str, scd_type: int) -> list[tuple[Any, ...]]:
    names = [*DATA, *((CDC_START_COLUMN, CDC_END_COLUMN) if scd_type == 2 else ())]
    table = read_table(path).select(names).to_pylist()
    return sorted((tuple(row[name] for name in names) for row in table),
                  key=lambda row: (row[0], row[4] if scd_type == 2 else 0))


def split(changes: list[Change], parts: int) -> list[list[Change]]:
    size = -(-len(changes) // parts)
    return [changes[start:start + size] for start in range(0, len(changes), size)]


# -- the tests -------------------------------------------------------------------------------------------------------

@ENGINES
@pytest.mark.parametrize("scd_type", [1, 2])
def test_shuffled_changes_give_the_oracles_table(spark: Any, tmp_path: Path, engine: str, scd_type: int) -> None:
    """Ninety changes of twelve keys (deletes, duplicates, late ones) in four batches of shuffled arrival: after
    each batch the table is the oracle's over every change so far; a replay of the last batch commits nothing."""
    path = str(tmp_path / "customers")
    create(path, scd_type)
    table = target(path, scd_type)
    changes = feed(seed=36 + scd_type)
    oracle = type1 if scd_type == 1 else type2
    seen: list[Change] = []
    for index, batch in enumerate(split(changes, 4)):
        assert apply(spark, engine, table, [batch], first=index) == [True]
        seen += batch
        assert rows(path, scd_type) == oracle(seen), f"after batch {index}"
    version = table_version(path)
    assert apply(spark, engine, table, [split(changes, 4)[-1]], first=3) == [False]
    assert table_version(path) == version
    assert rows(path, scd_type) == oracle(changes)


@ENGINES
def test_a_delete_is_remembered_against_an_older_upsert(spark: Any, tmp_path: Path, engine: str) -> None:
    """Type 1: a key deleted, then an older upsert of it arrives late (it stays deleted), then a newer one (the key
    is recreated); a delete of a key the table never had is remembered too."""
    path = str(tmp_path / "customers")
    create(path, 1)
    table = target(path, 1)
    batches: list[list[Change]] = [
        [(1, "a", "free", 10, "u"), (2, "b", "free", 10, "u")],
        [(1, None, None, 20, "d"), (3, None, None, 50, "d")],
        [(1, "late", "pro", 15, "u"), (3, "older", "pro", 40, "u")],
        [(1, "again", "team", 30, "u"), (2, "b2", "pro", 5, "u")],
    ]
    apply(spark, engine, table, batches)
    assert rows(path, 1) == [(1, "again", "team", 30), (2, "b", "free", 10)]
    assert rows(path, 1) == type1([change for batch in batches for change in batch])
    stones = read_table(tombstones_path(path)).to_pylist()
    assert sorted((row["id"], row["_sluice_sequence"]) for row in stones) == [(1, 20), (3, 50)]


@ENGINES
def test_type_2_places_a_late_change_in_history(spark: Any, tmp_path: Path, engine: str) -> None:
    """A version history, then a change older than the current version (it becomes the version between its
    neighbours), a delete (it closes the current version) and an upsert after it (a new current version); the
    columns outside track_history_columns update a version in place."""
    path = str(tmp_path / "customers")
    create(path, 2)
    table = target(path, 2, track=("tier",))
    batches: list[list[Change]] = [
        [(1, "a", "free", 10, "u"), (1, "a", "pro", 30, "u")],
        [(1, "b", "team", 20, "u")],
        [(1, "renamed", "pro", 35, "u")],
        [(1, None, None, 40, "d")],
        [(1, "back", "free", 50, "u")],
    ]
    apply(spark, engine, table, batches)
    assert rows(path, 2) == [(1, "a", "free", 10, 10, 20), (1, "b", "team", 20, 20, 30),
                             (1, "renamed", "pro", 35, 30, 40), (1, "back", "free", 50, 50, None)]
    assert rows(path, 2) == type2([change for batch in batches for change in batch], tracked=(2,))


@ENGINES
def test_a_type_2_change_applied_again_keeps_the_in_place_update_after_it(spark: Any, tmp_path: Path,
                                                                         engine: str) -> None:
    """A version opened by one change and updated in place by a later one (a column outside
    track_history_columns); a backfill applies the opening change again, under its own query: the version keeps the
    later change's values."""
    path = str(tmp_path / "customers")
    create(path, 2)
    table = target(path, 2, track=("tier",))
    batches: list[list[Change]] = [[(1, "a", "free", 10, "u"), (2, "b", "pro", 10, "u")],
                                   [(1, "renamed", "free", 20, "u")]]
    apply(spark, engine, table, batches)
    expected = [(1, "renamed", "free", 20, 10, None), (2, "b", "pro", 10, 10, None)]
    assert rows(path, 2) == expected
    assert apply(spark, engine, table, batches[:1], query="backfill") == [True]
    assert rows(path, 2) == expected == type2([change for batch in batches for change in batch], tracked=(2,))
