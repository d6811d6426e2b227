"""The file source: a landing-zone folder of JSON, CSV or Parquet files, read with a declared schema.

Spark's file source lists the folder on every run and reads the files its checkpoint's source log does not hold.
Malformed JSON and CSV records become dead letters (PERMISSIVE mode), not failures. The lag is the files the next
run will read, inside the stream's ``maxFileAge`` horizon (:mod:`sluice.storage.landing`). A backfill reads the
files whose time falls in a range, into the same tables, with its own checkpoint.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from sluice.constants import CleanAction, FaultCode, FileFormat, SchemaEvolution, Severity, SourceType
from sluice.errors import CatalogError, SluiceError
from sluice.kinds.base import (
    ENVELOPE_KEYS,
    Backlog,
    Credentials,
    SourceKind,
    declared_schema,
    read_envelope,
    reader_options,
    schema_evolution,
)
from sluice.model.findings import Finding
from sluice.model.keys import DURATION_PATTERN, SCHEMA, Block, Key, Type, evolution
from sluice.model.section import Section
from sluice.model.sources import SourceSpec
from sluice.paths import Roots, join
from sluice.storage.landing import SourceState, source_links, unread_files
from sluice.storage.notified import QUEUE_ENV_PREFIX, QUEUE_SECRETS, queue_env_name
from sluice.storage.store import is_local

if TYPE_CHECKING:
    from sluice.model.stream import StreamSpec
    from sluice.storage.checkpoint import CheckpointReader

# Spark file-source options a catalog may set, per format. Anything else is a typo or belongs elsewhere
# (trigger limits live under `trigger`, the schema under `schema`, the path under `path`).
_COMMON_OPTIONS = frozenset(
    {"pathGlobFilter", "recursiveFileLookup", "maxFileAge", "latestFirst", "fileNameOnly", "encoding",
     "timestampFormat", "dateFormat", "timeZone", "modifiedAfter", "modifiedBefore"}
)
FORMAT_OPTIONS = {
    FileFormat.JSON: _COMMON_OPTIONS | {"multiLine", "allowComments", "allowSingleQuotes", "lineSep"},
    FileFormat.CSV: _COMMON_OPTIONS
    | {"header", "enforceSchema", "sep", "delimiter", "quote", "escape", "comment", "nullValue", "emptyValue",
       "multiLine", "lineSep", "ignoreLeadingWhiteSpace", "ignoreTrailingWhiteSpace"},
    FileFormat.PARQUET: _COMMON_OPTIONS | {"mergeSchema", "datetimeRebaseMode", "int96RebaseMode"},
}
# The options of Spark's Parquet reader: a drift policy reads Parquet files with pyarrow instead.
_SPARK_PARQUET_OPTIONS = frozenset({"mergeSchema", "datetimeRebaseMode", "int96RebaseMode"})
# The drift policies each format follows (:class:`~sluice.constants.SchemaEvolution`).
POLICIES = {
    FileFormat.JSON: (SchemaEvolution.RESCUE, SchemaEvolution.ADD_NEW_COLUMNS, SchemaEvolution.FAIL_ON_NEW_COLUMNS,
                      SchemaEvolution.NONE),
    FileFormat.CSV: (SchemaEvolution.RESCUE, SchemaEvolution.ADD_NEW_COLUMNS, SchemaEvolution.FAIL_ON_NEW_COLUMNS,
                     SchemaEvolution.NONE),
    FileFormat.PARQUET: (SchemaEvolution.RESCUE, SchemaEvolution.ADD_NEW_COLUMNS,
                         SchemaEvolution.FAIL_ON_NEW_COLUMNS, SchemaEvolution.NONE),
}
_NEW_COLUMN_POLICIES = (SchemaEvolution.ADD_NEW_COLUMNS, SchemaEvolution.FAIL_ON_NEW_COLUMNS)
# What a JSON source reads as something other than strict UTF-8 JSON: the drift policies find new fields with
# Spark's strict parser, so they take none of these.
LENIENT_JSON_OPTIONS = {"allowComments": "true", "allowSingleQuotes": "true"}


@dataclass(frozen=True)
class CleanSpec:
    """``source.clean``: what becomes of a landing file once committed batches have read it and it is older than
    ``after_seconds`` (by its modification time): moved to ``archive_to`` (a folder under the landing root, the
    file's path below the source folder kept), or deleted (:mod:`sluice.storage.clean`)."""

    action: CleanAction
    after_seconds: int
    archive_to: str | None = None


#: How often a stream told of its files by notifications lists its landing zone all the same, by default: a message
#: lost without a trace (deleted by hand, moved to a dead-letter queue) is caught by the next listing.
DEFAULT_LIST_EVERY_SECONDS = 86_400


@dataclass(frozen=True)
class NotificationSpec:
    """``source.notifications``: the SQS queue (a URL, or a name in the environment's region) that receives the
    landing bucket's S3 event notifications, so that runs and the arrival watcher read the queue instead of listing
    the bucket; a listing run at least every ``list_every_seconds`` (:mod:`sluice.storage.notified`). ``connection``:
    an Airflow ``aws`` connection for the queue; without it, the object store's credentials."""

    queue: str
    list_every_seconds: int = DEFAULT_LIST_EVERY_SECONDS
    connection: str | None = None


@dataclass(frozen=True, kw_only=True)
class FileSource(SourceSpec):
    """Files in ``path`` under the landing root."""

    type: ClassVar[SourceType] = SourceType.FILES
    path: str
    clean: CleanSpec | None = None
    notifications: NotificationSpec | None = None

    def location(self, roots: Roots) -> str:
        return join(roots.landing, self.path)

    @property
    def connection(self) -> str | None:
        return None if self.notifications is None else self.notifications.connection

    @property
    def landing(self) -> str:
        return self.path

    @property
    def record_options(self) -> Mapping[str, str]:
        return self.options


def names_columns_by_header(options: Mapping[str, str]) -> bool:
    """Whether a CSV source's files name their columns in a header Sluice may match by name: ``header`` without
    ``enforceSchema``, which asks for columns by position."""
    return (options.get("header", "false").lower() == "true"
            and options.get("enforceSchema", "false").lower() != "true")


def check_strict_json(section: Section, options: Mapping[str, str], policy: SchemaEvolution) -> None:
    """Refuse the options under which a drift policy would miss fields: it reads every record as strict UTF-8
    JSON."""
    for key, lenient in LENIENT_JSON_OPTIONS.items():
        if options.get(key, "").lower() == lenient:
            raise section.error(f"options.{key}", f"schema_evolution {policy.value} reads each record as strict "
                                                  "JSON to find the fields the schema does not declare; set "
                                                  "schema_evolution: none to read lenient JSON")
    encoding = options.get("encoding", "utf-8").lower().replace("_", "-")
    if encoding not in ("utf-8", "utf8"):
        raise section.error("options.encoding", f"schema_evolution {policy.value} reads UTF-8 text; set "
                                                "schema_evolution: none to read another encoding")


def _files_source(file_format: FileFormat) -> Block:
    policies = POLICIES[file_format]
    return Block(
        f"source (files, {file_format.value})", "source",
        f"Files of {file_format.value} under `path` in the landing root (SLUICE_LANDING_ROOT).",
        (
            Key("type", Type.CHOICE, "the source kind", required=True, choices=("files",)),
            Key("format", Type.CHOICE, "the file format", required=True, choices=(file_format.value,)),
            Key("path", Type.FOLDER, "the folder under the landing root (or an absolute path or URI)", required=True),
            SCHEMA,
            Key("options", Type.OPTIONS, "Spark reader options of the format", choices=tuple(
                sorted(FORMAT_OPTIONS[file_format]))),
            evolution(policies, SchemaEvolution.RESCUE if SchemaEvolution.RESCUE in policies else SchemaEvolution.NONE,
                       "schema drift"),
            *(ENVELOPE_KEYS if file_format is FileFormat.JSON else ()),
            Key("clean", Type.BLOCK, "archive or delete the files committed batches have read", block="clean"),
            Key("notifications", Type.BLOCK, "read new files' names from an SQS queue of S3 event notifications "
                "instead of listing the landing bucket (an `s3a://` path)", block="notifications"),
        ),
        when=("type", "files"),
    )


_CLEAN = Block("clean", "source.clean", "What becomes of a landing file once committed batches have read it and it is "
               "older than `after`: archived (moved under `archive_to`) or deleted. Unread files are never touched.", (
                   Key("action", Type.CHOICE, "what is done with a read file", required=True,
                       choices=tuple(action.value for action in CleanAction)),
                   Key("after", Type.DURATION, "how old (by modification time) a read file must be", required=True,
                       pattern=DURATION_PATTERN),
                   Key("archive_to", Type.FOLDER, "the archive folder under the landing root (archive only); the "
                       "files keep their path below the source folder", default_text="required to archive"),
               ))


_NOTIFICATIONS = Block(
    "notifications", "source.notifications", "An SQS queue that receives the landing bucket's S3 event notifications "
    "(`s3:ObjectCreated:*`): runs and the arrival watcher read the new files' names from it, and list the landing "
    "zone only on a stream's first run, every `list_every`, and when the queue may have lost messages.", (
        Key("queue", Type.STRING, "the queue's URL, or its name in the deployment's region", required=True),
        Key("list_every", Type.DURATION, "the longest time between two runs that list the landing zone (they catch a "
            "message lost without a trace)", default="1 day", pattern=DURATION_PATTERN),
        Key("connection", Type.STRING, "an Airflow connection (type aws) for the queue",
            default_text="the object store's credentials"),
    ))


def _parse_notifications(section: Section, path: str) -> NotificationSpec:
    queue = section.get("queue", str, required=True)
    assert queue is not None
    if not queue.strip():
        raise section.error("queue", "is empty; give the queue's URL or name")
    list_every = section.interval("list_every")
    connection = section.get("connection", str)
    if connection is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", connection):
        raise section.error("connection", f"expected an Airflow connection id, got {connection!r}")
    section.done()
    scheme, _, rest = path.partition("://")
    bucket, _, prefix = rest.partition("/")
    if scheme != "s3a" or not bucket or not prefix.strip("/"):
        # Notifications name objects of one bucket; Spark reads them by their s3a:// URIs, one request each, only
        # when each is below a folder (a glob of names at a bucket's root would list the bucket).
        raise CatalogError(f"needs a source path of the form s3a://bucket/folder (S3 event notifications name the "
                           f"objects of one bucket), not {path!r}", stream=section.stream, field=section.path)
    return NotificationSpec(queue.strip(), DEFAULT_LIST_EVERY_SECONDS if list_every is None else list_every,
                            connection)


class QueueCredentials(Credentials):
    """A queue connection (``source.notifications.connection``, type aws) reaches the driver as one
    ``SLUICE_SQS_CONN_<ID>`` variable, the JSON of its ``AWS_*`` variables: the object store's own ``AWS_*``
    stay as they are."""

    def environment(self, conn_id: str) -> dict[str, str]:
        from sluice.connections.storage import connection_environment

        env = connection_environment(conn_id)
        if env is None:
            raise SluiceError(f"connection {conn_id!r} (source.notifications.connection) is not defined in Airflow")
        return {queue_env_name(conn_id): json.dumps({name: value for name, value in env.items()
                                                     if name.startswith("AWS_")})}

    def secrets(self, environ: Mapping[str, str]) -> list[str]:
        found = []
        for name, text in environ.items():
            if name.startswith(QUEUE_ENV_PREFIX) and text:
                try:
                    values = json.loads(text)
                except ValueError:
                    found.append(text)
                    continue
                found += [str(values[key]) for key in QUEUE_SECRETS if isinstance(values, dict) and values.get(key)]
        return found

    def described(self, env: Mapping[str, str]) -> str:
        return "; ".join(f"SQS, {sorted(json.loads(text))}" for text in env.values())


QUEUE_CREDENTIALS = QueueCredentials()


def _parse_clean(section: Section) -> CleanSpec:
    action = section.enum("action", CleanAction, required=True)
    after = section.interval("after", required=True)
    assert after is not None
    archive_to = section.folder("archive_to") if "archive_to" in section.raw else None
    section.done()
    if action is CleanAction.ARCHIVE and archive_to is None:
        raise section.error("archive_to", "is required to archive: the folder under the landing root that read "
                                          "files are moved to")
    if action is CleanAction.DELETE and archive_to is not None:
        raise section.error("archive_to", "is for action archive; action delete keeps no copy")
    return CleanSpec(action, after, archive_to)


class FilesKind(SourceKind):
    type = SourceType.FILES
    credentials = QUEUE_CREDENTIALS
    backfill_refusal = None

    def catalog_blocks(self) -> tuple[Block, ...]:
        return (*(_files_source(file_format) for file_format in FORMAT_OPTIONS), _CLEAN, _NOTIFICATIONS)

    def parse(self, section: Section) -> FileSource:
        file_format = section.enum("format", FileFormat, required=True)
        if file_format not in FORMAT_OPTIONS:
            raise section.error("format", f"a files source cannot have format {file_format.value}; expected one of "
                                          f"{', '.join(f.value for f in FORMAT_OPTIONS)}")
        path = section.folder("path")
        schema = declared_schema(section, file_format.value)
        complex_columns = [column.name for column in schema.columns if column.complex]
        if file_format is FileFormat.CSV and complex_columns:
            raise section.error(f"schema.{complex_columns[0]}", "a csv field holds text, not a struct, an array or a "
                                                                "map; declare it as a string, or read JSON or Parquet")
        options = reader_options(section, FORMAT_OPTIONS[file_format], file_format.value)
        clean_section = section.section("clean")
        clean = _parse_clean(clean_section) if "clean" in section.raw else None
        notifications_section = section.section("notifications")
        notifications = _parse_notifications(notifications_section, path) if "notifications" in section.raw else None
        policy = schema_evolution(section, POLICIES[file_format], file_format.value)
        if file_format is FileFormat.JSON and policy is not SchemaEvolution.NONE:
            check_strict_json(section, options, policy)
        by_header = names_columns_by_header(options)
        if file_format is FileFormat.CSV and by_header and policy is not SchemaEvolution.NONE:
            encoding = options.get("encoding", "utf-8")
            try:
                codecs.lookup(encoding)
            except LookupError:
                raise section.error("options.encoding", f"schema_evolution {policy.value} reads each file's header "
                                                        f"in Python, which knows no encoding {encoding!r}") from None
        if file_format is FileFormat.CSV and policy in _NEW_COLUMN_POLICIES and not by_header:
            raise section.error("schema_evolution", f"{policy.value} finds a CSV file's new columns by the names in "
                                                    "its header: set options.header: true (without enforceSchema)")
        spark_only = sorted(options.keys() & _SPARK_PARQUET_OPTIONS) if file_format is FileFormat.PARQUET else []
        if spark_only and "schema_evolution" not in section.raw:
            policy = SchemaEvolution.NONE  # options for Spark's reader: the catalog reads with it
        elif spark_only and policy is not SchemaEvolution.NONE:
            raise section.error(f"options.{spark_only[0]}", f"schema_evolution {policy.value} reads each Parquet file "
                                                            "with pyarrow, which takes no Spark reader option; set "
                                                            "schema_evolution: none to read with Spark's reader")
        unwrap, schema = read_envelope(section, schema, json=file_format is FileFormat.JSON)
        section.done()
        return FileSource(format=file_format, path=path, schema=schema, options=options, schema_evolution=policy,
                          clean=clean, notifications=notifications, envelope=unwrap.envelope,
                          envelope_tiebreak=unwrap.tiebreak, envelope_truncate=unwrap.truncate)

    def backlog(self, stream: StreamSpec, roots: Roots, reader: CheckpointReader) -> Backlog:
        """Files (and their bytes) the next run will read, and when the oldest of them was written. A notified landing
        zone is not listed: its journal, its source log and its queue's depth tell (:func:`_notified_backlog`)."""
        if getattr(stream.source, "notifications", None) is not None:
            return _notified_backlog(stream, roots, reader)
        unread = unread_files(stream, roots, SourceState.of(stream, reader))
        backlog = Backlog(files=len(unread.files), bytes=sum(f.size for f in unread.files),
                          oldest_unread_at=min((f.modified for f in unread.files), default=None),
                          arrivals=frozenset(f.path for f in unread.files))
        if unread.behind_horizon:
            backlog.notes.append(_behind_horizon(unread.behind_horizon, "file(s)"))
        return backlog

    def findings(self, stream: StreamSpec, roots: Roots) -> list[Finding]:
        """Spark's file listing follows symbolic links: a link in the landing zone would make the run read whatever
        host file it points at (into the tables, or as raw text into the dead-letter table). The run waits until it
        is gone."""
        if not is_local(stream.source_path(roots)):
            return []  # an object store holds no links (and a listing here would undo source.notifications)
        links = source_links(stream, roots)
        if not links:
            return []
        return [Finding(FaultCode.LANDING_SYMLINK, Severity.FAIL,
                        f"the landing zone holds {len(links)} symbolic link(s), e.g. {links[0]}; Spark would read what "
                        "they point at. Remove them (upload the files themselves) and run again",
                        {"links": links[:20]})]


def _behind_horizon(count: int, what: str) -> str:
    return (f"{count} {what} are older than the stream's maxFileAge horizon and will never be read by it; backfill "
            "them (mode append) if they belong in the table")


def _notified_backlog(stream: StreamSpec, roots: Roots, reader: CheckpointReader) -> Backlog:
    """The backlog of a landing zone told of its files by notifications, as :func:`sluice.storage.notified.pending`
    sees it without a listing: the journaled files the next run reads, plus one file per message still in the queue
    (an S3 event names one object; their bytes and times are not known until a drain journals them)."""
    from sluice.storage.notified import pending

    seen = pending(stream, roots, reader)
    backlog = Backlog(files=len(seen.files) + (seen.queued or 0), bytes=sum(f.size for f in seen.files),
                      oldest_unread_at=min((f.modified for f in seen.files), default=None),
                      arrivals=frozenset(f.path for f in seen.files))
    if seen.queued:
        backlog.notes.append(f"{seen.queued} message(s) wait in the notification queue, counted as a file each; "
                             "their bytes are counted once a run or the arrival watcher takes them")
    if seen.queue_error is not None:
        backlog.notes.append(f"the notification queue could not be read ({seen.queue_error}): only the files "
                             "already taken from it are counted")
    if seen.unsized:
        backlog.notes.append(f"{seen.unsized} notified file(s) came without a size: their bytes are not counted")
    if seen.behind_horizon:
        backlog.notes.append(_behind_horizon(seen.behind_horizon, "notified file(s)"))
    if seen.listing_due is not None:
        backlog.notes.append(f"the next run lists the landing folder ({seen.listing_due}): files that only a "
                             "listing finds are not counted here")
    return backlog
