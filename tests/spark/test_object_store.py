"""Health and lag on S3 give the reports they give on disk: a checkpoint and tables that real Spark runs wrote (run
locally, then copied up to a real S3-compatible server on 127.0.0.1), checked as they are and after the same damage
on both copies."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import Catalog, load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.lag.observe import observe
from sluice.operations.health import HealthReport, check_stream
from sluice.paths import Roots
from sluice.storage.lock import LOCK_FILE, LockInfo
from sluice.storage.store import Folder, LocalFolder, folder
from sluice_spark.runner import run_streams
from tests.helpers import (
    events_stream,
    fresh_world,
    keep_pristine,
    needs_jvm_jars,
    roots_in,
    submit_options_env,
    table_rows,
    write_catalog,
)
from tests.object_store import upload, uri

pytestmark = pytest.mark.spark

PROJECT = Path(__file__).resolve().parents[2]

NOW = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def golden(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder_ = tmp_path_factory.mktemp("object-store") / "world"
    folder_.mkdir()
    write_catalog(folder_, events_stream(trigger={"max_files_per_trigger": 1}))
    producer = DemoProducer(folder_ / "landing", seed=7, malformed_rate=0.05)
    for index in range(2):
        producer.events_file(lines=20, now=NOW + dt.timedelta(minutes=index))
    assert run_streams(spark, load_catalog(folder_ / "catalog.yaml"), ["events"], roots_in(folder_)).ok
    producer.events_file(lines=5, now=NOW + dt.timedelta(minutes=5))  # a backlog for the lag probe
    return keep_pristine(folder_)


def worlds(golden: Path, bucket: str) -> tuple[Catalog, Roots, Roots]:
    """The local world, and its copy with the lake and the checkpoints on S3 (the landing zone stays where Spark
    recorded it)."""
    catalog, local, _ = fresh_world(golden)
    upload(Path(local.lake), uri(bucket, "lake"))
    upload(Path(local.checkpoints), uri(bucket, "checkpoints"))
    remote = Roots(landing=local.landing, lake=uri(bucket, "lake"), checkpoints=uri(bucket, "checkpoints"))
    return catalog, local, remote


def summary(report: HealthReport) -> tuple[Any, ...]:
    facts = {key: report.facts.get(key) for key in ("query_id", "batches_retained", "latest_offsets_batch",
                                                    "last_batch_id")}
    return report.status, report.codes, facts


def remove_last_commit(checkpoint: Folder) -> None:
    last = max(int(entry.name) for entry in checkpoint.child("commits").entries() if entry.name.isdigit())
    checkpoint.child("commits").delete(str(last))
    checkpoint.child("commits").delete(f".{last}.crc")


def tear_last_offsets(checkpoint: Folder) -> None:
    last = max(int(entry.name) for entry in checkpoint.child("offsets").entries() if entry.name.isdigit())
    checkpoint.child("offsets").write_bytes(str(last), b"v1\n{\"batchWatermarkMs\":")


def lose_metadata(checkpoint: Folder) -> None:
    checkpoint.delete("metadata")


def held_by_another_run(checkpoint: Folder) -> None:
    now = time.time()
    checkpoint.write_bytes(LOCK_FILE, json.dumps(LockInfo("events", "other", "elsewhere", 7, now, now, 300,
                                                          "t").__dict__).encode())


DAMAGES: dict[str, Callable[[Folder], None] | None] = {
    "healthy": None, "uncommitted batch": remove_last_commit, "torn offsets": tear_last_offsets,
    "lost metadata": lose_metadata, "locked": held_by_another_run,
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_health_on_s3_is_the_health_on_disk(golden: Path, s3: str, damage: str) -> None:
    catalog, local, remote = worlds(golden, s3)
    stream = catalog.get("events")
    harm = DAMAGES[damage]
    if harm is not None:
        harm(LocalFolder(stream.checkpoint_path(local)))
        harm(folder(stream.checkpoint_path(remote)))
    on_disk, on_s3 = check_stream(stream, local), check_stream(stream, remote)
    assert summary(on_s3) == summary(on_disk)
    assert damage == "healthy" or on_disk.codes, "the damage is seen"


def test_lag_on_s3_is_the_lag_on_disk(golden: Path, s3: str) -> None:
    catalog, local, remote = worlds(golden, s3)
    stream = catalog.get("events")
    on_disk, on_s3 = observe(stream, local, now=1.0), observe(stream, remote, now=1.0)
    assert on_disk.backlog.files == 1 and on_disk.last_batch_id == 1
    assert (on_s3.backlog, on_s3.last_batch_id) == (on_disk.backlog, on_disk.last_batch_id)


def tear_next_offsets(checkpoint: Folder) -> None:
    """A crash while Spark wrote the offsets of the next batch."""
    last = max(int(entry.name) for entry in checkpoint.child("offsets").entries() if entry.name.isdigit())
    checkpoint.child("offsets").write_bytes(str(last + 1), b"v1\n{\"batchWatermarkMs\":0,")


def first_batch_version(catalog: Catalog, local: Roots) -> int:
    from sluice.storage.checkpoint import read_query_id
    from sluice.storage.delta import txn_timeline

    stream = catalog.get("events")
    query_id = read_query_id(stream.checkpoint_path(local))
    assert query_id is not None
    return next(version for version, batch in txn_timeline(stream.sink_path(local), query_id) if batch == 0)


# Each repair action, after the damage it is for.
REPAIRS: dict[str, Callable[[Folder], None] | None] = {
    "history": None, "backup": held_by_another_run, "quarantine-offsets": tear_next_offsets,
    "repin-query-id": lose_metadata, "reset": None,
}
_STAMP = re.compile(r"\d{8}T\d{6}Z-\d{6}")


def portable(result: dict[str, Any], roots: Roots) -> Any:
    """A repair's result with its roots and time stamps named, so that the disk's and the store's compare."""
    text = json.dumps(result, sort_keys=True, default=str)
    for name in ("checkpoints", "lake"):
        text = text.replace(getattr(roots, name).rstrip("/"), f"<{name}>")
    return json.loads(_STAMP.sub("<stamp>", text))


