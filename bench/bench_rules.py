"""Rules benchmark: a bronze stream with four expectations and a SQL transform against the same stream without them.

Both sides are the whole stream as it runs in production (Sluice's runner, the rs Delta engine, the dead-letter
table, the run summary) over the same JSON files, both under ``schema_evolution: none`` so that the ratio is the
rules' own cost (``bench_drift.py`` measures the rescue policy's):

- ``none``: the declared schema, no transform, no expectations;
- ``rules``: the SQL transform ``SELECT *, lower(event_type) AS kind, amount * 100 AS cents FROM source`` and the
  four rules of the catalog's example (quarantine, warn, drop, fail), with data that breaks the first three.

Rounds alternate the order and the best time of each side is kept, because these machines are shared and noisy.
The goal is rules / none <= 1.10. The last line is the result as JSON.

    python bench/bench_rules.py --rows 1000000
"""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

from harness import compare_sides, run_catalog
from pyspark.sql import SparkSession

from sluice.catalog import Catalog, parse_catalog
from sluice.paths import Roots

SCHEMA = {
    "event_id": "string not null",
    "event_type": "string not null",
    "user_id": "string",
    "amount": "decimal(12,2)",
    "currency": "string",
    "event_time": "timestamp not null",
}
TRANSFORM = "SELECT *, lower(event_type) AS kind, amount * 100 AS cents FROM source"
EXPECTATIONS = {
    "valid_amount": {"check": "amount IS NULL OR amount >= 0", "on_violation": "quarantine"},
    "known_currency": {"check": "currency IN ('EUR', 'USD', 'GBP')", "on_violation": "warn"},
    "not_from_the_future": {"check": "event_time <= current_timestamp() + INTERVAL 1 HOUR", "on_violation": "drop"},
    "has_user": {"check": "user_id IS NOT NULL", "on_violation": "fail"},
}


def write_events(folder: Path, rows: int, files: int) -> None:
    """Purchases and clicks; about 1% with a negative amount, 2% in an unknown currency, 1% from the future."""
    generator = random.Random(1)
    folder.mkdir(parents=True)
    per_file = rows // files
    for index in range(files):
        lines = []
        for _ in range(per_file):
            roll = generator.random()
            kind = generator.choice(("Click", "click", "Purchase"))
            event = {
                "event_id": str(uuid.UUID(int=generator.getrandbits(128))),
                "event_type": kind,
                "user_id": f"u{generator.randrange(10_000):05d}",
                "amount": round(generator.uniform(1, 500), 2) * (-1 if roll < 0.01 else 1),
                "currency": "XTS" if 0.01 <= roll < 0.03 else generator.choice(("EUR", "USD", "GBP", None)),
                "event_time": ("2099-01-01T00:00:00Z" if 0.03 <= roll < 0.04 else
                               f"2026-11-{generator.randrange(1, 8):02d}T{generator.randrange(24):02d}:00:00Z"),
            }
            lines.append(json.dumps(event))
        (folder / f"events-{index:04d}.json").write_text("\n".join(lines) + "\n")


def bench_catalog(landing: Path, out: Path, *, rules: bool) -> tuple[Catalog, Roots]:
    stream: dict[str, Any] = {
        "name": "bench_events",
        "source": {"type": "files", "format": "json", "path": str(landing), "schema": SCHEMA,
                   "schema_evolution": "none"},
        "sink": {"path": str(out / "table"), "engine": "rs"},
        "checkpoint": str(out / "checkpoint"),
        "schedule": "@hourly",
    }
    if rules:
        stream.update(transform={"sql": TRANSFORM}, expectations=EXPECTATIONS)
    catalog = parse_catalog({"version": 1, "streams": [stream]})
    return catalog, Roots(landing=str(landing), lake=str(out), checkpoints=str(out))


def run(spark: SparkSession, landing: Path, out: Path, side: str) -> tuple[float, dict[str, Any]]:
    catalog, roots = bench_catalog(landing, out, rules=side == "rules")
    elapsed, stream = run_catalog(spark, catalog, roots)
    return elapsed, {"input": stream.input_rows, "written": stream.output_rows, "dropped": stream.dropped_rows,
                     "dead_letter": stream.dead_letter_rows,
                     "violated": {rule["rule"]: rule["violated"] for rule in stream.expectations}}


def check(counts: dict[str, dict[str, Any]], rows: int) -> None:
    rules = counts["rules"]
    if rules["input"] != rules["written"] + rules["dropped"] + rules["dead_letter"] or not rules["dropped"]:
        raise SystemExit(f"the rules side does not reconcile or dropped nothing: {rules}")


if __name__ == "__main__":
    compare_sides(__doc__, "sluice-bench-rules-", ("none", "rules"), write_events, run, check, 1.1)
