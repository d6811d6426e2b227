"""SIGKILL the Spark application at named points of a run, rerun it, and check the table is exact.

Each case runs the real spark-submit entry point in its own process group. The run stops at a crash point
(``sluice_spark.faults``), the test kills the whole application with SIGKILL, then a clean rerun must leave the
bronze and dead-letter tables equal to the oracle: no duplicate, nothing lost.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.paths import Roots
from sluice.storage.delta import read_table
from tests.helpers import (
    driver_options_env,
    events_stream,
    expected_events,
    roots_in,
    spark_submit,
    table_rows,
    write_catalog,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[2]
RUNNER = PROJECT / "spark_apps" / "stream_runner.py"
BACKFILL_RUNNER = PROJECT / "spark_apps" / "backfill_runner.py"
NOW = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)


def submit(catalog: Path, roots: Roots, *extra_env: tuple[str, str], summary: Path | None = None,
           run_id: str | None = None, log: Path | None = None, stream: str = "events", runner: Path = RUNNER,
           params: Sequence[str] = ()) -> subprocess.Popen:
    """spark-submit the runner (or another job's entry point, ``backfill_runner.py`` with its ``params``). A run the
    test waits on without reading its output (until a crash point) writes it to ``log``: a pipe nobody drains would
    block the run once its buffer is full."""
    env = {**os.environ, **driver_options_env(catalog, [stream], roots), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, **dict(extra_env)}
    command = spark_submit(str(runner), "--catalog", str(catalog), "--stream", stream, *roots.as_args(), *params)
    if summary is not None:
        command += ["--summary-file", str(summary)]
    if run_id is not None:
        command += ["--run-id", run_id]
    output = subprocess.PIPE if log is None else log.open("w", encoding="utf-8")
    return subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def wait_for(marker: Path, process: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if process.poll() is not None:
            output = log.read_text(encoding="utf-8", errors="replace")
            raise AssertionError(f"run ended (exit {process.returncode}) before {marker.name}:\n{output[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{marker.name} not reached in {timeout}s")
        time.sleep(0.05)


def kill_application(process: subprocess.Popen, marker: Path) -> None:
    """SIGKILL the launcher's whole process group and the Python worker that is parked at the crash point."""
    worker_pid = int(marker.read_text() or "0")
    os.killpg(process.pid, signal.SIGKILL)
    if worker_pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker_pid, signal.SIGKILL)
    process.wait(timeout=60)


# The two write paths of the rs engine: a small run collected to the driver (the default under 64 MiB unread),
# and the executors' Python data source (what a large run takes).
DRIVER = ("SLUICE_DRIVER_WRITE_MAX_BYTES", str(64 << 20))
EXECUTORS = ("SLUICE_DRIVER_WRITE_MAX_BYTES", "0")


def kill_at_then_rerun(catalog: Path, roots: Roots, fault: str, faults: Path,
                       summary: Path | None = None, run_id: str | None = None,
                       write_path: tuple[str, str] = DRIVER, stream: str = "events") -> str:
    """Run until the crash point ``fault`` (``name[:batch]``) on ``write_path``, SIGKILL the application there, rerun
    it cleanly (a small rerun: on the driver's path); the rerun's output."""
    point = fault.split(":")[0]
    faults.mkdir(exist_ok=True)
    crashed = submit(catalog, roots, ("SLUICE_FAULT_POINT", fault), ("SLUICE_FAULT_DIR", str(faults)), write_path,
                     run_id=run_id, log=faults / "crashed.log", stream=stream)
    wait_for(faults / f"{point}.reached", crashed, faults / "crashed.log")
    kill_application(crashed, faults / f"{point}.reached")
    assert crashed.returncode == -signal.SIGKILL
    rerun = submit(catalog, roots, DRIVER, summary=summary, run_id=run_id, stream=stream)
    output, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, output[-3000:]
    return output


def bronze(path: str) -> list[tuple[Any, ...]]:
    columns = ["event_id", "event_type", "user_id", "amount", "event_date"]
    return [(*row[:4], row[4].isoformat()) for row in table_rows(path, columns)]


