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
