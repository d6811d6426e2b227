"""A Kafka source's range backfill into an Iceberg sink, against the session's real broker: records produced at
known timestamps into two partitions, a bronze stream that ingested them into an Iceberg table, then backfills by
offsets and by time, each ``replace`` one overwrite snapshot of exactly the range's rows.

The oracle is the records as produced (their partition, offset and timestamp, decoded with the json module alone),
read back from the table by pyiceberg, never by the code under test.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import Catalog, parse_catalog
from sluice.connections.kafka import env_name
from sluice.constants import SOURCE_FILE_COLUMN
from sluice.kinds.iceberg import IcebergSink
from sluice.paths import Roots
from sluice.storage.iceberg import IcebergTableFormat
from tests.helpers import roots_in, table_rows, write_catalog
from tests.kafka_data import kafka_stream, new_topic
from tests.spark.test_crash_recovery import BACKFILL_RUNNER, kill_application, submit, wait_for
from tests.spark.test_kafka_range_backfill import backfill, good_rows, produce_at_known_times, replace_a_time_range

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


@pytest.fixture(scope="module")
def world(spark: Any, kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A topic, its records, and a bronze stream into an Iceberg table that has read them all."""
    from sluice_spark.runner import run_streams

    topic = new_topic(kafka, partitions=2)
    records = produce_at_known_times(kafka, topic)
    patch = pytest.MonkeyPatch()
    patch.setenv(env_name("sluice_kafka"), json.dumps(kafka.spark_options()))
    stream = kafka_stream(options={"subscribe": topic, "startingOffsets": "earliest", "maxOffsetsPerTrigger": 5})
    stream["sink"] = {"format": "iceberg", "table": "bronze.clicks", "engine": "rs"}
    catalog = parse_catalog({"version": 1, "streams": [stream]})
    roots = roots_in(tmp_path_factory.mktemp("kafka-iceberg-range"))
    [run] = run_streams(spark, catalog, ["clicks"], roots).streams
    assert run.status == "succeeded", run.error
    yield topic, records, catalog, roots
    patch.undo()


def iceberg(catalog: Catalog, roots: Roots) -> IcebergTableFormat:
    sink = catalog.get("clicks").sink
    assert isinstance(sink, IcebergSink)
    return IcebergTableFormat(sink.identifier, sink.catalog_properties(roots))


def bronze(catalog: Catalog, roots: Roots) -> list[tuple[Any, ...]]:
    rows = iceberg(catalog, roots).table().scan(selected_fields=("event_id", SOURCE_FILE_COLUMN)).to_arrow()
    return sorted(((row["event_id"], row[SOURCE_FILE_COLUMN]) for row in rows.to_pylist()), key=repr)


def dead_letters(catalog: Catalog, roots: Roots) -> list[tuple[Any, ...]]:
    return table_rows(catalog.get("clicks").dead_letter_table_path(roots), ["source_file"])


def test_offsets_dry_run_append_and_replace_twice_give_the_oracles_table(spark: Any, world: Any) -> None:
    from pyiceberg.expressions import StartsWith

    topic, records, catalog, roots = world
    oracle = good_rows(topic, records)
    assert bronze(catalog, roots) == oracle
    dead = [(f"kafka://{topic}/0/6",)]
    assert dead_letters(catalog, roots) == dead
    table = iceberg(catalog, roots)

    offsets = {"0": [2, 7], "1": [0, 3]}
    snapshots = len(table.table().snapshots())
    dry = backfill(spark, catalog, roots, "dry", offsets=offsets, mode="replace", dry_run=True)
    assert (dry.rows_replaced, dry.dead_letter_rows_replaced) == (9, 1)
    assert (dry.input_rows, dry.rows_written, dry.dead_letter_rows) == (10, 9, 1), "only the offsets selected"
    assert bronze(catalog, roots) == oracle and len(table.table().snapshots()) == snapshots, "a dry run writes nothing"

    # A bad deploy lost rows: append reads the offsets of the range the tables no longer hold, and only those.
    table.table().delete(StartsWith(SOURCE_FILE_COLUMN, f"kafka://{topic}/0/"))
    assert len(bronze(catalog, roots)) == len(oracle) - 7
    appended = backfill(spark, catalog, roots, "append", offsets={"0": [0, 7]})
    assert appended.offsets["partitions"][f"{topic}:0"]["to_read"] == 7, "offset 6 is a dead letter already"
    assert (appended.rows_written, appended.dead_letter_rows) == (7, 0)
    assert bronze(catalog, roots) == oracle and dead_letters(catalog, roots) == dead
    again = backfill(spark, catalog, roots, "append-again", offsets={"0": [0, 7]})
    assert again.rows_written == 0 and "nothing to do" in " ".join(again.notes)

    for run_id in ("replace-1", "replace-2"):
        before = len(table.table().snapshots())
        replaced = backfill(spark, catalog, roots, run_id, offsets=offsets, mode="replace")
        assert (replaced.rows_replaced, replaced.rows_written, replaced.dead_letter_rows) == (9, 9, 1)
        assert bronze(catalog, roots) == oracle and dead_letters(catalog, roots) == dead
        commits = table.commits()
        assert len(table.table().snapshots()) == before + 1 and commits[-1].operation == "overwrite"
        assert commits[-1].query_id == replaced.query_id and commits[-1].rows == 9


