"""The Delta source and the Delta sink.

A Delta source reads a table under the lake root by version (a silver stream reading bronze): delta-spark's
streaming source on the jvm engine, Sluice's ``sluice_delta`` on rs. A stream of the catalog that writes the table
is its upstream; the source's stream may run on that upstream's commits instead of a schedule. Its lag is the
versions after the last one processed, with the bytes and records they add, read from the table's JSON commits.

With ``read: changes`` the source reads the table's change data feed instead of its appends: every insert, update
(its new row) and delete, with Delta's ``_change_type``, ``_commit_version`` and ``_commit_timestamp`` (the change
feed guide). The table must record it (``delta.enableChangeDataFeed``): Sluice turns it on for a table a stream of
the catalog writes when another stream reads its changes.

A Delta sink is a table written exactly once per micro-batch: appended to, merged into by ``keys`` (the row with the
highest ``sequence_by`` wins), rewritten whole (``complete``), or changed by a feed of upserts and deletes applied
in ``sequence_by`` order (``cdc``, type 1 or type 2: :class:`~sluice.model.sinks.CdcSpec`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from sluice.constants import DeltaEngine, FileFormat, SchemaEvolution, SinkFormat, SinkMode, SourceType, Word
from sluice.errors import SluiceError
from sluice.kinds.base import Backlog, SinkKind, SourceKind, declared_schema, reader_options, schema_evolution
from sluice.model.keys import SCHEMA, Block, Key, Type, choices, evolution
from sluice.model.section import Section
from sluice.model.sinks import CdcSpec, SinkSpec
from sluice.model.sources import SourceSpec
from sluice.paths import Roots, join

if TYPE_CHECKING:
    from sluice.model.stream import StreamSpec
    from sluice.storage.checkpoint import CheckpointReader

# Options both Delta engines' streaming sources take (delta-spark's names).
SOURCE_OPTIONS = frozenset({"startingVersion", "startingTimestamp", "skipChangeCommits"})


class DeltaRead(Word):
    """What a Delta source reads of its table's new versions."""

    # The rows each version adds; a version that updates or deletes rows fails the run, naming it.
    APPENDS = "appends"
    # The change data feed: inserts, updates (their new rows) and deletes, each row with its kind and version.
    CHANGES = "changes"


# The columns a ``changes`` read adds to each row, with their Spark SQL types: what the change is (``insert``,
# ``update_postimage``, ``delete``; an update's old row, ``update_preimage``, is not passed), and the version and time
# of the commit that made it. Delta's own names, so a downstream filter reads as Delta's documentation writes it.
CHANGE_COLUMNS = {"_change_type": "STRING", "_commit_version": "BIGINT", "_commit_timestamp": "TIMESTAMP"}


@dataclass(frozen=True, kw_only=True)
class DeltaSource(SourceSpec):
    """The Delta table at ``path`` under the lake root, read by version."""

    type: ClassVar[SourceType] = SourceType.DELTA
    format: FileFormat = FileFormat.DELTA
    path: str
    read: DeltaRead = DeltaRead.APPENDS

    def location(self, roots: Roots) -> str:
        return join(roots.lake, self.path)

    @property
    def columns(self) -> dict[str, str]:
        """The declared columns and the lineage, and under ``read: changes`` the change columns: data the stream
        writes to its table like a declared column (a CDC sink's ``delete_when`` reads ``_change_type``)."""
        changes = CHANGE_COLUMNS if self.read is DeltaRead.CHANGES else {}
        return {**super().columns, **changes}

    @property
    def never_null(self) -> set[str]:
        return super().never_null | (set(CHANGE_COLUMNS) if self.read is DeltaRead.CHANGES else set())

    @property
    def table(self) -> str:
        return self.path


@dataclass(frozen=True, kw_only=True)
class DeltaSink(SinkSpec):
    """The Delta table at ``path`` under the lake root."""

    format: ClassVar[SinkFormat] = SinkFormat.DELTA
    path: str
    partition_by: tuple[str, ...] = ()
    mode: SinkMode = SinkMode.APPEND
    keys: tuple[str, ...] = ()
    sequence_by: str | None = None
    #: Another stream of the catalog reads the table's changes (``read: changes``): its table records them
    #: (:data:`sluice.storage.delta.CHANGE_FEED_PROPERTY`). Set by the catalog, not a key.
    change_feed: bool = False
    cdc: CdcSpec | None = None

    @property
    def table(self) -> str:
        return self.path


# The drift policies of a Delta source: its new fields are the upstream table's columns the schema does not declare
# (except an upstream stream's ingest time, lineage and rescued data), its misfits the values a declared type cannot
# hold. A stream that reads some columns of its upstream on purpose says so with ``none``.
POLICIES = (SchemaEvolution.RESCUE, SchemaEvolution.ADD_NEW_COLUMNS, SchemaEvolution.FAIL_ON_NEW_COLUMNS,
            SchemaEvolution.NONE)


