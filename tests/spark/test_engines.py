"""The two Delta engines on one table: what one writes, the other appends to, merges into and reads, the stream's
dead-letter and fan-out tables included. Checked against the batch oracle over the same files, read back with
delta-rs and with delta-spark alike."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.constants import DeltaEngine, SinkMode
from sluice.storage.delta import read_table
from sluice_spark.runner import run_streams
from sluice_spark.targets import TableTarget
from sluice_spark.write.tables import table_writer
from tests.helpers import events_stream, expected_events, needs_jvm_jars, roots_in, table_rows, write_catalog

pytestmark = [pytest.mark.spark, needs_jvm_jars]

NOW = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)
COLUMNS = ["event_id", "event_type", "user_id", "amount", "event_date"]
DIRECTIONS = pytest.mark.parametrize(("first", "second"), [("rs", "jvm"), ("jvm", "rs")])


def by_spark(spark: Any, path: str, columns: list[str]) -> list[tuple[Any, ...]]:
    """The table as delta-spark reads it, in the oracle's shape."""
    rows = spark.read.format("delta").load(path).select(*columns).collect()
    return sorted((*row[:-1], row[-1].isoformat()) if columns == COLUMNS else tuple(row) for row in rows)


@DIRECTIONS
def test_a_stream_goes_on_with_the_other_engine_on_the_same_tables(spark: Any, tmp_path: Path, first: str,
                                                                   second: str) -> None:
    """One checkpoint, one set of tables (bronze, its fan-out of purchases, the dead letters): the first run on one
    engine, the next on the other. Both engines record a batch under the same transaction id (query id, batch id),
    so the second neither repeats nor skips a batch."""
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=51, malformed_rate=0.1)
    definition = events_stream(fan_out=[{"path": "silver/purchases", "where": "event_type = 'purchase'"}])
    for minute, engine in enumerate((first, second)):
        producer.events_file(lines=60, now=NOW + dt.timedelta(minutes=minute))
        definition["sink"]["engine"] = engine
        catalog = load_catalog(write_catalog(tmp_path, definition))
        [run] = run_streams(spark, catalog, ["events"], roots).streams
        assert run.status == "succeeded", run.error
        assert run.batches == 1, f"{engine}: one new file, one batch"
    stream = catalog.get("events")
    good, bad = expected_events(Path(roots.landing) / "events")
    rows = [(*row[:4], row[4].isoformat()) for row in table_rows(stream.sink_path(roots), COLUMNS)]
    assert rows == good
    assert by_spark(spark, stream.sink_path(roots), COLUMNS) == good
    [fan_out] = [table.path for table in stream.tables(roots) if table.role.value == "fan_out"]
    purchases = [(*row[:4], row[4].isoformat()) for row in table_rows(fan_out, COLUMNS)]
    assert purchases == [row for row in good if row[1] == "purchase"] and purchases
    assert by_spark(spark, fan_out, COLUMNS) == purchases
    assert read_table(stream.dead_letter_table_path(roots)).num_rows == bad
    assert spark.read.format("delta").load(stream.dead_letter_table_path(roots)).count() == bad


@DIRECTIONS
def test_a_merge_by_one_engine_into_the_others_table(spark: Any, tmp_path: Path, first: str, second: str) -> None:
    """Ten rows written by one engine (delta-rs or delta-spark); a batch of updates (a newer and an older version
    of existing keys) and new keys merged by the other; a replay of that batch changes nothing. The oracle is
    computed in Python."""
    path = str(tmp_path / "plans")
    columns = (("id", "id"), ("plan", "plan"), ("updated_at", "updated_at"))
    schema = "id long, plan string, updated_at timestamp"
    at = [dt.datetime(2026, 11, 22, hour, tzinfo=dt.timezone.utc) for hour in range(4)]
    seeded = [(key, "free", at[1]) for key in range(10)]
    if first == "rs":
        import pyarrow as pa
        from deltalake import write_deltalake

        names = ("id", "plan", "updated_at")
        write_deltalake(path, pa.Table.from_pylist([dict(zip(names, row, strict=True)) for row in seeded]))
    else:
        spark.createDataFrame(seeded, schema).write.format("delta").save(path)
    batch = [(2, "paid", at[2]), (3, "stale", at[0]), (10, "paid", at[2]), (11, "trial", at[3])]
    merge = TableTarget(0, path, columns, mode=SinkMode.MERGE, keys=("id",), sequence_by="updated_at")
    for _ in range(2):  # the second is a replay of the same batch
        table_writer(DeltaEngine(second)).write(spark.createDataFrame(batch, schema), merge, query_id="merge",
                                                batch_id=0, metadata={})
    oracle = {key: (plan, when) for key, plan, when in seeded}
    for key, plan, when in batch:
        if key not in oracle or when > oracle[key][1]:
            oracle[key] = (plan, when)
    expected = sorted((key, plan) for key, (plan, _) in oracle.items())
    assert sorted((row["id"], row["plan"]) for row in read_table(path, ["id", "plan"]).to_pylist()) == expected
    assert by_spark(spark, path, ["id", "plan"]) == expected
