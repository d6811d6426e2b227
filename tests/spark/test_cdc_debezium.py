"""Debezium change events through a real Kafka broker (and a landing folder) into a cdc table, on both engines:
snapshot reads, creates, updates, deletes and tombstones, some in Kafka Connect's schema/payload wrapping, arriving
out of order across two runs; checked against the oracle of tests/spark/test_cdc.py. A truncate stops the run with
its message unless the catalog lets it be skipped."""

from __future__ import annotations

import json
import os
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import parse_catalog
from sluice.connections.kafka import env_name
from sluice.constants import CDC_END_COLUMN, CDC_START_COLUMN
from tests.helpers import needs_jvm_jars, roots_in, table_rows
from tests.kafka_data import new_topic
from tests.spark.test_cdc import type1, type2

pytestmark = [pytest.mark.spark, needs_jvm_jars]

TS = 1_790_000_000_000
Event = tuple[int, str, dict[str, Any] | None, int, int]  # id, op, row, ts_ms, lsn


def sequence(ts_ms: int, lsn: int) -> Decimal:
    return Decimal(ts_ms * 10**20 + lsn)


def events(seed: int, keys: int = 8, count: int = 60) -> list[Event]:
    """A change history in commit order: snapshot reads first, then creates, updates and deletes."""
    rng = random.Random(seed)
    made: list[Event] = [(key, "r", {"id": key, "name": f"s{key}", "tier": "free"}, TS, key) for key in range(keys)]
    live = set(range(keys))
    for index in range(count):
        key, ts_ms, lsn = rng.randrange(keys + 2), TS + 1000 + index // 3, 100 + index  # three events a millisecond
        if key in live and rng.random() < 0.3:
            made.append((key, "d", {"id": key, "name": None, "tier": None}, ts_ms, lsn))
            live.discard(key)
        else:
            made.append((key, "u" if key in live else "c", {"id": key, "name": f"n{index}",
                                                            "tier": rng.choice(["free", "pro"])}, ts_ms, lsn))
            live.add(key)
    return made


def envelope(event: Event, *, wrapped: bool) -> bytes:
    _, op, row, ts_ms, lsn = event
    body = {"before": row if op == "d" else None, "after": None if op == "d" else row, "op": op, "ts_ms": ts_ms,
            "source": {"connector": "postgresql", "lsn": lsn, "table": "customers"}}
    return json.dumps({"schema": {"type": "struct"}, "payload": body} if wrapped else body).encode()


def changes(history: list[Event]) -> list[tuple[Any, ...]]:
    """The oracle's changes: (id, name, tier, sequence, op)."""
    return [(key, None if op == "d" else row["name"], None if op == "d" else row["tier"],  # type: ignore[index]
             sequence(ts_ms, lsn), "d" if op == "d" else "u") for key, op, row, ts_ms, lsn in history]


def stream(topic_or_path: str, engine: str, scd_type: int, *, kafka: bool = True, **source: Any) -> dict[str, Any]:
    where = ({"type": "kafka", "options": {"subscribe": topic_or_path, "startingOffsets": "earliest"}} if kafka
             else {"type": "files", "format": "json", "path": topic_or_path})
    return {"name": "customers", "schedule": "@hourly",
            "source": {**where, "envelope": "debezium", "envelope_tiebreak": "source.lsn",
                       "schema": {"id": "bigint not null", "name": "string", "tier": "string"}, **source},
            "sink": {"path": "silver/customers", "mode": "cdc", "engine": engine, "keys": ["id"],
                     "sequence_by": "__sequence", "cdc": {"scd_type": scd_type, "except_columns": ["__op", "__ts_ms"]}}}


def produce(kafka: Any, topic: str, records: list[tuple[int, bytes | None]]) -> None:
    from confluent_kafka import Producer

    producer = Producer(kafka.client_config())
    for key, value in records:
        producer.produce(topic, value=value, key=json.dumps({"id": key}).encode())
    assert producer.flush(30) == 0


