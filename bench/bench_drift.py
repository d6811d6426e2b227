"""Drift benchmark: a bronze stream under the ``rescue`` policy (the default) against the same stream under ``none``.

Both sides are the whole stream as it runs in production (Sluice's runner, the rs Delta engine, the dead-letter
table, the run summary) over the same JSON files of nested records (an ``actor`` struct, an array of ``items``
structs): about 2% carry a field the schema does not declare (top-level or nested) and 1% a value of the wrong type.

- ``none``: Spark's JSON reader with the declared schema; the misfits are dead letters, the new fields are not read;
- ``rescue``: each record read as text and parsed twice (the declared schema, and a VARIANT that keeps every field),
  its new fields and misfits kept in ``_rescued_data``.

Rounds alternate the order and the best time of each side is kept, because these machines are shared and noisy.
The goal (Sluice's own: the issue names none) is rescue / none <= 1.3. The last line is the result as JSON.

    python bench/bench_drift.py --rows 1000000
"""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

from harness import compare_sides, run_files_stream
from pyspark.sql import SparkSession

SCHEMA = {
    "event_id": "string not null",
    "event_type": "string",
    "actor": "struct<id: bigint, login: string>",
    "items": "array<struct<sku: string, quantity: int>>",
    "amount": "decimal(12,2)",
    "event_time": "timestamp",
}
GOAL = 1.3


def write_events(folder: Path, rows: int, files: int) -> None:
    generator = random.Random(2)
    folder.mkdir(parents=True)
    per_file = rows // files
    for index in range(files):
        lines = []
        for _ in range(per_file):
            roll = generator.random()
            event: dict[str, Any] = {
                "event_id": str(uuid.UUID(int=generator.getrandbits(128))),
                "event_type": generator.choice(("click", "purchase")),
                "actor": {"id": generator.randrange(10_000), "login": f"u{generator.randrange(10_000):05d}"},
                "items": [{"sku": f"s{generator.randrange(500)}", "quantity": generator.randrange(1, 4)}
                          for _ in range(generator.randrange(3))],
                "amount": round(generator.uniform(1, 500), 2),
                "event_time": f"2026-11-{generator.randrange(1, 8):02d}T{generator.randrange(24):02d}:00:00Z",
            }
            if roll < 0.01:
                event["coupon"] = "X1"
            elif roll < 0.02:
                event["actor"]["site_admin"] = True
            elif roll < 0.03:
                event["amount"] = "n/a"
            lines.append(json.dumps(event))
        (folder / f"events-{index:04d}.json").write_text("\n".join(lines) + "\n")


def run(spark: SparkSession, landing: Path, out: Path, policy: str, file_format: str = "json"
        ) -> tuple[float, dict[str, Any]]:
    return run_files_stream(spark, landing, out, schema=SCHEMA, file_format=file_format, policy=policy)


def check(counts: dict[str, dict[str, Any]], rows: int) -> None:
    rescue = counts["rescue"]
    if rescue["dead_letter"] or not rescue["rescued"] or rescue["written"] != rows:
        raise SystemExit(f"the rescue side lost or dead-lettered rows: {rescue}")


if __name__ == "__main__":
    compare_sides(__doc__, "sluice-bench-drift-", ("none", "rescue"), write_events, run, check, GOAL)
