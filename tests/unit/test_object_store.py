"""The storage layer and the lock on a real S3-compatible server (moto's server mode on 127.0.0.1), beside the same
calls on a local folder."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sluice.limits import CHECKPOINT_FILE_MAX_BYTES
from sluice.storage.checkpoint import CheckpointError, CheckpointReader, ensure_query_id, read_query_id
from sluice.storage.lock import LOCK_FILE, LockHeld, LockInfo
from sluice.storage.object_lock import ObjectLock, lock_for, read_lock_at, require_conditional_writes
from sluice.storage.store import (
    AlreadyExists,
    Changed,
    Folder,
    LocalFolder,
    NoConditionalWrites,
    NotReadable,
    StoreError,
    folder,
)
from tests.object_store import uri


def both(tmp_path: Path, bucket: str) -> list[Folder]:
    return [LocalFolder(tmp_path / "local"), folder(uri(bucket, "remote"))]


def test_a_folder_reads_lists_and_writes_the_same_on_disk_and_on_s3(tmp_path: Path, s3: str) -> None:
    for place in both(tmp_path, s3):
        assert place.entries() == [] and not place.is_dir() and place.stat("x") is None
        place.child("offsets").write_bytes("0", b"v1\n{}\n")
        place.write_bytes("metadata", b'{"id": "q"}\n')
        assert [(entry.name, entry.is_dir) for entry in place.entries()] == [("metadata", False), ("offsets", True)]
        assert place.read_text("metadata") == '{"id": "q"}\n' and place.child("offsets").stat("0").size == 6
        assert place.read_head("metadata", 5) == b'{"id"' and place.read_head("metadata", 99) == b'{"id": "q"}\n'
        assert place.total_bytes() == 6 + 12
        with pytest.raises(FileNotFoundError):
            place.read_bytes("nothing")
        version = place.create("lock", b"1")
        with pytest.raises(AlreadyExists):
            place.create("lock", b"2")
        newer = place.replace("lock", b"3", version)
        with pytest.raises(Changed):
            place.replace("lock", b"4", version)
        assert place.versioned("lock") == (b"3", newer)
        place.delete("lock")
        place.delete("lock")
        assert not place.exists("lock")


def test_a_folder_moves_copies_and_finds_its_siblings_the_same_on_disk_and_on_s3(tmp_path: Path, s3: str) -> None:
    """What the repair actions do to a checkpoint: a file and a subfolder (every object under its prefix) moved
    beside it, a copy without the lock, and a sibling's name."""
    for place in both(tmp_path, s3):
        checkpoint = place.child("events")
        checkpoint.child("offsets").write_bytes("3", b"v1\n")
        checkpoint.child("state", "0", "1").write_bytes("4.delta", b"s")
        checkpoint.child("state", "0").write_bytes("_metadata", b"m")
        checkpoint.write_bytes(LOCK_FILE, b"{}")
        backup = checkpoint.sibling("events.backup-1")
        assert backup.uri == f"{place.uri}/events.backup-1"

        checkpoint.copy_tree(backup, skip=lambda name: name == LOCK_FILE)
        aside = checkpoint.sibling("events.reset-1")
        checkpoint.move("offsets/3", aside)
        checkpoint.move("state", aside)

        def files(root: Folder) -> list[str]:
            return sorted(relative for relative, _ in root.walk())

        assert files(backup) == ["offsets/3", "state/0/1/4.delta", "state/0/_metadata"]
        assert files(aside) == ["offsets/3", "state/0/1/4.delta", "state/0/_metadata"]
        assert files(checkpoint) == [LOCK_FILE] and aside.child("state", "0", "1").read_bytes("4.delta") == b"s"
    with pytest.raises(StoreError, match="another store"):
        folder(uri(s3, "a")).move("x", LocalFolder(tmp_path / "b"))
    with pytest.raises(StoreError, match="root of its bucket"):
        folder(f"s3://{s3}").sibling("other")