def tree(root: Folder) -> list[str]:
    return sorted(relative for relative, _ in root.walk())


@pytest.mark.parametrize("action", list(REPAIRS))
def test_repair_on_s3_is_the_repair_on_disk(golden: Path, s3: str, action: str) -> None:
    """Each repair action on a checkpoint and tables on S3 does what it does to their copy on disk: the same result,
    the same checkpoint files moved and kept, the same tables, and the same health after it."""
    from sluice.operations.repair import RepairError, run_action
    from sluice.storage.delta import read_table, table_version
    from sluice.storage.lock import LOCK_FILE as LOCK

    catalog, local, remote = worlds(golden, s3)
    stream = catalog.get("events")
    on_disk, on_s3 = LocalFolder(stream.checkpoint_path(local)), folder(stream.checkpoint_path(remote))
    version = first_batch_version(catalog, local) if action == "reset" else None
    harm = REPAIRS[action]
    if harm is not None:
        harm(on_disk)
        harm(on_s3)
    if action == "backup":  # a lock is not backed up; a held one refuses the action
        with pytest.raises(RepairError, match="is locked by run 'other'"):
            run_action(action, stream, remote)
        on_disk.delete(LOCK)
        on_s3.delete(LOCK)
        on_disk.write_bytes(f"{LOCK}.stale-1", b"{}")
        on_s3.write_bytes(f"{LOCK}.stale-1", b"{}")

    by_disk, by_s3 = run_action(action, stream, local, version=version), run_action(action, stream, remote,
                                                                                      version=version)

    assert portable(by_s3, remote) == portable(by_disk, local)
    assert tree(on_s3) == tree(on_disk)
    for key in ("backup", "moved_to", "quarantine"):
        if key in by_disk:
            assert tree(folder(by_s3[key])) == tree(LocalFolder(by_disk[key])), key
            assert not any(name.startswith(LOCK) for name in tree(LocalFolder(by_disk[key]))), "no lock is copied"
    for table in stream.tables(local):
        remote_path = table.path.replace(local.lake, remote.lake)
        assert table_version(remote_path) == table_version(table.path)
        assert sorted(read_table(remote_path).to_pylist(), key=str) == sorted(read_table(table.path).to_pylist(),
                                                                              key=str)
    assert summary(check_stream(stream, remote)) == summary(check_stream(stream, local))
    if action == "reset":
        assert by_disk["resumes_after_batch"] == 0 and by_s3["tables"]["sink"]["restored"]
        assert tree(on_s3.child("commits")) == ["0"] or tree(on_s3.child("commits")) == [".0.crc", "0"]
    elif action == "quarantine-offsets":
        assert by_s3["moved"] == ["2"] and folder(by_s3["quarantine"]).exists("2")
    elif action == "repin-query-id":
        assert by_s3["changed"] and on_s3.exists("metadata")


