"""The two Delta engines on the same data in the same run: Sluice's rs engine (delta-rs, the pip-only path) against
delta-spark's own writer (the jvm engine, with the jars `make venv` resolved).

- append: ``--rows`` JSON rows in ``--files`` files (bench_ingest's events) ingested by a bronze stream, once per
  engine and round; the goal is ``rs_vs_jvm_append`` <= 1.0.
- merge: ``--merge-rows`` rows, half updates of existing ids and half new ones, merged into a table of
  ``--table-rows`` rows through each engine's idempotent writer (``sluice_spark.write.tables.table_writer``), the call
  every foreachBatch sink makes; ``rs_vs_jvm_merge`` is reported (its goal is null: the issue asks for the figure).

Every side is checked: the same rows in, the same table out. The last line is JSON with ``ratios`` and ``goals``.

    python bench/bench_engines.py [--rows 1000000] [--files 20] [--table-rows 1000000] [--merge-rows 100000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from bench_ingest import write_events
from bench_merge import COLUMNS, batch, seed
from harness import best_of_rounds, local_spark, run_catalog

from sluice.catalog import parse_catalog
from sluice.cli.demo_producer import EVENT_SCHEMA
from sluice.constants import DeltaEngine, SinkMode
from sluice.paths import Roots
from sluice.storage.delta import query
from sluice_spark.targets import TableTarget
from sluice_spark.write.tables import table_writer

ENGINES = ("jvm", "rs")


def append_run(spark, landing: Path, out: Path, engine: str) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    catalog = parse_catalog({"version": 1, "streams": [{
        "name": "bench_events",
        "source": {"type": "files", "format": "json", "path": str(landing), "schema": EVENT_SCHEMA},
        "transform": "bronze_events",
        "sink": {"path": str(out / "table"), "partition_by": ["event_date"], "engine": engine},
        "checkpoint": str(out / "checkpoint"),
        "schedule": "@hourly",
    }]})
    elapsed, result = run_catalog(spark, catalog, Roots(landing=str(landing), lake=str(out), checkpoints=str(out)))
    return elapsed, result.output_rows


def merge_run(spark, out: Path, engine: str, table_rows: int, merge_rows: int) -> float:  # type: ignore[no-untyped-def]
    seed(out, table_rows)
    target = TableTarget(0, str(out), COLUMNS, mode=SinkMode.MERGE, keys=("id",), sequence_by="updated_at")
    rows = batch(spark, table_rows, merge_rows, 0)
    rows.count()
    started = time.perf_counter()
    table_writer(DeltaEngine(engine)).write(rows, target, query_id="bench", batch_id=0, metadata={"bench": engine})
    elapsed = time.perf_counter() - started
    rows.unpersist()
    counts = query(str(out), "SELECT count(*) AS n, sum(CASE WHEN plan = 'paid' THEN 1 ELSE 0 END) AS paid FROM t")
    half = merge_rows // 2
    found = (counts.column("n")[0].as_py(), counts.column("paid")[0].as_py())
    wanted = (table_rows + half, half + len({i * 7 % table_rows for i in range(half)}))
    assert found == wanted, f"{engine}: the merged table has {found} rows/updated, expected {wanted}"
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--table-rows", type=int, default=1_000_000)
    parser.add_argument("--merge-rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-engines-"))
    try:
        landing = work / "landing"
        write_events(landing, args.rows, args.files)
        spark = local_spark()
        written: dict[str, int] = {}
        for engine in ENGINES:  # warm the JIT, the Python workers and delta-spark's classes
            append_run(spark, landing, work / f"warmup-{engine}", engine)
            merge_run(spark, work / f"warmup-merge-{engine}", engine, 10_000, 1_000)

        def append(engine: str, round_index: int) -> float:
            elapsed, written[engine] = append_run(spark, landing, work / f"append-{engine}-{round_index}", engine)
            return elapsed

        appended = best_of_rounds(ENGINES, args.rounds, append)
        assert written["rs"] == written["jvm"] == args.rows // args.files * args.files, written
        merged = best_of_rounds(ENGINES, args.rounds, lambda engine, round_index: merge_run(
            spark, work / f"merge-{engine}-{round_index}", engine, args.table_rows, args.merge_rows))
        spark.stop()
        ratios = {"rs_vs_jvm_append": round(appended["rs"] / appended["jvm"], 3),
                  "rs_vs_jvm_merge": round(merged["rs"] / merged["jvm"], 3)}
        print(json.dumps({"rows": args.rows, "table_rows": args.table_rows, "merge_rows": args.merge_rows,
                          "seconds": {"append": {k: round(v, 2) for k, v in appended.items()},
                                      "merge": {k: round(v, 2) for k, v in merged.items()}},
                          "ratios": ratios, "goals": {"rs_vs_jvm_append": 1.0, "rs_vs_jvm_merge": None}}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
