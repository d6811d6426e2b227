"""Notifications instead of listings (``source.notifications``): a file stream whose landing zone is on S3 learns of
its new files from an SQS queue of the bucket's S3 event notifications, so that neither its runs nor its arrival
watcher list the bucket.

**The journal.** Messages are drained from the queue into a journal beside the stream's checkpoint
(``<checkpoint>/sluice/notified/``): each drain writes one small JSON file of the object URIs it received, whole or
not at all, and only then deletes the messages from the queue. A kill between the two leaves the messages in the
queue and their files in the journal; the messages come back and are journaled again, which is harmless (the
journal is a set, and Spark's file source log reads a path once). The arrival watcher drains as it polls; a run
drains when it starts.

**A notified run** reads exactly the journaled files the source log has not recorded: it gives Spark one glob of
their URIs whose braces Hadoop expands before it matches (``s3a://bucket/{folder/a.json,folder/b.json}``), so that
Spark asks the store about each file by its own name and never lists the landing folder. Spark's file source log
still decides what is new: a file journaled twice, or read by an earlier listing, is not read again.

**A listing run** reads the landing folder as a stream without notifications does. A run lists when
(:func:`listing_due`):

- the stream has never listed since it got ``notifications`` (files that landed before the queue was set up);
- its last listing is older than ``list_every`` (a message lost without a trace: deleted by hand, moved to a
  dead-letter queue after too many receives, or an event S3 did not send);
- a drain received a message it could not read as an S3 event, or one that had waited in the queue more than half
  of the queue's retention period (a queue that far behind may already have dropped older messages), or the name of
  a file that a glob cannot name (``{``, ``,``...);
- the queue could not be read at all (the run's data still lands; the summary and the log say why);
- more than :data:`MAX_NOTIFIED_FILES` journaled files are unread (a backlog a listing reads more cheaply).

A listing run's files are recorded by the same paths as a notified run's, so nothing is read twice either way.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple
from urllib.parse import unquote_plus

from sluice.errors import SluiceError
from sluice.model.stream import StreamSpec
from sluice.paths import Roots
from sluice.storage.checkpoint import CheckpointReader
from sluice.storage.credentials import current
from sluice.storage.landing import SourceFile, SourceState, listing_rule
from sluice.storage.store import Folder, folder

log = logging.getLogger(__name__)

#: The journal's folder, under the stream's checkpoint.
JOURNAL = "sluice/notified"
#: The journal's record of the stream's last listing run.
LISTED = "listed.json"
#: A journal file's name: ``notified-<ns since the epoch>-<random>.json``.
_PREFIX = "notified-"
#: Characters Hadoop's glob cannot take inside a brace alternation, even escaped: a file so named is read by listing.
_UNGLOBBABLE = frozenset("\\{}[]*?,^")
#: Messages one drain takes at most: the rest wait in the queue for the next drain.
MAX_MESSAGES_PER_DRAIN = 10_000
#: The most unread notified files a run names in its glob; a larger backlog is read by listing the landing folder
#: (a request per file stops paying off, and the glob is a path string Spark carries in its plan).
MAX_NOTIFIED_FILES = 10_000
#: What the arrival watcher reports as unread when a listing run is due: it starts the run that lists.
LISTING_DUE = "listing due: "


@dataclass
class Drained:
    """What one drain took from the queue: messages, the object URIs among them under the source folder, and why
    the next run must list (None when it need not, as far as the queue can tell)."""

    messages: int = 0
    files: int = 0
    list_because: str | None = None


@dataclass
class NotifiedRead:
    """What a run of a notified stream reads: ``path`` (a glob of the notified files; None to list the landing
    folder, because ``listed`` says why), counted for the run's summary."""

    path: str | None
    files: int = 0
    listed: str | None = None
    drained: Drained = field(default_factory=Drained)
    started_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return {"files": self.files, "listed": self.listed, "messages": self.drained.messages}


def notifications(stream: StreamSpec) -> Any:
    """The stream's :class:`~sluice.kinds.files.NotificationSpec` (storage does not import the kinds)."""
    spec = getattr(stream.source, "notifications", None)
    if spec is None:
        raise SluiceError(f"stream {stream.name!r} has no source.notifications")
    return spec