@pytest.mark.slow
def test_a_run_writing_its_tables_on_s3_survives_a_sigkill_mid_commit(tmp_path: Path, s3: str) -> None:
    """The rs engine on S3: executors write Parquet through delta-rs's object store, the driver commits with a
    conditional put. Killed between the sink's commit and the dead-letter table's, then rerun: both tables on S3
    equal the batch oracle over the same files. Then a silver stream reads the bronze table on S3 as a Delta
    source (its log and data files through the store) into a silver table there: the same rows."""
    from sluice.storage.delta import read_table
    from tests.helpers import expected_events, table_rows
    from tests.spark.test_crash_recovery import bronze, kill_at_then_rerun, submit
    from tests.spark.test_silver import COLUMNS, SILVER

    catalog_path = write_catalog(tmp_path, events_stream(trigger={"max_files_per_trigger": 1}), SILVER)
    stream = load_catalog(catalog_path).get("events")
    local = roots_in(tmp_path)
    roots = Roots(landing=local.landing, lake=uri(s3, "lake"), checkpoints=local.checkpoints)
    producer = DemoProducer(roots.landing, seed=33, malformed_rate=0.08)
    for index in range(3):
        producer.events_file(lines=40, now=NOW + dt.timedelta(minutes=index))
    kill_at_then_rerun(catalog_path, roots, "between_commits:1", tmp_path / "faults")

    expected_good, expected_bad = expected_events(Path(roots.landing) / "events")
    assert stream.sink_path(roots).startswith("s3://")
    assert bronze(stream.sink_path(roots)) == expected_good
    assert read_table(stream.dead_letter_table_path(roots)).num_rows == expected_bad

    silver = load_catalog(catalog_path).get("events_silver")
    assert observe(silver, roots).backlog.versions > 0, "bronze's versions wait for silver"
    run = submit(catalog_path, roots, stream="events_silver")
    output, _ = run.communicate(timeout=300)
    assert run.returncode == 0, output[-3000:]
    assert silver.sink_path(roots).startswith("s3://")
    assert table_rows(silver.sink_path(roots), COLUMNS) == table_rows(stream.sink_path(roots), COLUMNS)
    assert observe(silver, roots).backlog.versions == 0
    assert not (tmp_path / "lake").exists(), "nothing of the lake is written locally"


@needs_jvm_jars
def test_auto_takes_the_rs_engine_where_hadoop_cannot_reach_a_place(spark: Any) -> None:
    """delta-spark writes through Hadoop's file systems, which know no s3:// and need a connector for s3a://
    (the session has the jars `make venv` resolved); delta-rs reaches both."""
    from sluice.constants import DeltaEngine
    from sluice.errors import SluiceError
    from sluice_spark import session

    assert session.resolve_engine(spark, DeltaEngine.AUTO, ["/data/lake/t", "file:/data/checkpoints/t"]) \
        is DeltaEngine.JVM
    assert session.resolve_engine(spark, DeltaEngine.AUTO, ["/data/checkpoints/t", "s3://b/lake/t"]) is DeltaEngine.RS
    assert session.resolve_engine(spark, DeltaEngine.AUTO, ["s3a://b/lake/t"]) is DeltaEngine.JVM
    with pytest.raises(SluiceError, match=r"sink.engine is 'jvm'.*'s3://b/lake/t'.*write s3a://"):
        session.resolve_engine(spark, DeltaEngine.JVM, ["s3://b/lake/t"])
    assert session.resolve_engine(spark, DeltaEngine.RS, ["s3://b/lake/t"]) is DeltaEngine.RS


