"""Range backfills of a Kafka source against the session's real broker: records produced at known timestamps into
two partitions, a bronze stream that ingested them, then backfills by offsets and by time.

The oracle is the records as produced (their partition, offset and timestamp, decoded with the json module alone),
never the code under test.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from sluice.catalog import Catalog, parse_catalog
from sluice.connections.kafka import env_name
from sluice.constants import SOURCE_FILE_COLUMN
from sluice.errors import BackfillError
from sluice.operations.backfill import parse_request, plan_backfill
from sluice.paths import Roots
from tests.helpers import roots_in, table_rows
from tests.kafka_data import kafka_stream, new_topic

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

BASE_MS = (int(time.time()) - 3600) * 1000  # an hour ago: well inside the broker's retention
PER_PARTITION = 8


def produce_at_known_times(kafka: Any, topic: str) -> dict[tuple[int, int], tuple[int, bytes]]:
    """Eight records per partition, one a second (partition 1 half a second later); offset 6 of partition 0 is not
    JSON (a dead letter). Returns (partition, offset) -> (timestamp ms, value)."""
    from confluent_kafka import Producer

    records: dict[tuple[int, int], tuple[int, bytes]] = {}
    producer = Producer(kafka.client_config())
    for offset in range(PER_PARTITION):
        for partition in (0, 1):
            at = BASE_MS + offset * 1000 + partition * 500
            value = b"{broken" if (partition, offset) == (0, 6) else json.dumps(
                {"event_id": f"p{partition}-{offset}", "amount": offset / 4}).encode()
            producer.produce(topic, value=value, partition=partition, timestamp=at)
            records[(partition, offset)] = (at, value)
    assert producer.flush(30) == 0
    return records


def good_rows(topic: str, records: dict[tuple[int, int], tuple[int, bytes]]) -> list[tuple[Any, ...]]:
    """The bronze rows the records make: (event_id, lineage)."""
    rows = []
    for (partition, offset), (_, value) in records.items():
        try:
            rows.append((json.loads(value)["event_id"], f"kafka://{topic}/{partition}/{offset}"))
        except json.JSONDecodeError:
            continue
    return sorted(rows, key=repr)


@pytest.fixture(scope="module", params=["rs", "jvm"])
def world(request: pytest.FixtureRequest, spark: Any, kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A topic, its records, and a bronze stream on each engine (replace is delta-rs's predicate overwrite, or
    delta-spark's replaceWhere) that has read them all."""
    from sluice_spark.runner import run_streams

    topic = new_topic(kafka, partitions=2)
    records = produce_at_known_times(kafka, topic)
    patch = pytest.MonkeyPatch()
    patch.setenv(env_name("sluice_kafka"), json.dumps(kafka.spark_options()))
    catalog = parse_catalog({"version": 1, "streams": [kafka_stream(
        engine=request.param, options={"subscribe": topic, "startingOffsets": "earliest", "maxOffsetsPerTrigger": 5})]})
    roots = roots_in(tmp_path_factory.mktemp("kafka-range"))
    [run] = run_streams(spark, catalog, ["clicks"], roots).streams
    assert run.status == "succeeded", run.error
    yield topic, records, catalog, roots
    patch.undo()


def bronze(catalog: Catalog, roots: Roots) -> list[tuple[Any, ...]]:
    return table_rows(catalog.get("clicks").sink_path(roots), ["event_id", SOURCE_FILE_COLUMN])


def dead_letters(catalog: Catalog, roots: Roots) -> list[tuple[Any, ...]]:
    return table_rows(catalog.get("clicks").dead_letter_table_path(roots), ["source_file"])


def backfill(spark: Any, catalog: Catalog, roots: Roots, run_id: str, **params: Any) -> Any:
    from sluice_spark.backfill import run_backfill

    summary = run_backfill(spark, catalog, parse_request({"stream": "clicks", **params}, catalog, run_id=run_id),
                           roots)
    assert summary.ok, summary.error
    return summary


def test_offsets_dry_run_append_and_replace_twice_give_the_oracles_table(spark: Any, world: Any) -> None:
    from deltalake import DeltaTable

    topic, records, catalog, roots = world
    oracle = good_rows(topic, records)
    assert bronze(catalog, roots) == oracle
    dead = [(f"kafka://{topic}/0/6",)]
    assert dead_letters(catalog, roots) == dead

    offsets = {"0": [2, 7], "1": [0, 3]}
    dry = backfill(spark, catalog, roots, "dry", offsets=offsets, mode="replace", dry_run=True)
    assert {key: (c["first"], c["last"], c["offsets"]) for key, c in dry.offsets["partitions"].items()} == \
        {f"{topic}:0": (2, 7, 6), f"{topic}:1": (0, 3, 4)}
    assert (dry.rows_replaced, dry.dead_letter_rows_replaced) == (9, 1)
    assert (dry.input_rows, dry.rows_written, dry.dead_letter_rows) == (10, 9, 1), "only the offsets selected"
    assert bronze(catalog, roots) == oracle, "a dry run writes nothing"

    # A bad deploy lost rows: append reads the offsets of the range the tables no longer hold, and only those.
    DeltaTable(catalog.get("clicks").sink_path(roots)).delete(f"{SOURCE_FILE_COLUMN} LIKE 'kafka://%/0/%'")
    appended = backfill(spark, catalog, roots, "append", offsets={"0": [0, 7]})
    assert appended.offsets["partitions"][f"{topic}:0"]["to_read"] == 7, "offset 6 is a dead letter already"
    assert (appended.rows_written, appended.dead_letter_rows) == (7, 0)
    assert bronze(catalog, roots) == oracle and dead_letters(catalog, roots) == dead
    again = backfill(spark, catalog, roots, "append-again", offsets={"0": [0, 7]})
    assert again.rows_written == 0 and "nothing to do" in " ".join(again.notes)

    for run_id in ("replace-1", "replace-2"):
        replaced = backfill(spark, catalog, roots, run_id, offsets=offsets, mode="replace")
        assert (replaced.rows_replaced, replaced.rows_written, replaced.dead_letter_rows) == (9, 9, 1)
        assert bronze(catalog, roots) == oracle and dead_letters(catalog, roots) == dead


