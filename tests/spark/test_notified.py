"""A landing zone on S3 told of its files by an SQS queue of S3 event notifications, end to end: moto's server (S3
and SQS, in server mode) and runs through Hadoop's s3a connector (the killed run and its rerun spark-submitted, the
clean runs on the test session, through the runner's own code). The table is the oracle's after
every run (each file's rows once); a notified run lists no landing folder (the server's request log says so) and
reads no file it was not told of; a lost message is caught by the next listing run, a message delivered twice reads
its file once, and a run SIGKILLed between its journal write and the messages' delete is exact when rerun."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.paths import Roots
from sluice.storage.notified import LISTED, journal
from sluice_spark.runner import run_streams
from tests.helpers import events_stream, expected_events, needs_jvm_jars, write_catalog
from tests.object_store import session_reaches
from tests.spark.test_crash_recovery import bronze, kill_at_then_rerun

pytestmark = [pytest.mark.spark, pytest.mark.slow]

NOW = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)
FOLDER = "landing/events"


class Landing:
    """Files made locally (the oracle reads them) and put into the bucket one by one, as a producer would."""

    def __init__(self, tmp_path: Path, server: Any, bucket: str) -> None:
        self.made = DemoProducer(tmp_path / "made", seed=39, malformed_rate=0.1)
        self.server, self.bucket = server, bucket
        self.read: list[Path] = []  # the files whose rows the table must hold
        self.minute = 0

    def put(self, *, counted: bool = True) -> str:
        self.minute += 1
        (path,) = self.made.events_file(lines=25, now=NOW + dt.timedelta(minutes=self.minute)).files
        key = f"{FOLDER}/{path.relative_to(self.made.landing / 'events').as_posix()}"
        self.server.client("s3").put_object(Bucket=self.bucket, Key=key, Body=path.read_bytes())
        if counted:
            self.read.append(path)
        return key

    def oracle(self) -> tuple[list[tuple[Any, ...]], int]:
        return expected_events(self.made.landing, files=self.read)


def run(spark: Any, catalog: Path, roots: Roots) -> dict[str, Any]:
    """A clean run on the session, through the runner's own code (the spark-submit runs are the killed one and its
    rerun); its stream's summary as the runner's summary file holds it."""
    summary = run_streams(spark, load_catalog(catalog), ["events"], roots)
    assert summary.ok, [stream.error for stream in summary.streams]
    return dict(json.loads(summary.to_json())["streams"][0])


def landing_listings(requests: list[str], bucket: str) -> list[str]:
    """The LIST requests of the landing folder itself (or a folder above it): what a notified run must not make.
    A LIST under a notified file's own key (``prefix=<key>/``, s3a's probe for a folder of that name) is not one."""
    listings = []
    for request in requests:
        match = re.match(rf"GET /{bucket}/?\?(\S*)", request)
        if match and "list-type" in match.group(1):
            prefix = re.search(r"(?:^|&)prefix=([^&]*)", match.group(1))
            value = prefix.group(1).replace("%2F", "/") if prefix else ""
            if FOLDER.startswith(value.rstrip("/")) or value.rstrip("/") == FOLDER:
                listings.append(request)
    return listings


@needs_jvm_jars
def test_a_notified_landing_zone_lands_each_file_once(spark: Any, tmp_path: Path, s3: str, s3_server: Any) -> None:
    with session_reaches(spark, s3_server):
        notified_landing_zone(spark, tmp_path, s3, s3_server)


def notified_landing_zone(spark: Any, tmp_path: Path, s3: str, s3_server: Any) -> None:
    queue = s3_server.notifying_queue(s3, f"{FOLDER}/", visibility_seconds=1)
    source = {**events_stream()["source"], "path": f"s3a://{s3}/{FOLDER}",
              "notifications": {"queue": queue, "list_every": "1 day"}}
    catalog = write_catalog(tmp_path, events_stream(source=source))
    stream = load_catalog(catalog).get("events")
    roots = Roots(landing=str(tmp_path / "landing"), lake=str(tmp_path / "lake"),
                  checkpoints=str(tmp_path / "checkpoints"))
    landing = Landing(tmp_path, s3_server, s3)

    # The first run lists: files may have landed before the queue was set up (and its message is journaled too).
    landing.put()
    first = run(spark, catalog, roots)
    assert "has not listed" in first["notified"]["listed"]
    assert bronze(stream.sink_path(roots)) == landing.oracle()[0]

    # A file whose message is lost; two notified ones, one of whose messages comes twice.
    unnotified = landing.put(counted=False)
    assert s3_server.lose_messages(queue) == 1
    landing.put()
    twice = landing.put()
    s3_server.client("sqs").send_message(QueueUrl=queue, MessageBody=json.dumps({"Records": [
        {"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
         "s3": {"bucket": {"name": s3}, "object": {"key": twice, "size": 1}}}]}))
    offset = s3_server.log_offset()
    notified = run(spark, catalog, roots)
    assert notified["notified"] == {"files": 2, "listed": None, "messages": 3}
    assert bronze(stream.sink_path(roots)) == landing.oracle()[0], "the notified files, once; not the unnotified"
    requests = s3_server.requests_since(offset)
    assert any(request.startswith("HEAD ") for request in requests), requests
    assert landing_listings(requests, s3) == [], "a notified run lists no landing folder"

    # Killed after its journal write, before the messages' delete: the rerun reads the file once, and the messages,
    # back in the queue, are journaled again and read no row twice.
    landing.put()
    kill_at_then_rerun(catalog, roots, "notified_journaled", tmp_path / "faults")
    assert bronze(stream.sink_path(roots)) == landing.oracle()[0]
    again = run(spark, catalog, roots)
    assert again["notified"]["files"] == 0 and again["batch_ids"] == []
    assert bronze(stream.sink_path(roots)) == landing.oracle()[0]

    # Once list_every has passed, a run lists: the file whose message was lost lands, nothing else again.
    journal(stream, roots).write_bytes(LISTED, json.dumps({"started_at": 0, "because": "a test"}).encode())
    lost = landing.made.landing / "events" / unnotified.removeprefix(f"{FOLDER}/")
    landing.read.append(lost)
    listing = run(spark, catalog, roots)
    assert "older than list_every" in listing["notified"]["listed"]
    good, bad = landing.oracle()
    assert bronze(stream.sink_path(roots)) == good
    assert listing["input_rows"] == sum(1 for line in lost.read_text().splitlines() if line.strip()) and bad > 0
    entries = [entry.name for entry in journal(stream, roots).entries() if entry.name.startswith("notified-")]
    assert entries == [], "the journal keeps only files no committed batch has read"
    shutil.rmtree(tmp_path / "made")