def test_scoped_credentials_take_each_store_s_own_keys() -> None:
    from sluice.storage.credentials import store_config

    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
           "AWS_ALLOW_HTTP": "true", "AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_SAS_KEY": "sas",
           "GOOGLE_SERVICE_ACCOUNT_KEY": "{}"}
    scoped = tuple(sorted(env.items()))
    assert store_config("s3", scoped) == ({"access_key_id": "k", "secret_access_key": "s",
                                           "endpoint": "http://127.0.0.1:9"}, {"allow_http": True})
    assert store_config("abfss", scoped) == ({"account_name": "acct", "sas_key": "sas"}, {})
    assert store_config("gs", scoped)[0] == {"service_account_key": "{}"}


def test_a_file_uri_on_a_store_is_percent_encoded_as_spark_records_it() -> None:
    from sluice.storage.checkpoint import local_file_path
    from sluice.storage.landing import spark_file_uri

    assert spark_file_uri("s3a://bucket/landing/a b%.json") == "s3a://bucket/landing/a%20b%25.json"
    assert local_file_path(spark_file_uri("s3a://bucket/landing/a b%.json")) == "s3a://bucket/landing/a b%.json"
    assert spark_file_uri("/data/landing/a b.json") == "file:/data/landing/a%20b.json"


def test_listing_a_large_prefix_pages_through_the_store_without_reading_objects(s3: str) -> None:
    """S3 answers a listing 1,000 keys at a time: the folder follows the continuation."""
    logs = folder(uri(s3, "checkpoint", "offsets"))
    for batch in range(1_005):
        logs.write_bytes(str(batch), b"v1\n{}\n")
    reader = CheckpointReader(uri(s3, "checkpoint"))
    assert reader.offset_ids() == list(range(1_005))


def test_the_query_id_is_pinned_once_on_s3(s3: str) -> None:
    checkpoint = uri(s3, "checkpoints", "events")
    assert read_query_id(checkpoint) is None
    first = ensure_query_id(checkpoint)
    assert ensure_query_id(checkpoint) == first == read_query_id(checkpoint)


def holder(stream: str = "events", *, age: float = 0.0) -> bytes:
    now = time.time() - age
    info = LockInfo(stream, "other-run", "elsewhere", 4242, now, now, 60, "their-token")
    return json.dumps(info.__dict__).encode()