@pytest.mark.parametrize(
    ("fault", "write_path"),
    [
        ("executor_written", EXECUTORS),  # Parquet written by an executor, nothing committed
        ("before_commit:1", EXECUTORS),  # batch 0 committed; batch 1's files written, its Delta commit not started
        ("between_commits:1", EXECUTORS),  # batch 1 committed to bronze, not yet to the dead-letter table
        ("after_commit:1", EXECUTORS),  # batch 1 committed to both tables, Spark's commits/1 not yet written
        ("before_commit:1", DRIVER),  # batch 1 collected on the driver, nothing of it committed
        ("after_commit:1", DRIVER),  # batch 1 appended to both tables, Spark's commits/1 not yet written
    ],
    ids=["executors-executor_written", "executors-before_commit", "executors-between_commits",
         "executors-after_commit", "driver-before_commit", "driver-after_commit"],
)
def test_sigkill_then_rerun_gives_the_exact_table(tmp_path: Path, fault: str, write_path: tuple[str, str]) -> None:
    catalog_path = write_catalog(tmp_path, events_stream(trigger={"max_files_per_trigger": 1}))
    stream = load_catalog(catalog_path).get("events")
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=21, malformed_rate=0.08)
    for index in range(3):
        producer.events_file(lines=60, now=NOW + dt.timedelta(minutes=index))
    summary_file = tmp_path / "summary.json"
    output = kill_at_then_rerun(catalog_path, roots, fault, tmp_path / "faults", summary=summary_file,
                                write_path=write_path)
    assert "SLUICE_RUN_SUMMARY " in output and summary_file.exists()
    assert json.loads(summary_file.read_text())["streams"][0]["write_path"] == "driver"

    expected_good, expected_bad = expected_events(Path(roots.landing) / "events")
    assert bronze(stream.sink_path(roots)) == expected_good
    dead = read_table(stream.dead_letter_table_path(roots)).num_rows
    assert dead == expected_bad
    parquet_files = {p.name for p in Path(stream.sink_path(roots)).rglob("*.parquet")}
    live_files = {Path(p).name for p in DeltaTable(stream.sink_path(roots)).file_uris()}
    assert live_files <= parquet_files


def test_runner_reports_an_unknown_stream_and_exits_non_zero(tmp_path: Path) -> None:
    catalog_path = write_catalog(tmp_path, events_stream("other"))
    summary_file = tmp_path / "summary.json"
    process = submit(catalog_path, roots_in(tmp_path), summary=summary_file)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 2
    assert "unknown stream 'events'; the catalog has: other" in output
    assert '"status": "failed"' in summary_file.read_text()


def test_second_run_of_a_locked_stream_refuses_and_changes_nothing(tmp_path: Path) -> None:
    catalog_path = write_catalog(tmp_path, events_stream())
    stream = load_catalog(catalog_path).get("events")
    roots = roots_in(tmp_path)
    DemoProducer(roots.landing, seed=23).produce(files=2, now=NOW)
    faults = tmp_path / "faults"
    faults.mkdir()
    first = submit(catalog_path, roots, ("SLUICE_FAULT_POINT", "before_commit"), ("SLUICE_FAULT_DIR", str(faults)),
                   log=faults / "first.log")
    wait_for(faults / "before_commit.reached", first, faults / "first.log")  # the first run holds the lock, mid-batch

    second = submit(catalog_path, roots, summary=tmp_path / "second.json")
    output, _ = second.communicate(timeout=300)

    assert second.returncode == 1, output[-3000:]
    refused = json.loads((tmp_path / "second.json").read_text())["streams"][0]
    assert "is locked by run" in refused["error"] and refused["retryable"] is True
    assert DeltaTable(stream.sink_path(roots)).version() == 0, "the refused run wrote nothing"

    kill_application(first, faults / "before_commit.reached")  # a dead holder's lock is stale for the next run
    rerun = submit(catalog_path, roots)
    output, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, output[-3000:]
    assert bronze(stream.sink_path(roots)) == expected_events(Path(roots.landing) / "events")[0]


