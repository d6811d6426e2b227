"""The Iceberg sink: a table of an Iceberg catalog, written exactly once by the pip-only engine (pyiceberg).

The catalog names the table by its identifier (``sink.table: namespace.table``) in a catalog (``sink.catalog``; the
default is a SQL catalog on SQLite under the lake root, :func:`sluice.storage.iceberg.default_catalog_properties`).
Its dead letters go to a Delta table (``dead_letter.path``, by default ``_dead_letter/<stream>`` under the lake root),
as a Kafka sink's do: redrive, health and the Streams page read dead letters from Delta, the same for every sink.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from sluice.constants import DeltaEngine, SinkFormat, SinkMode
from sluice.kinds.base import SinkKind
from sluice.model.keys import Block, Key, Type, choices
from sluice.model.section import Section
from sluice.model.sinks import SinkSpec
from sluice.paths import Roots
from sluice.storage.iceberg_files import parse_partition

if TYPE_CHECKING:
    from sluice.storage.iceberg import IcebergTableFormat

DEFAULT_CATALOG = "default"
# namespace.table, a namespace of one or more levels; each part a plain name (it becomes a folder of the warehouse).
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_MODES = (SinkMode.APPEND, SinkMode.MERGE, SinkMode.COMPLETE)


@dataclass(frozen=True, kw_only=True)
class IcebergSink(SinkSpec):
    """The Iceberg table ``identifier`` of ``catalog``. ``table`` (the Delta table a sink is) stays None: health,
    the Streams page and maintenance reach the table through :meth:`IcebergSinkKind.table_format`, repair refuses
    it, and the loader gives it no fan-out and no added columns."""

    format: ClassVar[SinkFormat] = SinkFormat.ICEBERG
    identifier: str
    catalog: str = DEFAULT_CATALOG
    mode: SinkMode = SinkMode.APPEND
    keys: tuple[str, ...] = ()
    sequence_by: str | None = None
    #: The table's partition spec at creation: Iceberg transforms (``day(ts)``, ``bucket(16, id)``) or columns.
    partition_transforms: tuple[str, ...] = ()

    @property
    def destination(self) -> str:
        return f"Iceberg table {self.identifier} (catalog {self.catalog})"

    @property
    def lake_folder(self) -> str:
        """Where the default catalog's warehouse keeps the table (pyiceberg's default location)."""
        from sluice.storage.iceberg import CATALOG_FOLDER

        namespace, table = self.identifier.rsplit(".", 1)
        return f"{CATALOG_FOLDER}/warehouse/{namespace}/{table}"

    def catalog_properties(self, roots: Roots) -> dict[str, str]:
        """The pyiceberg properties of the sink's catalog in these roots."""
        from sluice.storage.iceberg import default_catalog_properties

        return default_catalog_properties(roots.lake)


_ICEBERG_SINK = Block(
    "sink (iceberg)", "sink", "An Iceberg table of an Iceberg catalog, written exactly once by pyiceberg (Iceberg "
    "guide).",
    (
        Key("format", Type.CHOICE, "the sink kind", required=True, choices=("iceberg",)),
        Key("table", Type.STRING, "the table's identifier, `namespace.table`", required=True,
            pattern=_IDENTIFIER.pattern),
        Key("catalog", Type.CHOICE, "the Iceberg catalog: `default` is a SQL catalog on SQLite under the lake root",
            default=DEFAULT_CATALOG, choices=(DEFAULT_CATALOG,)),
        Key("mode", Type.CHOICE, "append rows, merge them by `keys`, or rewrite the whole result (aggregates)",
            default=SinkMode.APPEND, choices=tuple(mode.value for mode in _MODES)),
        Key("keys", Type.NAMES, "the merge keys (mode merge)"),
        Key("partition_by", Type.STRINGS, "the table's partition spec at its creation: columns and Iceberg transforms "
            "`year(c)`, `month(c)`, `day(c)`, `hour(c)`, `bucket(n, c)`, `truncate(n, c)`, `identity(c)` (append, "
            "complete)"),
        Key("sequence_by", Type.STRING, "under merge, the column whose larger value wins between rows of one key "
            "in a batch"),
        Key("engine", Type.CHOICE, "the Delta engine of the dead-letter table", default=DeltaEngine.AUTO,
            choices=choices(DeltaEngine)),
    ),
    when=("format", "iceberg"),
)


class IcebergSinkKind(SinkKind):
    format = SinkFormat.ICEBERG
    backfill_refusal = None

    def catalog_blocks(self) -> tuple[Block, ...]:
        return (_ICEBERG_SINK,)

    def parse(self, section: Section) -> IcebergSink:
        identifier = section.get("table", str, required=True)
        if not _IDENTIFIER.match(identifier):
            raise section.error("table", f"expected an Iceberg identifier namespace.table (letters, digits, '_'), "
                                         f"got {identifier!r}")
        catalog = section.get("catalog", str, DEFAULT_CATALOG)
        if catalog != DEFAULT_CATALOG:
            raise section.error("catalog", f"only the default catalog (SQLite under the lake root) is supported "
                                           f"yet, got {catalog!r}; leave it out")
        mode = section.enum("mode", SinkMode, SinkMode.APPEND)
        if mode not in _MODES:
            raise section.error("mode", f"an Iceberg sink takes {', '.join(m.value for m in _MODES)}, not "
                                        f"{mode.value}")
        keys = section.get("keys", list, [])
        if not all(isinstance(key, str) and key for key in keys) or len(set(keys)) != len(keys):
            raise section.error("keys", f"expected distinct column names, got {keys!r}")
        sequence_by = section.get("sequence_by", str)
        partitioning = section.get("partition_by", list, [])
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
        if partitioning and mode is SinkMode.MERGE:
            raise section.error("partition_by", "a merge into a partitioned Iceberg table is not supported yet "
                                                "(append and complete are)")
        return IcebergSink(identifier=identifier, catalog=catalog, mode=mode, keys=tuple(keys),
                           sequence_by=sequence_by, engine=engine, partition_transforms=tuple(partitioning))

    def asset_uri(self, sink: SinkSpec) -> tuple[str, str]:
        """The table, under its catalog's name."""
        assert isinstance(sink, IcebergSink)
        return f"sluice://iceberg/{sink.catalog}/{sink.identifier}", "iceberg"

    def table_format(self, sink: SinkSpec, roots: Roots) -> IcebergTableFormat:
        from sluice.storage.iceberg import IcebergTableFormat

        assert isinstance(sink, IcebergSink)
        return IcebergTableFormat(sink.identifier, sink.catalog_properties(roots))

    def check_output(self, sink: SinkSpec, columns: list[str], *, stream: str) -> None:
        """Refuse keys and a sequence column the stream does not produce."""
        from sluice.errors import CatalogError

        assert isinstance(sink, IcebergSink)
        partitioned = [(parse_partition(text).column, "sink.partition_by") for text in sink.partition_transforms]
        for name, field in [*((key, "sink.keys") for key in sink.keys), (sink.sequence_by, "sink.sequence_by"),
                            *partitioned]:
            if name is not None and name not in columns:
                raise CatalogError(f"column {name!r} is not produced by the stream; output columns: "
                                   f"{', '.join(columns)}", stream=stream, field=field)