def table(path: str, scd_type: int) -> list[tuple[Any, ...]]:
    names = ["id", "name", "tier", "__sequence", *((CDC_START_COLUMN, CDC_END_COLUMN) if scd_type == 2 else ())]
    return sorted(table_rows(path, names), key=lambda row: (row[0], row[4] if scd_type == 2 else 0))


@pytest.mark.parametrize(("engine", "scd_type"), [("rs", 1), ("jvm", 1), ("jvm", 2)])
def test_a_debezium_topic_gives_the_oracles_table(spark: Any, tmp_path: Path, kafka: Any, engine: str,
                                                  scd_type: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_spark.runner import run_streams

    monkeypatch.setenv(env_name("sluice_kafka"), json.dumps(kafka.spark_options()))
    topic = new_topic(kafka)
    history = events(seed=7 + scd_type)
    arrival = list(history)
    random.Random(1).shuffle(arrival)  # out of order, across the two runs
    records: list[tuple[int, bytes | None]] = [(e[0], envelope(e, wrapped=i % 2 == 0)) for i, e in enumerate(arrival)]
    # Debezium follows a delete with a tombstone of its key: a delete of the key as of the tombstone's time, which
    # is later than any change here; one key is deleted so, after both runs.
    half = len(records) // 2
    catalog = parse_catalog({"version": 1, "streams": [stream(topic, engine, scd_type)]})
    roots = roots_in(tmp_path)
    produce(kafka, topic, records[:half])
    [first] = run_streams(spark, catalog, ["customers"], roots).streams
    assert first.status == "succeeded", first.error
    produce(kafka, topic, [*records[half:], (3, None)])
    [second] = run_streams(spark, catalog, ["customers"], roots).streams
    assert second.status == "succeeded", second.error
    assert second.input_rows == len(records) - half + 1 and second.dead_letter_rows == 0
    # The run log's counts, from the engine's MERGE metrics: the first run inserted the keys it saw.
    assert first.table_changes is not None and first.table_changes["inserted"] > 0
    assert second.table_changes is not None and {"inserted", "updated", "deleted"} <= set(second.table_changes)
    if scd_type == 2:
        assert second.table_changes["versions_closed"] > 0
    path = catalog.get("customers").sink_path(roots)
    rows = table(path, scd_type)
    tombstoned = [row for row in rows if row[0] == 3 and (scd_type == 1 or row[5] is None)]
    assert tombstoned == [], "the tombstone deleted key 3"
    expected = (type1 if scd_type == 1 else type2)(changes(history))
    expected = [row for row in expected if not (row[0] == 3 and (scd_type == 1 or row[5] is None))]
    if scd_type == 2:  # key 3's current version (if any) was closed by the tombstone, at a time the test can't know
        rows = [row for row in rows if not (row[0] == 3 and row[5] is not None and row[5] > sequence(TS + 10**6, 0))]
        expected = [row for row in expected if row[0] != 3 or row[5] is not None]
    assert rows == expected


def test_a_truncate_stops_the_run_unless_the_catalog_skips_it(spark: Any, tmp_path: Path) -> None:
    from sluice_spark.runner import run_streams

    roots = roots_in(tmp_path)
    landing = Path(roots.landing) / "customers"
    landing.mkdir(parents=True)
    history: list[Event] = [(1, "c", {"id": 1, "name": "a", "tier": "free"}, TS, 1),
                            (2, "c", {"id": 2, "name": "b", "tier": "free"}, TS, 2),
                            (1, "d", {"id": 1, "name": "a", "tier": "free"}, TS + 5, 3)]
    truncate = json.dumps({"before": None, "after": None, "op": "t", "ts_ms": TS + 9, "source": {"lsn": 4}})
    lines = [envelope(event, wrapped=False).decode() for event in history] + [truncate]
    (landing / "changes.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    refusing = parse_catalog({"version": 1, "streams": [stream("customers", "rs", 1, kafka=False)]})
    [run] = run_streams(spark, refusing, ["customers"], roots).streams
    assert run.status == "failed" and "envelope_truncate: ignore" in (run.error or "")
    path = refusing.get("customers").sink_path(roots)
    assert table(path, 1) == []
    skipping = parse_catalog({"version": 1, "streams": [
        stream("customers", "rs", 1, kafka=False, envelope_truncate="ignore")]})
    [run] = run_streams(spark, skipping, ["customers"], roots).streams
    assert run.status == "succeeded", run.error
    assert table(path, 1) == [(2, "b", "free", sequence(TS, 2))]


@pytest.mark.parametrize("engine", ["rs", "jvm"])
def test_sigkill_between_the_table_and_its_tombstones_then_rerun(spark: Any, tmp_path: Path, engine: str) -> None:
    """Three files of Debezium events, one batch each; the application is SIGKILLed in batch 1 after the table's
    commit and before the tombstones' (the crash point between_commits is reached there first). The health gate
    sees what any stopped run leaves, the one uncommitted batch (a WARN: runs go on), with the tombstones a batch
    behind the table: no health code of their own is needed, because the rerun replays batch 1, whose table commit
    is skipped and whose tombstones are committed, and the table is the oracle's. Only the killed run needs an
    application of its own: the rerun is the session's, through the runner's own code."""
    import yaml

    from sluice.catalog import load_catalog
    from sluice.constants import FaultCode, Severity
    from sluice.operations.health import check_stream
    from sluice.storage.checkpoint import read_query_id
    from sluice.storage.delta import recorded_batch
    from sluice_spark.runner import run_streams
    from sluice_spark.write.cdc import tombstones_path
    from tests.spark.test_crash_recovery import DRIVER, kill_application, submit, wait_for

    roots = roots_in(tmp_path)
    landing = Path(roots.landing) / "customers"
    landing.mkdir(parents=True)
    history = events(seed=11, keys=6, count=45)
    arrival = list(history)
    random.Random(2).shuffle(arrival)
    parts = [arrival[index * len(arrival) // 3:(index + 1) * len(arrival) // 3] for index in range(3)]
    assert any(event[1] == "d" for event in parts[1]), "batch 1 deletes keys: it has tombstones to commit"
    for index, part in enumerate(parts):
        (landing / f"changes-{index}.json").write_text(
            "\n".join(envelope(event, wrapped=False).decode() for event in part) + "\n", encoding="utf-8")
        os.utime(landing / f"changes-{index}.json", (1_800_000_000 + index, 1_800_000_000 + index))
    definition = stream("customers", engine, 1, kafka=False)
    definition["trigger"] = {"max_files_per_trigger": 1}
    catalog_path = tmp_path / "catalog.yaml"
    catalog_path.write_text(yaml.safe_dump({"version": 1, "streams": [definition]}), encoding="utf-8")
    spec = parse_catalog({"version": 1, "streams": [definition]}).get("customers")
    path = spec.sink_path(roots)

    faults = tmp_path / "faults"
    faults.mkdir()
    crashed = submit(catalog_path, roots, ("SLUICE_FAULT_POINT", "between_commits:1"),
                     ("SLUICE_FAULT_DIR", str(faults)), DRIVER, log=faults / "crashed.log", stream="customers")
    wait_for(faults / "between_commits.reached", crashed, faults / "crashed.log")
    kill_application(crashed, faults / "between_commits.reached")
    query_id = read_query_id(spec.checkpoint_path(roots))
    assert query_id is not None
    assert recorded_batch(path, query_id) == 1 and (recorded_batch(tombstones_path(path), query_id) or 0) == 0
    report = check_stream(spec, roots)
    assert (report.status, report.codes) == (Severity.WARN, [FaultCode.UNCOMMITTED_BATCH]), report.describe()

    [rerun] = run_streams(spark, load_catalog(catalog_path), ["customers"], roots).streams
    assert rerun.status == "succeeded", rerun.error
    last_delete = 2 if any(event[1] == "d" for event in parts[2]) else 1
    assert recorded_batch(tombstones_path(path), query_id) == last_delete, "the replay committed the tombstones"
    assert table(path, 1) == type1(changes(history))
    assert check_stream(spec, roots).status is Severity.OK
