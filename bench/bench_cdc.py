"""CDC benchmark: 100,000 changes (10% deletes, 10% older than the row they change) applied to a 1,000,000-row table.

Sides, on the jvm engine (delta-spark), each on a fresh copy of the same seeded table, best of the rounds:

- ``cdc``: Sluice's ``mode: cdc`` type 1 (``sluice_spark.write.cdc``): the newest change per key, deletes applied
  and remembered in the tombstone table, with the batch's transaction id.
- ``merge``: today's ``mode: merge`` on the same rows (a delete is just another upsert there).
- ``foreachbatch_merge``: the foreachBatch MERGE the Delta documentation shows for a change feed (the newest change
  per key, ``whenMatchedDelete`` / ``whenMatchedUpdateAll`` / ``whenNotMatchedInsertAll``), without the
  transaction id and without remembering deletes.
- Spark Declarative Pipelines' Auto CDC (``pyspark.pipelines.create_auto_cdc_flow``) is tried once with the
  ``spark-pipelines`` CLI on the same changes, its Spark Connect server given Sluice's jars, Delta's session
  extension and DeltaCatalog (``--conf``, :func:`sluice.operations.jars.spark_conf`) and the streaming table
  ``format="delta"``; when it cannot run here, the line says why, and ``cdc_vs_sdp`` is null. On pyspark 4.2 with
  delta-spark 4.4 it stops with AUTOCDC_TARGET_DOES_NOT_SUPPORT_MERGE, "the target table ... (format: delta) does
  not support row-level operations": Auto CDC writes through Spark's DataSource V2 row-level operations (a table
  that supports MERGE for Spark), and delta-spark's table does not offer them to Spark (Delta runs its MERGE as a
  command of its own). Without the jars the table is created as Parquet and the same error names that format.

The cdc table is checked against a plain-Python oracle. The last line is JSON with ``ratios`` and ``goals``.

    python bench/bench_cdc.py [--table-rows 1000000] [--changes 100000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake
from harness import best_of_rounds, local_spark
from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F

from sluice.constants import DeltaEngine, SinkMode
from sluice.model.sinks import CdcSpec
from sluice.operations.jars import spark_conf
from sluice.storage.delta import query
from sluice_spark.targets import TableTarget
from sluice_spark.write.tables import table_writer

GOALS = {"cdc_vs_sdp": 1.0, "cdc_vs_foreachbatch_merge": 1.0, "cdc_vs_merge": 1.2}
COLUMNS = (("id", "id"), ("name", "name"), ("tier", "tier"), ("seq", "seq"), ("op", "op"))
SEEDED_SEQ = 1_000


def seed(path: Path, rows: int) -> None:
    write_deltalake(str(path), pa.table({
        "id": pa.array(range(rows), pa.int64()), "name": pa.array([f"n{i}" for i in range(rows)]),
        "tier": pa.array(["free"] * rows), "seq": pa.array([SEEDED_SEQ] * rows, pa.int64()),
        "op": pa.array(["r"] * rows)}))


def changes(table_rows: int, count: int) -> list[tuple[Any, ...]]:
    """Changes of existing keys and a few new ones: a tenth deletes, a tenth older than the seeded rows."""
    rng = random.Random(36)
    made = []
    for index in range(count):
        key = rng.randrange(int(table_rows * 1.05))
        seq = SEEDED_SEQ - 1 - index if rng.random() < 0.1 else SEEDED_SEQ + 1 + index
        op = "d" if rng.random() < 0.1 else "u"
        made.append((key, None if op == "d" else f"c{index}", None if op == "d" else "pro", seq, op))
    return made


def oracle(table_rows: int, feed: list[tuple[Any, ...]]) -> tuple[int, int]:
    """Rows left and rows the changes wrote, applying them in sequence order to the seeded table."""
    state: dict[int, tuple[int, str]] = {}
    for key, _name, _tier, seq, op in sorted(feed, key=lambda change: (change[3], change[4] == "d")):
        before = state.get(key, (SEEDED_SEQ, "r") if key < table_rows else None)
        if before is None or seq >= before[0]:
            state[key] = (seq, op)
    left = table_rows + sum(1 for key, (_, op) in state.items() if key >= table_rows and op != "d") \
        - sum(1 for key, (_, op) in state.items() if key < table_rows and op == "d")
    written = sum(1 for _, (seq, op) in state.items() if op == "u" and seq > SEEDED_SEQ)
    return left, written


def foreachbatch_merge(rows: Any, path: str) -> None:
    """The Delta documentation's change-feed upsert in foreachBatch: the newest change per key, then one MERGE."""
    from delta.tables import DeltaTable

    latest = rows.withColumn("_r", F.row_number().over(Window.partitionBy("id").orderBy(F.col("seq").desc()))) \
        .where("_r = 1").drop("_r")
    (DeltaTable.forPath(rows.sparkSession, path).alias("t").merge(latest.alias("s"), "t.id = s.id")
     .whenMatchedDelete(condition="s.op = 'd' AND s.seq >= t.seq")
     .whenMatchedUpdateAll(condition="s.op != 'd' AND s.seq >= t.seq")
     .whenNotMatchedInsertAll(condition="s.op != 'd'").execute())