def journal(stream: StreamSpec, roots: Roots) -> Folder:
    return folder(stream.checkpoint_path(roots)).child(*JOURNAL.split("/"))


def _source_prefix(stream: StreamSpec, roots: Roots) -> tuple[str, str]:
    """The landing folder's bucket and key prefix (with its trailing slash)."""
    location = stream.source_path(roots).rstrip("/")
    scheme, _, rest = location.partition("://")
    bucket, _, prefix = rest.partition("/")
    if scheme not in ("s3a", "s3") or not prefix:
        raise SluiceError(f"stream {stream.name!r}: source.notifications needs an s3a://bucket/folder landing folder, "
                          f"not {location!r}")
    return bucket, prefix + "/"


class S3Object(NamedTuple):
    """An object an S3 event notification says was created: its size and creation time (seconds since the epoch)
    when the event tells them, else None."""

    bucket: str
    key: str
    size: int | None = None
    created: float | None = None


def _event_time(text: object) -> float | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def s3_created(body: str) -> list[S3Object] | None:
    """Each object an S3 event notification says was created; [] for S3's test event and for other events (a
    removal); None for a message that is no S3 event notification. A notification that came through SNS is
    unwrapped."""
    try:
        message = json.loads(body)
        if isinstance(message, dict) and message.get("Type") == "Notification" and "Message" in message:
            message = json.loads(message["Message"])
    except (ValueError, TypeError):
        return None
    if not isinstance(message, dict):
        return None
    if message.get("Event") == "s3:TestEvent":
        return []
    records = message.get("Records")
    if not isinstance(records, list):
        return None
    objects = []
    try:
        for record in records:
            if record.get("eventSource") != "aws:s3":
                return None
            if str(record.get("eventName", "")).startswith("ObjectCreated:"):
                found = record["s3"]["object"]
                size = found.get("size")
                # Keys are form-encoded in S3's events (a space is '+').
                objects.append(S3Object(str(record["s3"]["bucket"]["name"]), unquote_plus(str(found["key"])),
                                        int(size) if isinstance(size, int) else None,
                                        _event_time(record.get("eventTime"))))
    except (AttributeError, KeyError, TypeError):
        return None
    return objects


def s3_objects(body: str) -> list[tuple[str, str]] | None:
    """The (bucket, key) of each object :func:`s3_created` finds in a message."""
    objects = s3_created(body)
    return None if objects is None else [(found.bucket, found.key) for found in objects]


#: The variable that carries a queue connection (``source.notifications.connection``) to a run's driver: the JSON
#: of its ``AWS_*`` variables, apart from the object store's own ``AWS_*``.
QUEUE_ENV_PREFIX = "SLUICE_SQS_CONN_"
#: The variables of a queue connection that hold a secret.
QUEUE_SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def queue_env_name(conn_id: str) -> str:
    return QUEUE_ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", conn_id).upper()