def test_two_writers_racing_for_the_lock_one_wins(s3: str) -> None:
    checkpoint = uri(s3, "checkpoints", "events")
    start = threading.Barrier(2)
    outcome: dict[str, Any] = {}

    def take(name: str) -> None:
        lock = lock_for(checkpoint, "events", name)
        start.wait()
        try:
            lock.acquire()
            outcome[name] = lock
        except LockHeld as exc:
            outcome[name] = exc

    threads = [threading.Thread(target=take, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [value for value in outcome.values() if isinstance(value, ObjectLock)]
    losers = [value for value in outcome.values() if isinstance(value, LockHeld)]
    assert len(winners) == 1 and len(losers) == 1
    assert read_lock_at(checkpoint).token == winners[0].token
    winners[0].release()
    assert read_lock_at(checkpoint) is None


def test_a_stale_lock_is_taken_over_and_a_live_one_is_not(s3: str) -> None:
    checkpoint = uri(s3, "checkpoints", "events")
    place = folder(checkpoint)
    place.write_bytes(LOCK_FILE, holder(age=30))
    with pytest.raises(LockHeld, match="other-run"):
        lock_for(checkpoint, "events", "mine").acquire()
    place.write_bytes(LOCK_FILE, holder(age=600))
    with lock_for(checkpoint, "events", "mine") as lock:
        assert read_lock_at(checkpoint).run_id == "mine" and not lock.lost


def test_two_runs_taking_over_one_stale_lock_one_wins(s3: str) -> None:
    """Both judge the lock stale; the replace is conditional on the version they judged, so one of them fails
    and looks again, and finds the winner's live lock."""
    checkpoint = uri(s3, "checkpoints", "events")
    folder(checkpoint).write_bytes(LOCK_FILE, holder(age=600))
    first, second = ObjectLock(folder(checkpoint), "events", "a"), ObjectLock(folder(checkpoint), "events", "b")
    for lock in (first, second):
        lock._info = LockInfo("events", lock.run_id, "h", 1, time.time(), time.time(), 60, lock.token)
    stale = folder(checkpoint).versioned(LOCK_FILE)
    assert first._take_over_if_stale() is True
    # The second run read the same stale version before the first replaced it.
    with pytest.raises(Changed):
        folder(checkpoint).replace(LOCK_FILE, b"{}", stale[1])
    with pytest.raises(LockHeld, match="run 'a'"):
        second._take_over_if_stale()


def test_the_heartbeat_keeps_the_lock_and_notices_when_it_was_taken(s3: str) -> None:
    checkpoint = uri(s3, "checkpoints", "events")
    lock = ObjectLock(folder(checkpoint), "events", "mine", expires_after_seconds=60, heartbeat_seconds=0.05)
    lock.acquire()
    try:
        beat = read_lock_at(checkpoint).heartbeat_at
        deadline = time.monotonic() + 10
        while read_lock_at(checkpoint).heartbeat_at == beat and time.monotonic() < deadline:
            time.sleep(0.02)
        assert read_lock_at(checkpoint).heartbeat_at > beat, "the heartbeat moves"
        folder(checkpoint).write_bytes(LOCK_FILE, holder())
        while not lock.lost and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lock.lost, "a replaced lock is noticed"
    finally:
        lock.release()
    assert read_lock_at(checkpoint).run_id == "other-run", "release leaves another run's lock alone"


class IgnoresPreconditions(LocalFolder):
    """A store that accepts every write, as a gateway that drops the If-None-Match header does (no such gateway
    runs here, so this one is simulated)."""

    def create(self, name: str, data: bytes) -> str:
        self.write_bytes(name, data)
        return "v"

    def child(self, *names: str) -> IgnoresPreconditions:
        return IgnoresPreconditions(self.path.joinpath(*names))


def test_a_store_without_conditional_writes_is_refused(tmp_path: Path) -> None:
    store = IgnoresPreconditions(tmp_path / "checkpoint")
    store.uri = "s3://gateway/checkpoint"
    with pytest.raises(NoConditionalWrites, match="does not honour conditional writes"):
        require_conditional_writes(store)
    with pytest.raises(NoConditionalWrites):
        ObjectLock(store, "events", "mine").acquire()


def test_the_landing_zone_on_s3_is_listed_as_spark_would_and_its_backlog_measured(tmp_path: Path, s3: str) -> None:
    """The same landing layout on disk and on S3, each with a source log in Spark's format (Spark itself cannot
    write an s3a:// log here: hadoop-aws comes from Maven). Both give the same unread files and backlog."""
    from sluice.catalog import parse_stream
    from sluice.kinds import source_kind
    from sluice.paths import Roots
    from sluice.storage.landing import SourceState, list_landing_zone, unread_files
    from tests.helpers import events_stream

    source = {**events_stream()["source"], "options": {"pathGlobFilter": "*.json"}}
    stream = parse_stream(events_stream(source=source), index=0)
    names = ["day=1/a.json", "day=1/b.json", "day=2/c.json", "day=2/d.csv", "_temporary/e.json", "nested/f.json"]
    results = []
    for landing_root, checkpoint_root in ((str(tmp_path / "landing"), str(tmp_path / "checkpoints")),
                                          (f"s3a://{s3}/landing", uri(s3, "checkpoints"))):
        roots = Roots(landing=landing_root, lake=str(tmp_path / "lake"), checkpoints=checkpoint_root)
        landing = folder(stream.source_path(roots))
        for name in names:
            *parents, file = name.split("/")
            landing.child(*parents).write_bytes(file, b'{"event_id": "1"}\n')
        recorded = {landing.where("day=1/a.json"): 0, landing.where("day=1/b.json"): 1}
        if landing_root.startswith("/"):
            recorded = {Path(path).as_uri(): batch for path, batch in recorded.items()}
        checkpoint = folder(stream.checkpoint_path(roots))
        for batch in (0, 1):
            lines = [json.dumps({"path": path, "timestamp": int(time.time() * 1000), "batchId": batch})
                     for path, b in recorded.items() if b == batch]
            checkpoint.child("sources", "0").write_bytes(str(batch), ("v1\n" + "\n".join(lines) + "\n").encode())
        checkpoint.child("commits").write_bytes("0", b'v1\n{"nextBatchWatermarkMs":0}')
        reader = CheckpointReader(stream.checkpoint_path(roots))
        unread = unread_files(stream, roots, SourceState.of(stream, reader))
        listed, links = list_landing_zone(stream, roots)
        backlog = source_kind(stream.source).backlog(stream, roots, reader)
        base = stream.source_path(roots).rstrip("/") + "/"
        results.append(([found.path.removeprefix(base) for found in unread.files],
                        [found.path.removeprefix(base) for found in listed], links, backlog.files, backlog.bytes))
    on_disk, on_s3 = results
    # b.json: planned by the uncommitted batch 1, read again; c.json: new. d.csv: not the glob; _temporary/ and
    # nested/ (not a partition folder, no recursiveFileLookup): not listed by Spark.
    assert on_disk == (["day=1/b.json", "day=2/c.json"], ["day=1/a.json", "day=1/b.json", "day=2/c.json"], [], 2, 36)
    assert on_s3 == on_disk


def test_a_heartbeat_whose_reply_was_lost_keeps_the_lock(s3: str) -> None:
    """The store took the beat but the reply never came: the next beat finds another version, holding this run's
    token, and adopts it instead of stopping the run."""
    checkpoint = uri(s3, "checkpoints", "events")
    lock = ObjectLock(folder(checkpoint), "events", "mine", expires_after_seconds=60, heartbeat_seconds=0.05)
    lock.acquire()
    try:
        mine = folder(checkpoint).versioned(LOCK_FILE)
        assert mine is not None
        folder(checkpoint).write_bytes(LOCK_FILE, mine[0])  # a new version of our own lock
        beat = read_lock_at(checkpoint).heartbeat_at
        deadline = time.monotonic() + 10
        while read_lock_at(checkpoint).heartbeat_at == beat and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not lock.lost and read_lock_at(checkpoint).heartbeat_at > beat
    finally:
        lock.release()
    assert read_lock_at(checkpoint) is None


def test_s3a_and_s3_are_one_store_in_the_overlap_checks() -> None:
    from sluice.paths import resolved_key

    assert resolved_key("s3://b/lake", "t1") == resolved_key("s3a://b/lake", "t1"), "s3a:// and s3:// are one store"


def test_a_bounded_read_refuses_more_than_its_limit_on_disk_and_on_s3(tmp_path: Path, s3: str) -> None:
    """A checkpoint file is read whole only up to a cap: a planted object of gigabytes is refused from its size,
    before its body is read."""
    for place in both(tmp_path, s3):
        place.child("offsets").write_bytes("0", b"v1\n{}\n" + b"x" * 100)
        assert place.child("offsets").read_bounded("0", 200).startswith(b"v1\n")
        with pytest.raises(NotReadable, match="offsets/0: larger than 50 bytes"):
            place.child("offsets").read_bounded("0", 50)
        with pytest.raises(FileNotFoundError):
            place.read_bounded("nothing", 50)
        place.child("offsets").write_bytes("1", b"v1\n" + b"{}" * (CHECKPOINT_FILE_MAX_BYTES // 2))
        with pytest.raises(CheckpointError, match="offsets/1: larger than"):
            CheckpointReader(place).read_offsets(1)
