"""MERGE benchmark: what upserting a micro-batch costs against appending it, on the rs engine.

A Delta table of ``--table-rows`` rows keyed by id; each round writes a batch of ``--batch-rows`` rows, half of them
updates of existing ids and half new ones, through ``sluice_spark.write.tables.RsTableWriter``, the function every
foreachBatch sink calls: once as a MERGE (keys + sequence column, with the batch's transaction id), and, as the
baseline in the same run, once as an idempotent append of the same rows. The ratio is what a silver upsert pays
per batch over a bronze-style append.

    python bench/bench_merge.py [--table-rows 1000000] [--batch-rows 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sluice.constants import DeltaEngine, SinkMode
from sluice_spark.session import configure_sluice, register_data_sources
from sluice_spark.targets import TableTarget
from sluice_spark.write.tables import table_writer

COLUMNS = (("id", "id"), ("plan", "plan"), ("updated_at", "updated_at"))


def seed(path: Path, rows: int) -> None:
    ids = pa.array(range(rows), pa.int64())
    write_deltalake(str(path), pa.table({
        "id": ids, "plan": pa.array(["free"] * rows),
        "updated_at": pa.array([0] * rows, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
    }))


def batch(spark: SparkSession, table_rows: int, batch_rows: int, round_: int):  # type: ignore[no-untyped-def]
    """Half updates of existing ids, half new ids, all newer than what the table holds."""
    half = batch_rows // 2
    return spark.range(batch_rows).select(
        F.when(F.col("id") < half, F.col("id") * 7 % table_rows)
        .otherwise(table_rows + round_ * batch_rows + F.col("id")).alias("id"),
        F.lit("paid").alias("plan"),
        F.timestamp_seconds(F.lit(1_800_000_000 + round_)).alias("updated_at"),
    ).cache()


def timed(spark: SparkSession, root: Path, mode: str, table_rows: int, batch_rows: int, rounds: int) -> list[float]:
    path = root / mode
    seed(path, table_rows)
    merge = mode == "merge"
    target = TableTarget(0, str(path), COLUMNS, mode=SinkMode.MERGE if merge else SinkMode.APPEND,
                         keys=("id",) if merge else (), sequence_by="updated_at" if merge else None)
    seconds = []
    for round_ in range(rounds):
        rows = batch(spark, table_rows, batch_rows, round_)
        rows.count()
        started = time.perf_counter()
        table_writer(DeltaEngine.RS).write(rows, target, query_id="bench", batch_id=round_,
                                           metadata={"bench": mode})
        seconds.append(time.perf_counter() - started)
        rows.unpersist()
    # What was timed did the work: every round's new ids inserted (and, for the merge, half its rows updated).
    from sluice.storage.delta import query

    counts = query(str(path), "SELECT count(*) AS n, sum(CASE WHEN plan = 'paid' THEN 1 ELSE 0 END) AS paid FROM t")
    n, paid = counts.column("n")[0].as_py(), counts.column("paid")[0].as_py()
    half = batch_rows // 2
    expected = (table_rows + rounds * half, rounds * half + len({i * 7 % table_rows for i in range(half)})) \
        if mode == "merge" else (table_rows + rounds * batch_rows, rounds * batch_rows)
    assert (n, paid) == expected, f"{mode}: table has {(n, paid)} rows/paid, expected {expected}"
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-rows", type=int, default=1_000_000)
    parser.add_argument("--batch-rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spark = (configure_sluice(SparkSession.builder).master("local[2]").config("spark.ui.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register_data_sources(spark)
    with tempfile.TemporaryDirectory(prefix="sluice-bench-merge-") as folder:
        append = timed(spark, Path(folder), "append", args.table_rows, args.batch_rows, args.rounds)
        merge = timed(spark, Path(folder), "merge", args.table_rows, args.batch_rows, args.rounds)
    spark.stop()
    baseline, upsert = statistics.median(append), statistics.median(merge)
    print(f"table {args.table_rows:,} rows, batches of {args.batch_rows:,} (half updates), {args.rounds} rounds")
    print(f"append (baseline): median {baseline:.2f} s  {[round(s, 2) for s in append]}")
    print(f"merge:             median {upsert:.2f} s  {[round(s, 2) for s in merge]}")
    print(f"ratio merge/append: {upsert / baseline:.2f}")


if __name__ == "__main__":
    main()