def queue_credentials(spec: Any, environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The ``AWS_*`` variables of the queue's own connection, as the operator passed them to this process; None
    without a connection (the object store's credentials serve)."""
    if spec.connection is None:
        return None
    environ = os.environ if environ is None else environ
    text = environ.get(queue_env_name(spec.connection))
    if text is None:
        raise SluiceError(f"source.notifications.connection {spec.connection!r} did not reach this process "
                          f"({queue_env_name(spec.connection)} is not set): run the stream from its DAG, or set it")
    return dict(json.loads(text))


def queue_client(credentials: Mapping[str, str] | None = None) -> Any:
    """An SQS client with ``credentials`` (the queue connection's ``AWS_*``) when given, else the scoped ones (the
    storage connection's, on the triggerer or in a task), else the environment's: the queue lives with the bucket.
    ``AWS_ENDPOINT_URL`` (an S3-compatible server that serves SQS too) and ``AWS_REGION`` are honoured as the S3
    side honours them."""
    import boto3

    env = {**os.environ, **dict(current())} if credentials is None else {**os.environ, **credentials}
    return boto3.client(
        "sqs",
        region_name=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
        endpoint_url=env.get("AWS_ENDPOINT_URL_SQS") or env.get("AWS_ENDPOINT_URL") or None,
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
        aws_session_token=env.get("AWS_SESSION_TOKEN") or None,
    )


def queue_url(client: Any, queue: str) -> str:
    if queue.startswith(("https://", "http://")):
        return queue
    return str(client.get_queue_url(QueueName=queue)["QueueUrl"])


def drain(stream: StreamSpec, roots: Roots, *, client: Any = None, after_journal: Callable[[], None] | None = None,
          max_messages: int = MAX_MESSAGES_PER_DRAIN, now: float | None = None,
          credentials: Mapping[str, str] | None = None) -> Drained:
    """Take the queue's messages into the stream's journal, then delete them from the queue (``after_journal`` is
    called between the two: the kill tests stop there). Messages of other buckets and folders, and files Spark's
    listing would skip (``_`` names, the glob filter), are deleted without a journal entry. ``credentials``: the
    queue connection's, read on the triggerer; else :func:`queue_credentials`."""
    spec = notifications(stream)
    bucket, prefix = _source_prefix(stream, roots)
    lists = listing_rule(stream)
    client = client or queue_client(credentials if credentials is not None else queue_credentials(spec))
    url = queue_url(client, spec.queue)
    retention = int(client.get_queue_attributes(QueueUrl=url, AttributeNames=["MessageRetentionPeriod"])
                    ["Attributes"].get("MessageRetentionPeriod", 345_600))
    now = time.time() if now is None else now
    drained, files, handles = Drained(), set[str](), list[str]()
    facts: dict[str, list[float | None]] = {}  # each file's size and creation time, for the lag probe
    while len(handles) < max_messages:
        messages = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                                          MessageSystemAttributeNames=["SentTimestamp"]).get("Messages", [])
        if not messages:
            break
        for message in messages:
            handles.append(message["ReceiptHandle"])
            objects = s3_created(message.get("Body", ""))
            waited = now - int(message.get("Attributes", {}).get("SentTimestamp", now * 1000)) / 1000
            if objects is None:
                drained.list_because = drained.list_because or "the queue held a message that is no S3 event"
                continue
            if waited > retention / 2:
                drained.list_because = drained.list_because or (
                    f"a message waited {waited:.0f}s in a queue that keeps them {retention}s")
            for event_bucket, key, size, created in objects:
                if event_bucket != bucket or not key.startswith(prefix) or not lists(key[len(prefix):]):
                    continue
                if _UNGLOBBABLE & set(key):
                    drained.list_because = drained.list_because or f"a file's name holds a glob character: {key}"
                    continue
                files.add(f"s3a://{bucket}/{key}")
                facts[f"s3a://{bucket}/{key}"] = [size, created]
    drained.messages, drained.files = len(handles), len(files)
    if not handles:
        return drained
    entry = {"files": sorted(files), "list_because": drained.list_because, "written_at": now,
             "objects": {path: facts[path] for path in sorted(files)}}
    name = f"{_PREFIX}{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
    journal(stream, roots).write_bytes(name, json.dumps(entry).encode("utf-8"))  # whole or not at all
    if after_journal is not None:
        after_journal()
    for start in range(0, len(handles), 10):
        chunk = handles[start:start + 10]
        result = client.delete_message_batch(QueueUrl=url, Entries=[
            {"Id": str(index), "ReceiptHandle": handle} for index, handle in enumerate(chunk)])
        if result.get("Failed"):  # they come back and are journaled again: the journal is a set
            log.warning("stream %s: %d message(s) not deleted from the queue; they will be read again",
                        stream.name, len(result["Failed"]))
    return drained


@dataclass(frozen=True)
class _Entry:
    name: str
    written_ns: int
    files: tuple[str, ...]
    list_because: str | None
    #: Each file's size and creation time as its S3 event told them (a journal written before they were kept: none).
    objects: Mapping[str, Any] = field(default_factory=dict)


def _entries(journal_folder: Folder) -> list[_Entry]:
    if not journal_folder.is_dir():
        return []
    entries = []
    for found in journal_folder.entries():
        if not (found.name.startswith(_PREFIX) and found.name.endswith(".json")):
            continue
        try:
            raw = json.loads(journal_folder.read_text(found.name))
            written_ns = int(found.name[len(_PREFIX):].split("-")[0])
        except (ValueError, FileNotFoundError):
            continue  # removed since it was listed (a compaction), or not the journal's
        entries.append(_Entry(found.name, written_ns, tuple(raw.get("files", [])), raw.get("list_because"),
                              raw.get("objects") or {}))
    return sorted(entries, key=lambda entry: entry.written_ns)


def last_listing(stream: StreamSpec, roots: Roots) -> float | None:
    """When the stream's last listing run started (seconds since the epoch); None when it never listed."""
    own = journal(stream, roots)
    if not own.exists(LISTED):
        return None
    return float(json.loads(own.read_text(LISTED))["started_at"])


def listing_due(stream: StreamSpec, roots: Roots, *, now: float | None = None) -> str | None:
    """Why the stream's next run must list its landing folder (see the module's rules); None when the journal
    tells it all."""
    spec = notifications(stream)
    listed = last_listing(stream, roots)
    if listed is None:
        return "the stream has not listed its landing folder since it got notifications"
    now = time.time() if now is None else now
    if now - listed >= spec.list_every_seconds:
        return f"its last listing is older than list_every ({spec.list_every_seconds}s)"
    for entry in _entries(journal(stream, roots)):
        if entry.list_because and entry.written_ns / 1e9 >= listed:
            return entry.list_because
    return None


def unrecorded(stream: StreamSpec, roots: Roots, reader: CheckpointReader | None = None) -> list[str]:
    """The journaled files the stream's source log has not recorded: what a notified run reads."""
    state = SourceState.of(stream, reader or CheckpointReader(stream.checkpoint_path(roots)))
    files = {path for entry in _entries(journal(stream, roots)) for path in entry.files}
    return sorted(path for path in files if state.entry(path) is None)


def notified_glob(paths: Iterable[str]) -> str:
    """One glob of exactly ``paths`` (``s3a://`` URIs of one bucket, each below a folder) that Hadoop expands into
    one pattern per path before it matches, because each alternative holds a slash: Spark then asks for each file
    by its name (a HEAD) and lists no folder."""
    paths = sorted(paths)
    root = "s3a://" + paths[0][len("s3a://"):].split("/", 1)[0]
    keys = [path[len(root) + 1:] for path in paths]
    if any(not path.startswith(root + "/") for path in paths) or any("/" not in key for key in keys):
        raise SluiceError(f"notified files must lie below a folder of one bucket ({paths[0]}, ...)")
    return f"{root}/{{{','.join(keys)}}}"


def plan_read(stream: StreamSpec, roots: Roots, *, after_journal: Callable[[], None] | None = None) -> NotifiedRead:
    """Drain the queue, then say what this run reads: the notified files the source log has not recorded, or the
    landing folder when a listing is due. A queue that cannot be read makes a listing run (logged, and said in the
    summary): the data still lands."""
    try:
        drained = drain(stream, roots, after_journal=after_journal)
    except Exception as exc:  # boto3's errors share no base; whatever failed, a listing is correct
        log.warning("stream %s: cannot read its notification queue (%s); this run lists its landing folder",
                    stream.name, exc)
        return NotifiedRead(None, listed=f"the queue could not be read: {exc}")
    started_at = time.time()  # what was drained so far is journaled: a listing from here covers it
    reason = listing_due(stream, roots, now=started_at)
    if reason is not None:
        log.info("stream %s: this run lists its landing folder: %s", stream.name, reason)
        return NotifiedRead(None, listed=reason, drained=drained, started_at=started_at)
    files = unrecorded(stream, roots)
    if len(files) > MAX_NOTIFIED_FILES:
        reason = f"{len(files)} notified files are unread, more than one glob names ({MAX_NOTIFIED_FILES})"
        log.info("stream %s: this run lists its landing folder: %s", stream.name, reason)
        return NotifiedRead(None, listed=reason, drained=drained, started_at=started_at)
    bucket, prefix = _source_prefix(stream, roots)
    # Nothing to read: a name that cannot exist (Spark's listing skips `_` names) keeps the query's plan and reads
    # nothing, with one request for it.
    path = notified_glob(files) if files else notified_glob([f"s3a://{bucket}/{prefix}_sluice_nothing_notified"])
    return NotifiedRead(path, files=len(files), drained=drained, started_at=started_at)


def after_run(stream: StreamSpec, roots: Roots, read: NotifiedRead) -> None:
    """After a successful run: a listing run records when it started (files that landed before then were listed);
    journal files whose every file committed batches have read are removed, and so, after a listing run, are those
    written more than ``list_every`` before it started (their files were there to be listed, whatever became of
    them: removed, behind the ``maxFileAge`` horizon), so the journal stays the size of the unread."""
    own = journal(stream, roots)
    spec = notifications(stream)
    if read.listed is not None:
        own.write_bytes(LISTED, json.dumps({"started_at": read.started_at, "because": read.listed}).encode("utf-8"))
    state = SourceState.of(stream, CheckpointReader(stream.checkpoint_path(roots)))

    def read_by_commits(path: str) -> bool:
        entry = state.entry(path)
        return entry is not None and entry.batch_id <= state.last_commit

    covered_before = read.started_at - spec.list_every_seconds if read.listed is not None else None
    for entry in _entries(own):
        if entry.written_ns / 1e9 >= read.started_at:
            continue  # drained while this run ran: the next one reads it
        if all(read_by_commits(path) for path in entry.files) or (
                covered_before is not None and entry.written_ns / 1e9 < covered_before):
            own.delete(entry.name)


def watch_unread(stream: StreamSpec, roots: Roots, *, credentials: Mapping[str, str] | None = None
                 ) -> frozenset[str]:
    """What the arrival watcher of a notified stream sees as unread, without a listing: it drains the queue into the
    journal, then takes the journaled files the source log has not recorded, and, when the next run must list, one
    item that says why (:data:`LISTING_DUE`), so that the watcher starts the run that lists."""
    try:
        drain(stream, roots, credentials=credentials)
    except SluiceError:
        raise
    except Exception as exc:  # boto3's errors share no base: the watcher logs and looks again
        raise SluiceError(f"stream {stream.name!r}: cannot read its notification queue: {exc}") from exc
    unread = set(unrecorded(stream, roots))
    due = listing_due(stream, roots)
    if due is not None:
        unread.add(LISTING_DUE + due)
    return frozenset(unread)


@dataclass
class Pending:
    """What the lag probe of a notified stream sees without a listing: the journaled files its next run reads (their
    sizes and times as the S3 events told them: ``unsized`` of them without a size), the messages still in the
    queue (not journaled yet; None when the queue could not be read, ``queue_error`` says why), the journaled files
    behind the ``maxFileAge`` horizon, and why the next run lists, if it does (files only a listing finds are in no
    count)."""

    files: list[SourceFile]
    unsized: int = 0
    queued: int | None = None
    queue_error: str | None = None
    behind_horizon: int = 0
    listing_due: str | None = None


def queue_depth(stream: StreamSpec, *, client: Any = None) -> int:
    """The messages in the stream's queue, visible or in flight (a drain under way), as SQS counts them: read without
    receiving one, so that the probe takes nothing from the run's queue."""
    spec = notifications(stream)
    client = client or queue_client(queue_credentials(spec))
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = client.get_queue_attributes(QueueUrl=queue_url(client, spec.queue), AttributeNames=names)
    return sum(int(attributes["Attributes"].get(name, 0)) for name in names)


def pending(stream: StreamSpec, roots: Roots, reader: CheckpointReader, *, client: Any = None) -> Pending:
    """The backlog of a notified stream from its journal, its source log and its queue's depth: no listing, and no
    message taken from the queue (the arrival watcher and the runs drain it; a lag probe only looks)."""
    state = SourceState.of(stream, reader)
    files: dict[str, SourceFile] = {}
    unsized: set[str] = set()
    for entry in _entries(journal(stream, roots)):
        for path in entry.files:
            facts = entry.objects.get(path) or [None, None]
            size, created = facts[0], facts[1]
            if size is None:
                unsized.add(path)
            files[path] = SourceFile(path, int(size or 0),
                                     float(created) if created is not None else entry.written_ns / 1e9)
    result = Pending([])
    for found in files.values():
        if state.will_read(found):
            result.files.append(found)
        elif state.entry(found.path) is None:
            result.behind_horizon += 1
    result.files.sort(key=lambda found: found.path)
    result.unsized = sum(1 for found in result.files if found.path in unsized)
    try:
        result.queued = queue_depth(stream, client=client)
    except Exception as exc:  # boto3's errors share no base: the journal's count stands, said to be partial
        result.queue_error = str(exc)
    result.listing_due = listing_due(stream, roots)
    return result
