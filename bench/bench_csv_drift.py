"""CSV drift benchmark: a bronze stream over CSV files with a header under ``rescue`` (the default) against ``none``.

Both sides are the whole stream as it runs in production (Sluice's runner, the rs Delta engine, the dead-letter
table, the run summary) over the same CSV exports, whose headers all name the declared columns in their order (the
common case, which both sides can read):

- ``none``: Spark's CSV reader with the declared schema, checking each file's header against it;
- ``rescue``: each file's columns found by its header (:mod:`sluice_spark.drift.csv`): as every header here is the
  declared one, Spark's typed reader checks the headers and types the records (``conform_checked``); a record it
  could not type would be split and rescued, and a file with another header would plan the stream again by header.

Rounds alternate the order and the best time of each side is kept, because these machines are shared and noisy.
The goal (Sluice's own: the issue names none) is rescue / none <= 1.3. The last line is the result as JSON.

    python bench/bench_csv_drift.py --rows 1000000
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

from harness import compare_sides, run_files_stream
from pyspark.sql import SparkSession

SCHEMA = {
    "order_id": "string not null",
    "user_id": "string",
    "amount": "decimal(12,2)",
    "currency": "string",
    "status": "string",
    "ordered_at": "timestamp",
}
GOAL = 1.3


def write_exports(folder: Path, rows: int, files: int) -> None:
    generator = random.Random(5)
    folder.mkdir(parents=True)
    per_file = rows // files
    for index in range(files):
        lines = [",".join(SCHEMA)]
        for _ in range(per_file):
            lines.append(",".join([
                str(uuid.UUID(int=generator.getrandbits(128))), f"u{generator.randrange(10_000):05d}",
                f"{generator.uniform(1, 500):.2f}", generator.choice(("EUR", "USD", "GBP")),
                generator.choice(("paid", "refunded", '"on hold, asked"')),
                f"2026-11-{generator.randrange(1, 8):02d}T{generator.randrange(24):02d}:00:00Z"]))
        (folder / f"orders-{index:04d}.csv").write_text("\n".join(lines) + "\n")


def run(spark: SparkSession, landing: Path, out: Path, policy: str) -> tuple[float, dict[str, Any]]:
    return run_files_stream(spark, landing, out, schema=SCHEMA, file_format="csv", policy=policy,
                            options={"header": True})


def check(counts: dict[str, dict[str, Any]], rows: int) -> None:
    for side, seen in counts.items():
        if seen["dead_letter"] or seen["written"] != rows or seen["rescued"]:
            raise SystemExit(f"the {side} side lost, rescued or dead-lettered rows: {seen}")


if __name__ == "__main__":
    compare_sides(__doc__, "sluice-bench-csv-drift-", ("none", "rescue"), write_exports, run, check, GOAL)