def test_a_time_range_is_resolved_to_each_partitions_offsets(spark: Any, world: Any) -> None:
    replace_a_time_range(spark, world)
    topic, records, catalog, roots = world
    assert bronze(catalog, roots) == good_rows(topic, records)


def replace_a_time_range(spark: Any, world: Any) -> None:
    """A replace by the records' timestamps: each partition's offsets of the range, as many rows written as
    replaced (the caller checks the table against the oracle)."""
    import datetime as dt

    topic, records, catalog, roots = world
    start, end = BASE_MS + 2_000, BASE_MS + 5_000  # [2 s, 5 s): partition 0's 2..4, partition 1's 2..4 (at +0.5 s)
    expected = {partition: [offset for (p, offset), (at, _) in sorted(records.items())
                            if p == partition and start <= at < end] for partition in (0, 1)}
    moment = lambda ms: dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat()  # noqa: E731
    summary = backfill(spark, catalog, roots, "by-time", select_by="timestamp", start=moment(start),
                       end=moment(end), mode="replace")
    assert {key: [c["first"], c["last"]] for key, c in summary.offsets["partitions"].items()} == \
        {f"{topic}:{p}": [offsets[0], offsets[-1]] for p, offsets in expected.items()}
    assert summary.rows_written == summary.rows_replaced == sum(map(len, expected.values()))


def test_offsets_past_the_latest_or_the_live_stream_are_refused_before_anything_is_read(world: Any) -> None:
    topic, _, catalog, roots = world
    for offsets, fragment in (({"0": [0, PER_PARTITION]}, f"offset {PER_PARTITION} is past the latest"),
                              ({"3": [0, 1]}, "has no partition 3"),
                              ({topic: {"1": [5, 2]}}, "is after the last")):
        with pytest.raises(BackfillError, match=f"^offsets: .*{fragment}"):
            plan_backfill(parse_request({"stream": "clicks", "offsets": offsets}, catalog, run_id="r"),
                          catalog.get("clicks"), roots)


def test_the_runner_reports_an_offset_only_the_broker_can_check_as_refused(kafka: Any, tmp_path: Any) -> None:
    """Through ``backfill_runner.py`` (what the backfill task runs), an offset past the topic's latest is found by
    the plan, inside the Spark application: the run is refused (exit 2, status refused, one line naming the param),
    not failed, and nothing is written."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    from tests.helpers import spark_submit, submit_options_env

    topic = new_topic(kafka, partitions=2)
    produce_at_known_times(kafka, topic)  # offsets 0 to 7 in each partition
    catalog_path = tmp_path / "catalog.yaml"
    catalog_path.write_text(yaml.safe_dump({"version": 1, "streams": [kafka_stream(
        options={"subscribe": topic, "startingOffsets": "earliest"})]}), encoding="utf-8")
    roots = roots_in(tmp_path)
    summary = tmp_path / "summary.json"
    runner = Path(__file__).resolve().parents[2] / "spark_apps" / "backfill_runner.py"
    done = subprocess.run(
        spark_submit(str(runner), "--catalog", str(catalog_path), "--stream", "clicks", "--select-by", "offset",
                     "--offsets", json.dumps({"0": [0, 99]}), "--run-id", "past-latest", "--summary-file",
                     str(summary), *roots.as_args()),
        capture_output=True, text=True, timeout=600,
        env={**os.environ, **submit_options_env(), "PYSPARK_PYTHON": sys.executable,
             env_name("sluice_kafka"): json.dumps(kafka.spark_options())})
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    refused = json.loads(summary.read_text())
    assert refused["status"] == "refused" and refused["error"].startswith("offsets: "), refused
    # spark-submit's PythonRunner merges the driver's stderr into its stdout
    said = [line for line in done.stdout.splitlines() if line.startswith("sluice: ")]
    assert said == [f"sluice: offsets: {topic}:0: offset 99 is past the latest, 7"], said
    assert not list(Path(roots.lake).rglob("*.parquet")), "a refused backfill writes nothing"