_DELTA_SOURCE = Block(
    "source (delta)", "source", "Another Delta table under the lake root, read by version (a silver or gold stream).",
    (
        Key("type", Type.CHOICE, "the source kind", required=True, choices=("delta",)),
        Key("format", Type.CHOICE, "the table format", default=FileFormat.DELTA, choices=("delta",)),
        Key("path", Type.FOLDER, "the table under the lake root (or an absolute path or URI)", required=True),
        SCHEMA,
        Key("options", Type.OPTIONS, "Delta streaming reader options", choices=tuple(sorted(
            SOURCE_OPTIONS))),
        Key("read", Type.CHOICE, "the rows each new version appends, or its changes (inserts, updates, deletes) "
            "from the table's change data feed, with `_change_type`, `_commit_version`, `_commit_timestamp` "
            "(change feed guide)", default=DeltaRead.APPENDS, choices=choices(DeltaRead)),
        evolution(POLICIES, SchemaEvolution.RESCUE, "schema drift"),
    ),
    when=("type", "delta"),
)

_DELTA_SINK = Block(
    "sink (delta)", "sink", "A Delta table under the lake root (SLUICE_LAKE_ROOT), written exactly once.",
    (
        Key("format", Type.CHOICE, "the sink kind", default="delta", choices=("delta",)),
        Key("path", Type.FOLDER, "the table under the lake root (or an absolute path or URI)", required=True),
        Key("partition_by", Type.NAMES, "partition columns of the table"),
        Key("mode", Type.CHOICE, "append rows, merge them by `keys`, or rewrite the whole result (aggregates)",
            default=SinkMode.APPEND, choices=choices(SinkMode)),
        Key("engine", Type.CHOICE, "the Delta engine of every table the stream writes (Delta engines guide)",
            default=DeltaEngine.AUTO, choices=choices(DeltaEngine)),
        Key("keys", Type.NAMES, "the merge keys (modes merge and cdc)"),
        Key("sequence_by", Type.STRING, "under merge and cdc, the column whose larger value wins between rows of "
            "one key"),
        Key("cdc", Type.BLOCK, "how mode cdc applies the changes (change-data guide)", block="cdc"),
    ),
    when=("format", "delta"),
)

# Databricks keeps a deleted key's tombstone two days by default; a week covers a weekend's late replays.
DEFAULT_DELETE_RETENTION = 7 * 86_400

CDC_BLOCK = Block(
    "cdc", "sink.cdc", "A feed of changes applied by `keys` in `sequence_by` order (mode cdc).",
    (
        Key("delete_when", Type.SQL, "a Spark SQL predicate over the source row that makes it a delete",
            default_text="`__op = 'd'` under a Debezium envelope, else no deletes"),
        Key("scd_type", Type.INTEGER, "1: the newest row per key; 2: every version, `__start_at` to `__end_at`",
            default=1, minimum=1, maximum=2),
        Key("except_columns", Type.NAMES, "source columns not written to the table"),
        Key("track_history_columns", Type.NAMES, "type 2: the columns whose change opens a new version (others "
            "update the current version in place)", default_text="every written column"),
        Key("delete_retention", Type.DURATION, "how long a delete is remembered against older changes arriving "
            "after it", default_text="7 days"),
    ),
)


class DeltaSourceKind(SourceKind):
    type = SourceType.DELTA
    needs_schedule = False
    # Backfilled by a range of the upstream table's versions, appended (sluice.operations.delta_range).
    backfill_refusal = None

    def catalog_blocks(self) -> tuple[Block, ...]:
        return (_DELTA_SOURCE,)

    def parse(self, section: Section) -> DeltaSource:
        file_format = section.enum("format", FileFormat, FileFormat.DELTA)
        if file_format is not FileFormat.DELTA:
            raise section.error("format", f"a delta source cannot have format {file_format.value}")
        path = section.folder("path")
        schema = declared_schema(section, "delta")
        options = reader_options(section, SOURCE_OPTIONS, "delta")
        policy = schema_evolution(section, POLICIES, "delta")
        read = section.enum("read", DeltaRead, DeltaRead.APPENDS)
        section.done()
        if read is DeltaRead.CHANGES and options.get("skipChangeCommits", "").lower() == "true":
            raise section.error("options", "skipChangeCommits skips the versions read: changes is there to read; "
                                "leave it out")
        return DeltaSource(path=path, schema=schema, options=options, schema_evolution=policy, read=read)

    def backlog(self, stream: StreamSpec, roots: Roots, reader: CheckpointReader) -> Backlog:
        """The versions of the stream's source table that its next run reads."""
        from deltalake.exceptions import TableNotFoundError

        offset = reader.committed_source_offset()
        if offset is None:
            options = stream.source.options
            if options.get("startingVersion") == "latest" or "startingTimestamp" in options:
                return Backlog(versions=0, bytes=0, records=0, notes=["the first run starts at the table's latest "
                                                                      "version or a timestamp"])
            next_version = int(options.get("startingVersion", "0"))
        else:
            next_version = delta_next_version(offset)
        try:
            return delta_backlog(stream.source_path(roots), next_version,
                                 changes=getattr(stream.source, "read", None) is DeltaRead.CHANGES)
        except TableNotFoundError:
            return Backlog(versions=0, bytes=0, records=0,
                           notes=[f"the source table {stream.source.table} does not exist yet"])