def test_sigkill_between_commits_with_quarantined_rows_then_rerun(tmp_path: Path) -> None:
    """Batch 1 holds rows an expectation quarantines: the kill lands after its bronze commit and before its
    dead-letter commit. The rerun must leave both tables exact: every quarantined row once, nothing else lost."""
    rule = {"small_amount": {"check": "amount IS NULL OR amount < 100", "on_violation": "quarantine"}}
    catalog_path = write_catalog(tmp_path, events_stream(trigger={"max_files_per_trigger": 1}, expectations=rule))
    stream = load_catalog(catalog_path).get("events")
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=5, malformed_rate=0.05)
    for index in range(3):
        producer.events_file(lines=60, now=NOW + dt.timedelta(minutes=index))
    kill_at_then_rerun(catalog_path, roots, "between_commits:1", tmp_path / "faults")

    good, bad = expected_events(Path(roots.landing) / "events")
    kept = [row for row in good if row[3] is None or row[3] < 100]
    files = sorted((Path(roots.landing) / "events").rglob("*.json"))
    assert all(any(row[3] is not None and row[3] >= 100 for row in expected_events(files[0], files=[path])[0])
               for path in files)  # every batch quarantines, the killed one too
    assert bronze(stream.sink_path(roots)) == kept
    reasons = [row["reason"] for row in read_table(stream.dead_letter_table_path(roots), ["reason"]).to_pylist()]
    assert reasons.count("broke expectation(s): small_amount") == len(good) - len(kept)
    assert len(reasons) == bad + len(good) - len(kept)


def test_a_run_retried_after_a_sigkill_keeps_one_row_in_the_run_log(tmp_path: Path) -> None:
    """Killed after its run log row is written, retried under the same run id (Airflow's retry keeps it): one row
    for the run, with the retry's numbers, and the batches of the first attempt."""
    from sluice.storage import runlog

    catalog_path = write_catalog(tmp_path, events_stream())
    roots = roots_in(tmp_path)
    DemoProducer(roots.landing, seed=9, malformed_rate=0.1).events_file(lines=40, now=NOW)
    run_id = "ingest_events/manual__retried/run_stream"
    kill_at_then_rerun(catalog_path, roots, "run_logged", tmp_path / "faults", run_id=run_id)

    [row] = [row for row in runlog.runs(roots.lake, "events") if row["run_id"] == run_id]
    assert row["status"] == "succeeded" and row["batches"] == 0  # the retry found the batch committed
    [batch] = runlog.batches(roots.lake, "events", run_id)
    good, bad = expected_events(Path(roots.landing) / "events")
    assert batch["batch_id"] == 0 and batch["input_rows"] == len(good) + bad


# --- Kafka into Delta, on both engines ------------------------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("engine", "fault"),
    [
        ("rs", "after_commit:1"),  # batch 1 in both tables, Spark's commits/1 not written: a replay, skipped
        ("jvm", "between_commits:1"),  # batch 1 in bronze, not yet in the dead-letter table
    ],
)
def test_sigkill_during_a_kafka_run_then_rerun_gives_the_exact_table(spark: Any, tmp_path: Path, kafka: Any,
                                                                     monkeypatch: pytest.MonkeyPatch, engine: str,
                                                                     fault: str) -> None:
    """Three partitions read 20 offsets a batch, malformed records among them: the killed run and its rerun leave
    bronze and the dead-letter table equal to the oracle, each record once. Only the killed run is an application
    of its own; the rerun is the session's, through the runner's own code."""
    from sluice.cli.kafka_broker import create_topic
    from sluice.connections.kafka import env_name
    from sluice_spark.runner import run_streams
    from tests.kafka_data import clicks, expected, kafka_stream, produce

    topic = f"crash-{engine}-{fault.split(':')[0]}-{time.monotonic_ns()}"
    create_topic(kafka, topic, 3)
    records = [*clicks(0, 50), b"{broken", b'{"amount": 2}', *clicks(50, 10)]
    produce(kafka, topic, records, partitions=3)
    catalog_path = write_catalog(tmp_path, kafka_stream(engine=engine, options={
        "subscribe": topic, "startingOffsets": "earliest", "maxOffsetsPerTrigger": 20}))
    stream = load_catalog(catalog_path).get("clicks")
    roots = roots_in(tmp_path)
    connection = (env_name("sluice_kafka"), json.dumps(kafka.spark_options()))
    faults = tmp_path / "faults"
    faults.mkdir()
    point = fault.split(":")[0]
    crashed = submit(catalog_path, roots, connection, ("SLUICE_FAULT_POINT", fault), ("SLUICE_FAULT_DIR", str(faults)),
                     DRIVER, log=faults / "crashed.log", stream="clicks")
    wait_for(faults / f"{point}.reached", crashed, faults / "crashed.log")
    kill_application(crashed, faults / f"{point}.reached")
    assert crashed.returncode == -signal.SIGKILL
    monkeypatch.setenv(*connection)
    rerun = run_streams(spark, load_catalog(catalog_path), ["clicks"], roots)
    assert rerun.ok, [result.error for result in rerun.streams]

    good, bad = expected(records, rescue=True)
    assert sorted(table_rows(stream.sink_path(roots), ["event_id", "amount"])) == good
    assert read_table(stream.dead_letter_table_path(roots)).num_rows == bad