@needs_jvm_jars
def test_auto_takes_the_rs_engine_for_a_text_append_on_arrival(spark: Any, tmp_path: Path) -> None:
    """Where delta-spark loads, ``auto`` is still rs for a stream on arrival that appends text files (its runs are
    small, and the small-run paths are rs's), and the JVM's writer for a merge on arrival or a cron's append; the
    run's own engine wins."""
    from sluice.constants import DeltaEngine
    from sluice_spark.session import stream_engine

    arrival = {"poll": "1s", "settle": "1s"}
    catalog = load_catalog(write_catalog(
        tmp_path, events_stream("arriving", sink={"path": "bronze/a", "engine": "auto"}, arrival=arrival),
        events_stream("merging", sink={"path": "bronze/m", "engine": "auto", "mode": "merge", "keys": ["event_id"],
                                       "sequence_by": "event_time"}, arrival=arrival),
        events_stream("scheduled", sink={"path": "bronze/s", "engine": "auto"})))
    roots = roots_in(tmp_path)
    assert [stream_engine(spark, catalog.get(name), roots) for name in ("arriving", "merging", "scheduled")] == \
        [DeltaEngine.RS, DeltaEngine.JVM, DeltaEngine.JVM]
    assert stream_engine(spark, catalog.get("arriving"), roots, DeltaEngine.JVM) is DeltaEngine.JVM


@pytest.mark.slow
@needs_jvm_jars
def test_a_stream_wholly_on_s3a_runs_like_one_on_disk(tmp_path: Path, s3: str) -> None:
    """Spark through Hadoop's s3a connector (the jars `make venv` resolved): the landing zone, the checkpoint and the
    tables all on the S3 server, the jvm Delta engine. Killed mid-batch and rerun, then checked by the health gate,
    the lag probe and maintenance, and backfilled with replace twice: the table is the oracle's each time."""
    import subprocess
    import sys

    from sluice.operations.maintenance import maintain
    from tests.helpers import expected_events, spark_submit
    from tests.spark.test_crash_recovery import bronze, kill_at_then_rerun

    definition = events_stream(trigger={"max_files_per_trigger": 1})
    definition["sink"]["engine"] = "jvm"
    catalog_path = write_catalog(tmp_path, definition)
    catalog = load_catalog(catalog_path)
    stream = catalog.get("events")
    local = tmp_path / "landing"
    producer = DemoProducer(local, seed=35, malformed_rate=0.08)
    for index in range(3):
        producer.events_file(lines=40, now=NOW + dt.timedelta(minutes=index))
    upload(local, uri(s3, "landing"))
    roots = Roots(landing=f"s3a://{s3}/landing", lake=f"s3a://{s3}/lake", checkpoints=f"s3a://{s3}/checkpoints")

    kill_at_then_rerun(catalog_path, roots, "before_commit:1", tmp_path / "faults")
    good, bad = expected_events(local / "events")
    assert bronze(stream.sink_path(roots)) == good
    assert len(table_rows(stream.dead_letter_table_path(roots), ["reason"])) == bad
    assert not (tmp_path / "lake").exists() and not (tmp_path / "checkpoints").exists(), "nothing local"

    report = check_stream(stream, roots)
    assert report.status.value == "OK", report.findings
    assert observe(stream, roots).backlog.files == 0
    maintained = maintain(catalog, roots, ["events"])
    assert {table["role"] for table in maintained["events"]} >= {"sink", "dead_letter"}
    assert bronze(stream.sink_path(roots)) == good, "maintenance keeps every row"

    for attempt in range(2):  # replace gives the same table twice
        done = subprocess.run(
            spark_submit(str(PROJECT / "spark_apps" / "backfill_runner.py"), "--catalog", str(catalog_path),
                         "--stream", "events", "--start", NOW.isoformat(),
                         "--end", (NOW + dt.timedelta(hours=1)).isoformat(), "--select-by", "file_time",
                         "--mode", "replace", "--run-id", f"replace-{attempt}", *roots.as_args()),
            capture_output=True, text=True, timeout=600,
            env={**os.environ, **submit_options_env(), "PYSPARK_PYTHON": sys.executable})
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert bronze(stream.sink_path(roots)) == good