SDP_PIPELINE = textwrap.dedent('''
    from pyspark import pipelines as dp
    from pyspark.sql import SparkSession

    spark = SparkSession.active()

    @dp.temporary_view
    def changes():
        return spark.readStream.format("parquet").schema("id long, name string, tier string, seq long, op string") \\
            .load("{changes}")

    dp.create_streaming_table("customers", format="delta")
    dp.create_auto_cdc_flow(target="customers", source="changes", keys=["id"], sequence_by="seq",
                            apply_as_deletes="op = 'd'", except_column_list=["op"], stored_as_scd_type=1)
''')


def try_sdp(root: Path, changes_path: Path) -> tuple[float | None, str]:
    """Run the Auto CDC flow once with the spark-pipelines CLI: its seconds, or None and why it could not run."""
    project = root / "sdp"
    project.mkdir()
    (project / "pipeline.py").write_text(SDP_PIPELINE.format(changes=changes_path), encoding="utf-8")
    (project / "spark-pipeline.yml").write_text(json.dumps({
        "name": "bench_cdc", "storage": (project / "storage").as_uri(),
        "libraries": [{"glob": {"include": "pipeline.py"}}],
        "configuration": {"spark.sql.shuffle.partitions": "2"}}), encoding="utf-8")
    cli = Path(sys.executable).parent / "spark-pipelines"
    # The CLI's Spark Connect server is a spark-submit of its own: Delta's jars, extension and catalog go to it.
    delta = [arg for key, value in spark_conf().items() for arg in ("--conf", f"{key}={value}")]
    started = time.perf_counter()
    try:
        done = subprocess.run([str(cli), "run", "--spec", str(project / "spark-pipeline.yml"), *delta], cwd=project,
                              capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"spark-pipelines did not finish: {exc}"
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        (project / "spark-pipelines.log").write_text(done.stderr + done.stdout, encoding="utf-8")
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        # The error's own line (pyspark.errors...: [CODE] message), not the traceback's frames.
        errors = [line for line in lines if ("Exception" in line or "Error" in line) and ":" in line
                  and not line.startswith(("File ", "at ", "Traceback"))]
        return None, f"spark-pipelines run exited {done.returncode}: {(errors or lines or ['no output'])[-1][:500]}"
    return elapsed, "ran (its time includes the CLI's own Spark Connect server start)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    spark: SparkSession = local_spark()
    feed = changes(args.table_rows, args.changes)
    expected_left, _ = oracle(args.table_rows, feed)
    with tempfile.TemporaryDirectory(prefix="sluice-bench-cdc-") as folder:
        root = Path(folder)
        seed(root / "seeded", args.table_rows)
        rows = spark.createDataFrame(feed, "id long, name string, tier string, seq long, op string")
        rows.write.parquet(str(root / "changes"))
        rows = spark.read.parquet(str(root / "changes")).cache()
        rows.count()

        def run(side: str, round_index: int) -> float:
            path = root / f"{side}-{round_index}"
            shutil.copytree(root / "seeded", path)
            started = time.perf_counter()
            if side == "foreachbatch_merge":
                foreachbatch_merge(rows, str(path))
            else:
                cdc = CdcSpec(delete_when="op = 'd'", except_columns=()) if side == "cdc" else None
                target = TableTarget(0, str(path), COLUMNS, mode=SinkMode.CDC if cdc else SinkMode.MERGE,
                                     keys=("id",), sequence_by="seq", cdc=cdc)
                table_writer(DeltaEngine.JVM).write(rows, target, query_id="bench", batch_id=round_index,
                                                    metadata={"bench": side})
            elapsed = time.perf_counter() - started
            if side != "merge":  # what was timed did the work: the oracle's rows are left
                left = query(str(path), "SELECT count(*) AS n FROM t").column("n")[0].as_py()
                assert left == expected_left, f"{side}: {left} rows, the oracle leaves {expected_left}"
            shutil.rmtree(path)
            return elapsed

        best = best_of_rounds(("cdc", "merge", "foreachbatch_merge"), args.rounds, run)
        spark.stop()
        sdp_seconds, sdp_note = try_sdp(root, root / "changes")
    print(f"table {args.table_rows:,} rows, {args.changes:,} changes (10% deletes, 10% out of order), jvm engine")
    for side, seconds in best.items():
        print(f"{side}: best {seconds:.2f} s")
    print(f"Spark Declarative Pipelines Auto CDC: {sdp_note}" + (f", {sdp_seconds:.2f} s" if sdp_seconds else ""))
    ratios = {"cdc_vs_sdp": None if sdp_seconds is None else round(best["cdc"] / sdp_seconds, 3),
              "cdc_vs_foreachbatch_merge": round(best["cdc"] / best["foreachbatch_merge"], 3),
              "cdc_vs_merge": round(best["cdc"] / best["merge"], 3)}
    print(json.dumps({"ratios": ratios, "goals": GOALS, "seconds": {k: round(v, 2) for k, v in best.items()},
                      "sdp": sdp_note}))


if __name__ == "__main__":
    main()