@pytest.mark.kafka
@pytest.mark.parametrize("fault", ["before_commit:1", "between_commits:1"])
def test_sigkill_during_a_run_into_a_kafka_sink_then_rerun_sends_each_record_once(spark: Any, tmp_path: Path,
                                                                                  kafka: Any,
                                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                                  fault: str) -> None:
    """A file stream into a topic, one Kafka transaction per batch. Killed with batch 1's records sent but its
    transaction open (before_commit), or committed to the topic but not to the dead-letter table nor Spark's
    checkpoint (between_commits): after the rerun a read_committed consumer reads each good row once, and the
    dead-letter table is exact. A read_uncommitted consumer also reads what the aborted transaction sent. Only the
    killed run is an application of its own; the rerun is the session's, through the runner's own code."""
    from sluice.cli.kafka_broker import create_topic
    from sluice.connections.kafka import env_name
    from sluice_spark.runner import run_streams
    from tests.kafka_data import consume

    topic = f"crash-sink-{fault.split(':')[0]}-{time.monotonic_ns()}"
    create_topic(kafka, topic, 2)
    definition = events_stream(trigger={"max_files_per_trigger": 1},
                               sink={"format": "kafka", "topic": topic, "key_column": "event_id"})
    catalog_path = write_catalog(tmp_path, definition)
    stream = load_catalog(catalog_path).get("events")
    roots = roots_in(tmp_path)
    producer = DemoProducer(roots.landing, seed=27, malformed_rate=0.08)
    for index in range(3):
        producer.events_file(lines=40, now=NOW + dt.timedelta(minutes=index))
    connection = (env_name("sluice_kafka"), json.dumps(kafka.spark_options()))
    faults = tmp_path / "faults"
    faults.mkdir()
    point = fault.split(":")[0]
    crashed = submit(catalog_path, roots, connection, ("SLUICE_FAULT_POINT", fault), ("SLUICE_FAULT_DIR", str(faults)),
                     DRIVER, log=faults / "crashed.log")
    wait_for(faults / f"{point}.reached", crashed, faults / "crashed.log")
    kill_application(crashed, faults / f"{point}.reached")
    assert crashed.returncode == -signal.SIGKILL
    monkeypatch.setenv(*connection)
    rerun = run_streams(spark, load_catalog(catalog_path), ["events"], roots)
    assert rerun.ok, [result.error for result in rerun.streams]

    good, bad = expected_events(Path(roots.landing) / "events")
    received = consume(kafka, topic, len(good))
    keys = [key for key, _ in received]
    assert sorted(keys) == sorted(row[0] for row in good), "each good row once"
    assert read_table(stream.dead_letter_table_path(roots)).num_rows == bad
    uncommitted = consume(kafka, topic, len(good), isolation="read_uncommitted")
    if point == "before_commit":  # the killed run's open transaction was aborted, its records stay in the log
        assert len(uncommitted) > len(good)
    else:
        assert len(uncommitted) == len(good)
