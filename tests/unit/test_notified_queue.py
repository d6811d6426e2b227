"""``source.notifications`` against a real S3 + SQS server (moto's server mode; no Spark): S3 tells the queue of each
new object, a drain journals them beside the checkpoint and only then deletes the messages, the arrival watcher's
view comes from the queue without a listing, and the listing rule catches a queue that lost or garbled messages."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.model.stream import StreamSpec
from sluice.paths import Roots
from sluice.storage import notified
from sluice.storage.notified import LISTING_DUE, NotifiedRead, drain, listing_due, unrecorded, watch_unread
from tests.helpers import events_stream, write_catalog

PREFIX = "landing/events/"


@pytest.fixture
def world(s3: str, s3_server: Any, tmp_path: Path) -> tuple[StreamSpec, Roots, Any, str]:
    """A stream whose landing folder is notified through a new queue; its checkpoint on disk."""
    queue = s3_server.notifying_queue(s3, PREFIX, visibility_seconds=1)
    source = {**events_stream()["source"], "path": f"s3a://{s3}/{PREFIX.rstrip('/')}",
              "notifications": {"queue": queue, "list_every": "1 hour"}}
    stream = load_catalog(write_catalog(tmp_path, events_stream(source=source))).get("events")
    roots = Roots(landing=str(tmp_path / "landing"), lake=str(tmp_path / "lake"),
                  checkpoints=str(tmp_path / "checkpoints"))
    return stream, roots, s3_server, s3


def put(server: Any, bucket: str, *keys: str) -> list[str]:
    for key in keys:
        server.client("s3").put_object(Bucket=bucket, Key=key, Body=b'{"event_id": "1"}\n')
    return [f"s3a://{bucket}/{key}" for key in keys]


def queued(server: Any, stream: StreamSpec) -> int:
    attributes = server.client("sqs").get_queue_attributes(
        QueueUrl=stream.source.notifications.queue,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def mark_listed(stream: StreamSpec, roots: Roots, at: float) -> None:
    notified.after_run(stream, roots, NotifiedRead(None, listed="a test", started_at=at))


def test_a_drain_journals_the_folders_new_files_then_empties_the_queue(world: Any) -> None:
    stream, roots, server, bucket = world
    wanted = put(server, bucket, f"{PREFIX}a b.json", f"{PREFIX}day=1/b.json")
    put(server, bucket, f"{PREFIX}_tmp/c.json", f"{PREFIX}notes.txt", "landing/other/d.json", "elsewhere/e.json")
    drained = drain(stream, roots)
    assert (drained.messages, drained.files, drained.list_because) == (4, 2, None)  # one per object under PREFIX
    assert unrecorded(stream, roots) == sorted(wanted)
    assert queued(server, stream) == 0
    assert drain(stream, roots).messages == 0


def test_a_message_delivered_twice_is_one_file(world: Any) -> None:
    stream, roots, server, bucket = world
    (wanted,) = put(server, bucket, f"{PREFIX}a.json")
    event = {"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
                          "s3": {"bucket": {"name": bucket}, "object": {"key": f"{PREFIX}a.json", "size": 18}}}]}
    server.client("sqs").send_message(QueueUrl=stream.source.notifications.queue, MessageBody=json.dumps(event))
    drain(stream, roots)
    drain(stream, roots)
    assert unrecorded(stream, roots) == [wanted]


def test_a_kill_between_the_journal_and_the_delete_loses_nothing(world: Any) -> None:
    """The drain stops after its journal write (as a SIGKILL there would): the messages stay in the queue, come back
    once invisible no more, and are journaled again: the same files, once."""
    stream, roots, server, bucket = world
    wanted = put(server, bucket, f"{PREFIX}a.json", f"{PREFIX}b.json")

    class Killed(Exception):
        pass

    def killed() -> None:
        raise Killed

    with pytest.raises(Killed):
        drain(stream, roots, after_journal=killed)
    assert unrecorded(stream, roots) == wanted
    assert queued(server, stream) == 2, "a message is deleted only after its journal write"
    time.sleep(1.5)  # the queue's visibility timeout (1 s): the messages come back
    assert drain(stream, roots).messages == 2
    assert unrecorded(stream, roots) == wanted and queued(server, stream) == 0


def test_the_listing_rule(world: Any) -> None:
    stream, roots, server, _ = world
    assert "has not listed" in (listing_due(stream, roots) or "")
    mark_listed(stream, roots, at=1_000_000.0)
    assert listing_due(stream, roots, now=1_000_000.0 + 3599) is None
    assert "older than list_every" in (listing_due(stream, roots, now=1_000_000.0 + 3600) or "")
    mark_listed(stream, roots, at=time.time() - 1)
    assert listing_due(stream, roots) is None
    server.client("sqs").send_message(QueueUrl=stream.source.notifications.queue, MessageBody="hello")
    assert drain(stream, roots).list_because == "the queue held a message that is no S3 event"
    assert listing_due(stream, roots) == "the queue held a message that is no S3 event"
    mark_listed(stream, roots, at=time.time())  # a listing run after the garbled message clears it
    assert listing_due(stream, roots) is None


def test_a_message_near_the_queues_retention_makes_a_listing(world: Any) -> None:
    stream, roots, server, bucket = world
    put(server, bucket, f"{PREFIX}a.json")
    # Seen three days later, in a queue that keeps messages four days: older ones may have expired.
    assert "waited" in (drain(stream, roots, now=time.time() + 3 * 86_400).list_because or "")


def test_the_watcher_sees_the_queue_and_never_lists_the_bucket(world: Any) -> None:
    stream, roots, server, bucket = world
    mark_listed(stream, roots, at=time.time())
    put(server, bucket, f"{PREFIX}never-notified.json")
    assert server.lose_messages(stream.source.notifications.queue) == 1
    wanted = put(server, bucket, f"{PREFIX}a.json")
    offset = server.log_offset()
    assert watch_unread(stream, roots) == frozenset(wanted)
    requests = server.requests_since(offset)
    assert requests and not any(request.startswith(f"GET /{bucket}") for request in requests), requests
    mark_listed(stream, roots, at=0.0)  # list_every has passed: the watcher starts the run that lists
    assert watch_unread(stream, roots) == frozenset(
        {*wanted, LISTING_DUE + "its last listing is older than list_every (3600s)"})


@pytest.mark.parametrize("connection", [None, "sluice_queue"])
def test_the_arrival_trigger_fires_from_the_queue_without_listing(
        s3: str, s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, connection: str | None) -> None:
    """With a queue connection, the trigger reads it on the triggerer and reaches the queue with it alone."""
    import asyncio

    from sluice_airflow.triggers import StreamArrivalTrigger

    queue = s3_server.notifying_queue(s3, PREFIX)
    source = {**events_stream()["source"], "path": f"s3a://{s3}/{PREFIX.rstrip('/')}",
              "notifications": {"queue": queue, **({"connection": connection} if connection else {})}}
    if connection:
        monkeypatch.setenv("AIRFLOW_CONN_SLUICE_QUEUE", json.dumps({
            "conn_type": "aws", "login": "queue-key", "password": "queue-secret-1234",
            "extra": {"region_name": "us-east-1", "endpoint_url": s3_server.endpoint}}))
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing there: the connection's is used
    catalog = write_catalog(tmp_path, events_stream(source=source, arrival={"poll": "1s", "settle": "1s"}))
    monkeypatch.setenv("SLUICE_CATALOG", str(catalog))
    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    stream = load_catalog(catalog).get("events")
    mark_listed(stream, Roots.from_env(), at=time.time())
    offset = s3_server.log_offset()

    async def first_event() -> dict[str, Any]:
        events = StreamArrivalTrigger(stream="events").run()
        wanted = put(s3_server, s3, f"{PREFIX}a.json")
        event = await asyncio.wait_for(anext(events), timeout=30)
        await events.aclose()
        assert event.payload["examples"] == wanted
        return dict(event.payload)

    assert asyncio.run(first_event())["new"] == 1
    requests = s3_server.requests_since(offset)
    assert not any(request.startswith(f"GET /{s3}") for request in requests), requests


def committed(roots: Roots, stream: StreamSpec, *paths: str) -> None:
    """Spark's checkpoint after batch 0 read ``paths`` and committed: its file source log and its commit."""
    checkpoint = Path(stream.checkpoint_path(roots))
    (checkpoint / "sources" / "0").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    (checkpoint / "sources" / "0" / "0").write_text("v1\n" + "".join(
        json.dumps({"path": path, "timestamp": 1_000, "batchId": 0}) + "\n" for path in paths))
    (checkpoint / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_a_run_reads_the_unrecorded_files_and_the_journal_keeps_only_those(world: Any) -> None:
    stream, roots, server, bucket = world
    mark_listed(stream, roots, at=time.time())
    read_before = put(server, bucket, f"{PREFIX}a.json")
    drain(stream, roots)
    new = put(server, bucket, f"{PREFIX}day=2/b.json", f"{PREFIX}c d.json")
    committed(roots, stream, *read_before)
    plan = notified.plan_read(stream, roots)
    assert plan.listed is None and plan.files == 2 and plan.drained.messages == 2
    assert plan.path == f"s3a://{bucket}/{{{PREFIX}c d.json,{PREFIX}day=2/b.json}}"
    assert sorted(new) == unrecorded(stream, roots)
    notified.after_run(stream, roots, plan)
    left = [entry.name for entry in notified.journal(stream, roots).entries() if entry.name.startswith("notified-")]
    assert len(left) == 1, "the drain whose file a committed batch read is gone; the unread one stays"


def test_nothing_notified_reads_a_name_that_cannot_exist(world: Any) -> None:
    stream, roots, _, bucket = world
    mark_listed(stream, roots, at=time.time())
    plan = notified.plan_read(stream, roots)
    assert (plan.path, plan.files, plan.listed) == (f"s3a://{bucket}/{{{PREFIX}_sluice_nothing_notified}}", 0, None)


def test_a_queue_that_cannot_be_read_makes_a_listing_run(world: Any, tmp_path: Path) -> None:
    stream, roots, server, _ = world
    mark_listed(stream, roots, at=time.time())
    source = {**events_stream()["source"], "path": stream.source.path,
              "notifications": {"queue": f"{server.endpoint}/123456789012/no-such-queue"}}
    (tmp_path / "other").mkdir()
    missing = load_catalog(write_catalog(tmp_path / "other", events_stream(source=source))).get("events")
    plan = notified.plan_read(missing, roots)
    assert plan.path is None and (plan.listed or "").startswith("the queue could not be read")


def test_a_backlog_larger_than_a_glob_names_is_listed(world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    stream, roots, server, bucket = world
    mark_listed(stream, roots, at=time.time())
    put(server, bucket, f"{PREFIX}a.json", f"{PREFIX}b.json")
    monkeypatch.setattr(notified, "MAX_NOTIFIED_FILES", 1)
    plan = notified.plan_read(stream, roots)
    assert plan.path is None and "2 notified files are unread" in (plan.listed or "")


def test_a_queue_connection_reaches_the_run_apart_from_the_stores_credentials(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``source.notifications.connection``: the operator passes it to the driver as one variable (the kinds'
    credentials, as a Kafka connection goes), its secret masked and scrubbed; the drain reaches the queue with it
    alone (the environment's endpoint is gone)."""
    from sluice.kinds.credentials import connection_environments, run_secrets

    stream, roots, server, bucket = world
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_QUEUE", json.dumps({
        "conn_type": "aws", "login": "queue-key", "password": "queue-secret-1234",
        "extra": {"region_name": "us-east-1", "endpoint_url": server.endpoint}}))
    source = {**events_stream()["source"], "path": stream.source.path,
              "notifications": {"queue": stream.source.notifications.queue, "connection": "sluice_queue"}}
    (roots_dir := Path(roots.checkpoints).parent / "with-connection").mkdir()
    queued_stream = load_catalog(write_catalog(roots_dir, events_stream(source=source))).get("events")
    (found,) = connection_environments([queued_stream])
    assert found.conn_id == "sluice_queue" and "queue-secret-1234" in found.secrets
    assert "queue-secret-1234" not in found.description
    for name, value in found.env.items():
        monkeypatch.setenv(name, value)
    assert "queue-secret-1234" in run_secrets()
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    wanted = put(server, bucket, f"{PREFIX}a.json")
    assert drain(queued_stream, roots).files == 1 and unrecorded(queued_stream, roots) == wanted


def listed(requests: list[str], bucket: str) -> list[str]:
    """The listings of the bucket among moto's logged requests (``GET /bucket?list-type=2...``; a HEAD or GET of
    one object names its key after the bucket)."""
    return [request for request in requests
            if request.startswith(f"GET /{bucket}?") or request.startswith(f"GET /{bucket} ")]


def read_by_batch_zero(roots: Roots, stream: StreamSpec, server: Any, bucket: str, *paths: str) -> None:
    """Spark's checkpoint after batch 0 read ``paths`` and committed, with each file's real modification time."""
    s3 = server.client("s3")
    checkpoint = Path(stream.checkpoint_path(roots))
    (checkpoint / "sources" / "0").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    lines = []
    for path in paths:
        modified = s3.head_object(Bucket=bucket, Key=path.split("/", 3)[3])["LastModified"].timestamp()
        lines.append(json.dumps({"path": path, "timestamp": int(modified * 1000), "batchId": 0}) + "\n")
    (checkpoint / "sources" / "0" / "0").write_text("v1\n" + "".join(lines))
    (checkpoint / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_the_lag_probe_counts_the_journal_and_the_queue_without_listing(world: Any) -> None:
    """The backlog of a notified stream: the journaled files the source log has not recorded as committed (with
    the size their events told), plus one file per message still in the queue; no listing, no message taken."""
    from sluice.lag.observe import observe

    stream, roots, server, bucket = world
    mark_listed(stream, roots, at=time.time())
    read, unread = put(server, bucket, f"{PREFIX}a.json", f"{PREFIX}b.json")
    drain(stream, roots)
    put(server, bucket, f"{PREFIX}c.json")  # still in the queue
    read_by_batch_zero(roots, stream, server, bucket, read)
    offset = server.log_offset()
    backlog = observe(stream, roots).backlog
    assert not listed(server.requests_since(offset), bucket), server.requests_since(offset)
    assert (backlog.files, backlog.bytes, backlog.arrivals) == (2, len(b'{"event_id": "1"}\n'), frozenset({unread}))
    assert backlog.oldest_unread_at is not None and abs(backlog.oldest_unread_at - time.time()) < 60
    assert any("1 message(s) wait in the notification queue" in note for note in backlog.notes), backlog.notes
    assert queued(server, stream) == 1, "the probe only looks at the queue"


def test_the_lag_probe_says_a_listing_is_due_and_an_unreadable_queue(world: Any, tmp_path: Path) -> None:
    stream, roots, server, bucket = world
    from sluice.lag.observe import observe

    source = {**events_stream()["source"], "path": stream.source.path,
              "notifications": {"queue": f"{server.endpoint}/123456789012/no-such-queue"}}
    (tmp_path / "other").mkdir()
    missing = load_catalog(write_catalog(tmp_path / "other", events_stream(source=source))).get("events")
    offset = server.log_offset()
    backlog = observe(missing, roots).backlog
    assert not listed(server.requests_since(offset), bucket)
    assert backlog.files == 0 and any("could not be read" in note for note in backlog.notes), backlog.notes
    assert any("the next run lists the landing folder (the stream has not listed" in note for note in backlog.notes)


def cleaning(stream: StreamSpec, tmp_path: Path, roots: Roots) -> StreamSpec:
    """The stream with ``source.clean: {action: delete, after: 1 hour}``, on the same roots."""
    source = {**events_stream()["source"], "path": stream.source.path,
              "notifications": {"queue": stream.source.notifications.queue, "list_every": "1 hour"},
              "clean": {"action": "delete", "after": "1 hour"}}
    (tmp_path / "cleaning").mkdir()
    return load_catalog(write_catalog(tmp_path / "cleaning", events_stream(source=source))).get("events")


def test_a_notified_clean_lists_nothing_and_asks_only_for_the_files_it_cleans(world: Any, tmp_path: Path) -> None:
    """The clean of a notified landing zone takes its candidates from the source log: the files of committed
    batches, each looked up by name before it is deleted; an unread file is never touched; a second clean asks the
    store nothing about the files the first one finished."""
    from sluice.storage.clean import clean_landing

    stream, roots, server, bucket = world
    stream = cleaning(stream, tmp_path, roots)
    read = put(server, bucket, f"{PREFIX}a.json", f"{PREFIX}day=1/b c.json")
    (unread,) = put(server, bucket, f"{PREFIX}d.json")
    read_by_batch_zero(roots, stream, server, bucket, *read)
    s3 = server.client("s3")

    def keys() -> list[str]:
        return sorted(found["Key"] for found in s3.list_objects_v2(Bucket=bucket).get("Contents", []))

    young = clean_landing(stream, roots, now=time.time())
    assert (young.deleted, young.waiting) == (0, 2), "younger than `after`: kept"
    offset = server.log_offset()
    report = clean_landing(stream, roots, now=time.time() + 3700)
    requests = server.requests_since(offset)
    assert (report.deleted, report.waiting, report.held, report.changed) == (2, 0, 0, 0)
    assert not listed(requests, bucket), requests
    assert keys() == [unread.split("/", 3)[3]]
    offset = server.log_offset()
    again = clean_landing(stream, roots, now=time.time() + 3700)
    assert again.to_dict() == {"archived": 0, "deleted": 0, "waiting": 0, "held": 0, "changed": 0,
                               "log_pruned": 0, "folders_removed": 0}
    assert not server.requests_since(offset), "every file of batch 0 is done: nothing to ask"


def test_a_notified_clean_leaves_a_file_written_again_and_one_a_backfill_holds(world: Any, tmp_path: Path) -> None:
    from sluice.storage.clean import BACKFILL_ROOT, clean_landing

    stream, roots, server, bucket = world
    stream = cleaning(stream, tmp_path, roots)
    held, rewritten, plain = put(server, bucket, f"{PREFIX}held.json", f"{PREFIX}rewritten.json",
                                f"{PREFIX}plain.json")
    read_by_batch_zero(roots, stream, server, bucket, held, rewritten, plain)
    log = Path(stream.checkpoint_path(roots)) / "sources" / "0" / "0"
    header, *entries = log.read_text().splitlines()
    entries = [json.loads(line) for line in entries]
    for entry in entries:
        entry["timestamp"] -= 5000 if entry["path"] == rewritten else 0  # the batch read an older file of that name
    log.write_text("\n".join([header, *map(json.dumps, entries)]) + "\n")
    plan = Path(roots.checkpoints) / BACKFILL_ROOT / stream.name / "b1"
    plan.mkdir(parents=True)
    (plan / "plan.json").write_text(json.dumps({"files": [{"path": held}]}))
    report = clean_landing(stream, roots, now=time.time() + 3700)
    assert (report.deleted, report.held, report.changed) == (1, 1, 1)
    (plan / "done").write_text("")
    assert clean_landing(stream, roots, now=time.time() + 3700).deleted == 1, "the backfill finished: its file goes"