class DeltaSinkKind(SinkKind):
    format = SinkFormat.DELTA
    fan_out_key = "path"

    def catalog_blocks(self) -> tuple[Block, ...]:
        return (_DELTA_SINK,)

    def parse(self, section: Section) -> DeltaSink:
        path = section.folder("path")
        partition_by = section.names("partition_by")
        mode = section.enum("mode", SinkMode, SinkMode.APPEND)
        engine = section.enum("engine", DeltaEngine, DeltaEngine.AUTO)
        keys = section.get("keys", list, [])
        if not all(isinstance(key, str) and key for key in keys) or len(set(keys)) != len(keys):
            raise section.error("keys", f"expected distinct column names, got {keys!r}")
        sequence_by = section.get("sequence_by", str)
        declared = section.get("cdc", Mapping)
        cdc = _parse_cdc(section.section("cdc")) if declared is not None or mode is SinkMode.CDC else None
        section.done()
        if keys and mode not in (SinkMode.MERGE, SinkMode.CDC):
            raise section.error("keys", f"keys are for mode merge or cdc; mode {mode.value} does not upsert")
        if cdc is not None and mode is not SinkMode.CDC:
            raise section.error("cdc", f"a cdc block is for mode cdc, not {mode.value}")
        return DeltaSink(path=path, partition_by=partition_by, mode=mode, engine=engine, keys=tuple(keys),
                         sequence_by=sequence_by, cdc=cdc)


def _parse_cdc(section: Section) -> CdcSpec:
    """The cdc block; its SQL and columns are checked against the stream's output with the other patterns."""
    delete_when = section.get("delete_when", str)
    scd_type = section.bounded_int("scd_type", 1, minimum=1, maximum=2)
    except_columns = section.names("except_columns")
    track = section.names("track_history_columns")
    retention = section.interval("delete_retention")
    section.done()
    if track and scd_type != 2:
        raise section.error("track_history_columns", "only scd_type 2 keeps a history to track columns in")
    if retention is not None and retention <= 0:
        raise section.error("delete_retention", "must be a positive duration")
    return CdcSpec(delete_when=delete_when, scd_type=scd_type, except_columns=except_columns,
                   track_history_columns=track,
                   delete_retention_seconds=DEFAULT_DELETE_RETENTION if retention is None else retention)


# --- lag -----------------------------------------------------------------------------------------------------


def delta_next_version(offset: Mapping[str, Any] | None) -> int:
    """The first table version a Delta source has not finished, from its checkpoint offset: delta-spark's
    ``{"reservoirVersion": v, "index": i, ...}`` (index -1: nothing of v read yet) or Sluice's ``{"version": v}``
    (v read)."""
    if not offset:
        return 0
    if "reservoirVersion" in offset:
        version = int(offset["reservoirVersion"])
        return version if int(offset.get("index", -1)) < 0 else version + 1
    if "version" in offset:
        return int(offset["version"]) + 1
    raise SluiceError(f"not a Delta source offset: {json.dumps(offset)[:200]}")


def delta_backlog(table_path: str, next_version: int, *, changes: bool = False) -> Backlog:
    """Versions of a Delta table from ``next_version`` on, with the bytes and records their data files add and the
    time of the oldest of them, read from the table's JSON commit files. With ``changes`` (a ``read: changes``
    source), a version that updates or deletes rows is waiting too: its change files (``cdc``) are its bytes, and its
    records are not counted (a change file has no statistics; the files a MERGE rewrites hold unchanged rows too), so
    records are then a lower bound."""
    from sluice.storage.delta import commit_actions, open_table

    latest = open_table(table_path).version()
    backlog = Backlog(versions=max(latest - next_version + 1, 0), bytes=0, records=0,
                      arrivals=frozenset({f"version {latest}"}) if latest >= next_version else frozenset())
    for version in range(next_version, latest + 1):
        try:
            actions = commit_actions(table_path, version)
        except FileNotFoundError:
            backlog.notes.append(f"version {version}'s commit file was cleaned up; bytes and records are partial")
            continue
        change_files = [action["cdc"] for action in actions if changes and "cdc" in action]
        removes = changes and any(action.get("remove", {}).get("dataChange", False) for action in actions)
        adds_data, committed_at = bool(change_files) or removes, None
        for action in actions:
            add = action.get("add")
            if add and add.get("dataChange", True) and not change_files:
                adds_data = True
                backlog.bytes = (backlog.bytes or 0) + int(add.get("size", 0))
                stats = json.loads(add["stats"]) if add.get("stats") and not removes else {}
                backlog.records = (backlog.records or 0) + int(stats.get("numRecords", 0))
            info = action.get("commitInfo")
            if info and "timestamp" in info:
                committed_at = int(info["timestamp"]) / 1000
        backlog.bytes = (backlog.bytes or 0) + sum(int(change.get("size", 0)) for change in change_files)
        # A version without new data (a compaction, a vacuum) is nothing to wait for: it does not age the lag.
        if adds_data and committed_at is not None and backlog.oldest_unread_at is None:
            backlog.oldest_unread_at = committed_at
    return backlog
