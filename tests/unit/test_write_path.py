"""The rule that makes Sluice exactly once exists once: only ``sluice.storage.delta`` reads a table's transaction
version, and only the writers ask ``holds_batch`` whether a batch is a replay."""

from __future__ import annotations

import ast
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
PACKAGES = [PROJECT / "include", PROJECT / "spark_apps", PROJECT / "plugins", PROJECT / "dags"]


def uses_of(name: str) -> dict[str, int]:
    """Every module that references ``name`` as an attribute or a name, with how often."""
    found: dict[str, int] = {}
    for package in PACKAGES:
        for path in package.rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            count = sum(1 for node in ast.walk(tree)
                        if (isinstance(node, ast.Attribute) and node.attr == name)
                        or (isinstance(node, ast.Name) and node.id == name))
            if count:
                found[str(path.relative_to(PROJECT))] = count
    return found


def test_only_sluice_delta_reads_a_tables_transaction_version() -> None:
    assert uses_of("transaction_version") == {"include/sluice/storage/delta.py": 1}


def test_only_the_writers_ask_whether_a_batch_is_a_replay() -> None:
    # The redrive writes its own two commits (an append and a MERGE of marks), each once, by the same guard. The
    # table-format seam asks it for every format it commits to (sluice.storage.tableformat, and Iceberg's upsert).
    assert set(uses_of("holds_batch")) == {"include/sluice/storage/tableformat.py",
                                           "include/sluice/storage/iceberg.py",
                                           "spark_apps/sluice_spark/write/tables.py",
                                           "spark_apps/sluice_spark/write/cdc.py",
                                           "spark_apps/sluice_spark/rs/sink.py",
                                           "spark_apps/sluice_spark/redrive.py"}


def test_every_foreach_batch_goes_through_the_router() -> None:
    assert set(uses_of("foreachBatch")) <= {"spark_apps/sluice_spark/kinds/delta.py",
                                            "spark_apps/sluice_spark/kinds/kafka.py",
                                            "spark_apps/sluice_spark/kinds/iceberg.py",
                                            "spark_apps/sluice_spark/backfill.py"}
    assert set(uses_of("BatchRouter")) >= {"spark_apps/sluice_spark/kinds/delta.py",
                                           "spark_apps/sluice_spark/kinds/kafka.py",
                                           "spark_apps/sluice_spark/kinds/iceberg.py",
                                           "spark_apps/sluice_spark/backfill.py"}