def test_a_time_range_is_resolved_to_each_partitions_offsets(spark: Any, world: Any) -> None:
    topic, records, catalog, roots = world
    replace_a_time_range(spark, world)
    assert bronze(catalog, roots) == good_rows(topic, records)


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "fault"), [
    ("append", "between_commits:1"),  # batch 1 in the Iceberg table, not in the dead-letter table nor the checkpoint
    ("replace", "between_commits:0"),  # the range overwritten in the Iceberg table, its dead letters not yet
])
def test_a_backfill_killed_at_a_crash_point_then_retried_gives_the_oracles_table(
        spark: Any, kafka: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, fault: str) -> None:
    """The backfill's own application is SIGKILLed at the crash point; its retry (same run id: the frozen plan, the
    same checkpoint and query id) replays the batch, the Iceberg table skips it, and the tables equal the oracle,
    each row once. The retry runs in the session, through the backfill's own code."""
    from pyiceberg.expressions import StartsWith

    from sluice.catalog import load_catalog
    from sluice_spark.runner import run_streams

    topic = new_topic(kafka, partitions=2)
    records = produce_at_known_times(kafka, topic)
    connection = (env_name("sluice_kafka"), json.dumps(kafka.spark_options()))
    monkeypatch.setenv(*connection)
    stream = kafka_stream(options={"subscribe": topic, "startingOffsets": "earliest", "maxOffsetsPerTrigger": 5})
    stream["sink"] = {"format": "iceberg", "table": "bronze.clicks", "engine": "rs"}
    catalog_path = write_catalog(tmp_path, stream)
    catalog, roots = load_catalog(catalog_path), roots_in(tmp_path)
    assert run_streams(spark, catalog, ["clicks"], roots).streams[0].status == "succeeded"
    oracle, dead = good_rows(topic, records), [(f"kafka://{topic}/0/6",)]
    table = iceberg(catalog, roots)
    if mode == "append":  # partition 0's rows lost; read back in two batches of five offsets
        table.table().delete(StartsWith(SOURCE_FILE_COLUMN, f"kafka://{topic}/0/"))
        offsets = {"0": [0, 7]}
    else:
        offsets = {"0": [2, 7], "1": [0, 3]}
    faults = tmp_path / "faults"
    faults.mkdir()
    point = fault.split(":")[0]
    crashed = submit(catalog_path, roots, connection, ("SLUICE_FAULT_POINT", fault), ("SLUICE_FAULT_DIR", str(faults)),
                     run_id="retried", log=faults / "crashed.log", stream="clicks", runner=BACKFILL_RUNNER,
                     params=["--offsets", json.dumps(offsets), "--mode", mode])
    wait_for(faults / f"{point}.reached", crashed, faults / "crashed.log")
    kill_application(crashed, faults / f"{point}.reached")
    assert crashed.returncode == -signal.SIGKILL
    batch = int(fault.split(":")[1])
    killed = table.commits()[-1]
    assert (killed.operation, killed.batch_id) == ("append" if mode == "append" else "overwrite", batch)

    retried = backfill(spark, catalog, roots, "retried", offsets=offsets, mode=mode)

    assert retried.query_id == killed.query_id and retried.replayed_batches == [batch]
    assert bronze(catalog, roots) == oracle and dead_letters(catalog, roots) == dead
    backfilled = [commit for commit in table.commits() if commit.query_id == retried.query_id]
    assert sum(commit.rows or 0 for commit in backfilled) == (7 if mode == "append" else 9), "each row once"
