"""The Iceberg source and the Iceberg sink: a table of an Iceberg catalog, read by snapshot, or written exactly once
by the pip-only engine (pyiceberg).

An Iceberg source (``source.type: iceberg``, ``table``, ``catalog``) reads the rows each new append snapshot of the
table's history adds (:mod:`sluice.storage.iceberg_snapshots`): a silver or gold stream reading an Iceberg bronze.
Its checkpoint keeps the last snapshot read; its lag is the snapshots after it, with the files, bytes and records
their summaries say they add. It runs on a schedule of its own (an upstream Iceberg stream's commits do not trigger
it yet).

The catalog names the table by its identifier (``sink.table: namespace.table``) in a catalog (``sink.catalog``; the
default is a SQL catalog on SQLite under the lake root, :func:`sluice.storage.iceberg.default_catalog_properties`).
Its dead letters go to a Delta table (``dead_letter.path``, by default ``_dead_letter/<stream>`` under the lake root),
as a Kafka sink's do: redrive, health and the Streams page read dead letters from Delta, the same for every sink.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from sluice.constants import DeltaEngine, FileFormat, SchemaEvolution, SinkFormat, SinkMode, SourceType
from sluice.kinds.base import (
    Backlog,
    Credentials,
    SinkKind,
    SourceKind,
    declared_schema,
    reader_options,
    schema_evolution,
)
from sluice.model.keys import SCHEMA, Block, Key, Type, choices, evolution
from sluice.model.patterns import FanOutSpec
from sluice.model.section import Section
from sluice.model.sinks import SinkSpec
from sluice.model.sources import SourceSpec
from sluice.paths import Roots
from sluice.storage.iceberg_files import parse_partition

if TYPE_CHECKING:
    from sluice.model.stream import StreamSpec
    from sluice.storage.checkpoint import CheckpointReader
    from sluice.storage.iceberg import IcebergTableFormat

DEFAULT_CATALOG = "default"
# namespace.table, a namespace of one or more levels; each part a plain name (it becomes a folder of the warehouse).
ICEBERG_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_CONN_ID = re.compile(r"^[A-Za-z0-9_.-]+$")
_MODES = (SinkMode.APPEND, SinkMode.MERGE, SinkMode.COMPLETE)


CATALOG_KEY = Key("catalog", Type.STRING, "the Iceberg catalog: `default` (a SQL catalog on SQLite under the lake "
                  "root) or an Airflow connection's id: type postgres is a SQL catalog on PostgreSQL, type "
                  "http/iceberg a REST catalog by URL (Iceberg guide)", default=DEFAULT_CATALOG,
                  pattern=_CONN_ID.pattern)


@dataclass(frozen=True, kw_only=True)
class IcebergSink(SinkSpec):
    """The Iceberg table ``identifier`` of ``catalog``. ``table`` (the Delta table a sink is) stays None: health,
    the Streams page and maintenance reach the table through :meth:`IcebergSinkKind.table_format`, repair refuses
    it, and the loader gives it no added columns. Its fan-out tables are Iceberg tables of its catalog
    (``fan_out[i].table``)."""

    format: ClassVar[SinkFormat] = SinkFormat.ICEBERG
    identifier: str
    catalog: str = DEFAULT_CATALOG
    mode: SinkMode = SinkMode.APPEND
    keys: tuple[str, ...] = ()
    sequence_by: str | None = None
    #: The table's partition spec (evolved when it changes): Iceberg transforms (``day(ts)``, ``bucket(16, id)``) or
    #: columns; empty when the catalog gives ``partition_by: []`` (an existing table is unpartitioned), None when it
    #: gives none (an existing table keeps its spec: never unpartitioned by omission).
    partition_transforms: tuple[str, ...] | None = None

    @property
    def connection(self) -> str | None:
        """The Airflow connection of the catalog; the default catalog needs none."""
        return None if self.catalog == DEFAULT_CATALOG else self.catalog

    @property
    def destination(self) -> str:
        return f"Iceberg table {self.identifier} (catalog {self.catalog})"

    @property
    def lake_folder(self) -> str:
        """Where the default catalog's warehouse keeps the table (pyiceberg's default location)."""
        return self.folder_of(self.identifier)

    def folder_of(self, table: str) -> str:
        """Where the default catalog's warehouse keeps the table ``table`` of this sink's catalog (a fan-out
        table's)."""
        from sluice.storage.iceberg import CATALOG_FOLDER

        namespace, name = table.rsplit(".", 1)
        return f"{CATALOG_FOLDER}/warehouse/{namespace}/{name}"

    def fan_out_sink(self, spec: FanOutSpec) -> IcebergSink:
        """A fan-out table of this sink, as a sink of its own: the same catalog, appended to, with the fan-out's
        partition spec (how the runner, health and maintenance reach it)."""
        assert spec.table is not None
        return dataclasses.replace(self, identifier=spec.table, mode=SinkMode.APPEND, keys=(), sequence_by=None,
                                   partition_transforms=spec.partition_by or (() if spec.unpartition else None))

    def catalog_properties(self, roots: Roots) -> dict[str, str]:
        """The pyiceberg properties of the sink's catalog in these roots."""
        return catalog_properties(self.catalog, roots)


def catalog_properties(catalog: str, roots: Roots) -> dict[str, str]:
    """The pyiceberg properties of the Iceberg catalog a source or sink names, in these roots: the default SQLite
    catalog, or an Airflow connection's (:mod:`sluice.connections.iceberg`); a SQL catalog's warehouse defaults to
    ``iceberg/warehouse`` under the lake root."""
    from sluice.connections.iceberg import connection_properties
    from sluice.storage.iceberg import CATALOG_FOLDER, default_catalog_properties

    if catalog == DEFAULT_CATALOG:
        return default_catalog_properties(roots.lake)
    properties = connection_properties(catalog)
    if properties.get("type") == "sql" and "warehouse" not in properties:
        lake = roots.lake if "://" in roots.lake else Path(roots.lake).absolute().as_uri()
        properties["warehouse"] = f"{lake.rstrip('/')}/{CATALOG_FOLDER}/warehouse"
    return properties


class IcebergCredentials(Credentials):
    """A catalog connection reaches the driver as one ``SLUICE_ICEBERG_CONN_<ID>`` variable: the JSON of its
    pyiceberg catalog properties (:mod:`sluice.connections.iceberg`)."""

    def environment(self, conn_id: str) -> dict[str, str]:
        from sluice.connections.iceberg import catalog_properties as properties_of
        from sluice.connections.iceberg import env_name, read_connection

        return {env_name(conn_id): json.dumps(properties_of(read_connection(conn_id)))}

    def secrets(self, environ: Mapping[str, str]) -> list[str]:
        from sluice.connections.iceberg import env_secrets

        return env_secrets(environ)

    def described(self, env: Mapping[str, str]) -> str:
        from sluice.connections.iceberg import redact

        return "; ".join(f"Iceberg catalog, {redact(json.loads(text))}" for text in env.values())


ICEBERG_CREDENTIALS = IcebergCredentials()


def _identifier(section: Section) -> str:
    identifier = section.get("table", str, required=True)
    if not ICEBERG_IDENTIFIER.match(identifier):
        raise section.error("table", f"expected an Iceberg identifier namespace.table (letters, digits, '_'), "
                                     f"got {identifier!r}")
    return identifier


def _catalog(section: Section) -> str:
    catalog = section.get("catalog", str, DEFAULT_CATALOG)
    if not _CONN_ID.match(catalog):
        raise section.error("catalog", f"expected default or an Airflow connection id (letters, digits, '_', '-', "
                                       f"'.'), got {catalog!r}")
    return catalog


@dataclass(frozen=True, kw_only=True)
class IcebergSource(SourceSpec):
    """The Iceberg table ``identifier`` of ``catalog``, read by snapshot. ``table`` (the Delta table a source reads)
    stays None: no catalog stream is its upstream by path, and maintenance keeps no Delta version for it."""

    type: ClassVar[SourceType] = SourceType.ICEBERG
    format: FileFormat = FileFormat.ICEBERG
    identifier: str
    catalog: str = DEFAULT_CATALOG

    @property
    def origin(self) -> str:
        return f"{self.catalog}:{self.identifier}"

    @property
    def connection(self) -> str | None:
        """The Airflow connection of the catalog; the default catalog needs none."""
        return None if self.catalog == DEFAULT_CATALOG else self.catalog


# The reader options of an Iceberg source: Spark's Iceberg source's names for skipping snapshots that are no appends.
SOURCE_OPTIONS = frozenset({"streaming-skip-overwrite-snapshots", "streaming-skip-delete-snapshots"})
# As a Delta source's: new fields are the table's undeclared columns, misfits the values a declared type cannot hold.
SOURCE_POLICIES = (SchemaEvolution.RESCUE, SchemaEvolution.ADD_NEW_COLUMNS, SchemaEvolution.FAIL_ON_NEW_COLUMNS,
                   SchemaEvolution.NONE)

_ICEBERG_SOURCE = Block(
    "source (iceberg)", "source", "A table of an Iceberg catalog, read by snapshot: the rows each append adds (a "
    "silver or gold stream; Iceberg guide).",
    (
        Key("type", Type.CHOICE, "the source kind", required=True, choices=("iceberg",)),
        Key("format", Type.CHOICE, "the table format", default=FileFormat.ICEBERG, choices=("iceberg",)),
        Key("table", Type.STRING, "the table's identifier, `namespace.table`", required=True,
            pattern=ICEBERG_IDENTIFIER.pattern),
        CATALOG_KEY,
        SCHEMA,
        Key("options", Type.OPTIONS, "skip overwrite or delete snapshots instead of stopping at them (`true`)",
            choices=tuple(sorted(SOURCE_OPTIONS))),
        evolution(SOURCE_POLICIES, SchemaEvolution.RESCUE, "schema drift"),
    ),
    when=("type", "iceberg"),
)


class IcebergSourceKind(SourceKind):
    type = SourceType.ICEBERG
    # Without a schedule, the stream runs on its upstream Iceberg stream's commits (its table's Asset).
    needs_schedule = False
    credentials = ICEBERG_CREDENTIALS
    # Backfilled by a range of its snapshots' sequence numbers, or of their commit times (sluice.operations.
    # iceberg_range), as a Delta source by versions.
    backfill_refusal = None

    def catalog_blocks(self) -> tuple[Block, ...]:
        return (_ICEBERG_SOURCE,)

    def parse(self, section: Section) -> IcebergSource:
        file_format = section.enum("format", FileFormat, FileFormat.ICEBERG)
        if file_format is not FileFormat.ICEBERG:
            raise section.error("format", f"an iceberg source cannot have format {file_format.value}")
        identifier = _identifier(section)
        catalog = _catalog(section)
        schema = declared_schema(section, "iceberg")
        options = reader_options(section, SOURCE_OPTIONS, "iceberg")
        for name, value in options.items():
            if value not in ("true", "false"):
                raise section.section("options").error(name, f"expected true or false, got {value!r}")
        policy = schema_evolution(section, SOURCE_POLICIES, "iceberg")
        section.done()
        return IcebergSource(identifier=identifier, catalog=catalog, schema=schema, options=options,
                             schema_evolution=policy)

    def backlog(self, stream: StreamSpec, roots: Roots, reader: CheckpointReader) -> Backlog:
        """The snapshots of the source table after the checkpoint's, with what their summaries say they add."""
        from sluice.storage.iceberg import IcebergTableFormat
        from sluice.storage.iceberg_snapshots import history_after

        source = stream.source
        assert isinstance(source, IcebergSource)
        table = IcebergTableFormat(source.identifier, catalog_properties(source.catalog, roots))
        if not table.exists():
            return Backlog(versions=0, bytes=0, records=0,
                           notes=[f"the source table {source.identifier} does not exist yet"])
        waiting = history_after(table.table(), reader.committed_source_offset(), identifier=source.identifier)
        return Backlog(versions=len(waiting), files=sum(s.files for s in waiting), bytes=sum(s.bytes for s in waiting),
                       records=sum(s.records for s in waiting),
                       oldest_unread_at=waiting[0].timestamp_ms / 1000 if waiting else None,
                       arrivals=frozenset({f"snapshot {waiting[-1].snapshot_id}"}) if waiting else frozenset())


_ICEBERG_SINK = Block(
    "sink (iceberg)", "sink", "An Iceberg table of an Iceberg catalog, written exactly once by pyiceberg (Iceberg "
    "guide).",
    (
        Key("format", Type.CHOICE, "the sink kind", required=True, choices=("iceberg",)),
        Key("table", Type.STRING, "the table's identifier, `namespace.table`", required=True,
            pattern=ICEBERG_IDENTIFIER.pattern),
        CATALOG_KEY,
        Key("mode", Type.CHOICE, "append rows, merge them by `keys`, or rewrite the whole result (aggregates)",
            default=SinkMode.APPEND, choices=tuple(mode.value for mode in _MODES)),
        Key("keys", Type.NAMES, "the merge keys (mode merge)"),
        Key("partition_by", Type.STRINGS, "the table's partition spec (evolved when it changes): columns and Iceberg "
            "transforms `year(c)`, `month(c)`, `day(c)`, `hour(c)`, `bucket(n, c)`, `truncate(n, c)`, `identity(c)`; "
            "`[]` unpartitions the table, left out keeps its spec"),
        Key("sequence_by", Type.STRING, "under merge, the column whose larger value wins between rows of one key "
            "in a batch"),
        Key("engine", Type.CHOICE, "the Delta engine of the dead-letter table", default=DeltaEngine.AUTO,
            choices=choices(DeltaEngine)),
    ),
    when=("format", "iceberg"),
)


class IcebergSinkKind(SinkKind):
    format = SinkFormat.ICEBERG
    fan_out_key = "table"
    credentials = ICEBERG_CREDENTIALS
    backfill_refusal = None

    def catalog_blocks(self) -> tuple[Block, ...]:
        return (_ICEBERG_SINK,)

    def parse(self, section: Section) -> IcebergSink:
        identifier = _identifier(section)
        catalog = _catalog(section)
        mode = section.enum("mode", SinkMode, SinkMode.APPEND)
        if mode not in _MODES:
            raise section.error("mode", f"an Iceberg sink takes {', '.join(m.value for m in _MODES)}, not "
                                        f"{mode.value}")
        keys = section.get("keys", list, [])
        if not all(isinstance(key, str) and key for key in keys) or len(set(keys)) != len(keys):
            raise section.error("keys", f"expected distinct column names, got {keys!r}")
        sequence_by = section.get("sequence_by", str)
        given = section.get("partition_by", list)
        partitioning = [] if given is None else given
        try:
            columns = [parse_partition(text).column for text in partitioning]
        except ValueError as error:
            raise section.error("partition_by", str(error)) from None
        if len(set(columns)) != len(columns):  # pyiceberg's writer takes one partition field per source column
            raise section.error("partition_by", f"one transform per column, got {partitioning!r}")
        engine = section.enum("engine", DeltaEngine, DeltaEngine.AUTO)
        section.done()
        if keys and mode is not SinkMode.MERGE:
            raise section.error("keys", f"keys are for mode merge; mode {mode.value} does not upsert")
        if mode is SinkMode.MERGE and not keys:
            raise section.error("keys", "mode merge needs the keys to merge by")
        if sequence_by is not None and mode is not SinkMode.MERGE:
            raise section.error("sequence_by", f"sequence_by is for mode merge, not {mode.value}")
        return IcebergSink(identifier=identifier, catalog=catalog, mode=mode, keys=tuple(keys),
                           sequence_by=sequence_by, engine=engine,
                           partition_transforms=None if given is None else tuple(partitioning))

    def asset_uri(self, sink: SinkSpec) -> tuple[str, str]:
        """The table, under its catalog's name."""
        assert isinstance(sink, IcebergSink)
        return f"sluice://iceberg/{sink.catalog}/{sink.identifier}", "iceberg"

    def table_format(self, sink: SinkSpec, roots: Roots) -> IcebergTableFormat:
        from sluice.storage.iceberg import IcebergTableFormat

        assert isinstance(sink, IcebergSink)
        return IcebergTableFormat(sink.identifier, sink.catalog_properties(roots))

    def fan_out_formats(self, stream: StreamSpec, roots: Roots) -> list[tuple[int, IcebergTableFormat]]:
        """The stream's fan-out tables, Iceberg tables of its sink's catalog, by their position in ``fan_out``."""
        sink = stream.sink
        assert isinstance(sink, IcebergSink)
        return [(index, self.table_format(sink.fan_out_sink(spec), roots))
                for index, spec in enumerate(stream.patterns.fan_out) if spec.table is not None]

    def check_output(self, sink: SinkSpec, columns: list[str], *, stream: str) -> None:
        """Refuse keys and a sequence column the stream does not produce."""
        from sluice.errors import CatalogError

        assert isinstance(sink, IcebergSink)
        partitioned = [(parse_partition(text).column, "sink.partition_by") for text in sink.partition_transforms or ()]
        for name, field in [*((key, "sink.keys") for key in sink.keys), (sink.sequence_by, "sink.sequence_by"),
                            *partitioned]:
            if name is not None and name not in columns:
                raise CatalogError(f"column {name!r} is not produced by the stream; output columns: "
                                   f"{', '.join(columns)}", stream=stream, field=field)
