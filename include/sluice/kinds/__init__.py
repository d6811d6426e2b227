"""Source and sink kinds: everything Sluice does differently for one type of source or sink lives in its module.

To add a source kind (say ``type: s3_inventory``), five files, credentials included:

1. ``sluice/constants.py``: a member of :class:`~sluice.constants.SourceType`;
2. ``sluice/kinds/s3_inventory.py``, beside :mod:`~sluice.kinds.files`: a spec dataclass subclassing
   :class:`~sluice.model.sources.SourceSpec` (its ``connection`` property names the Airflow connection it reads
   with, if any), and a :class:`~sluice.kinds.base.SourceKind` that parses its catalog section and measures its
   backlog. When it needs credentials, its ``credentials`` is a :class:`~sluice.kinds.base.Credentials`: how the
   connection becomes the driver's environment variables, and which of their values are secrets (masked in the task
   log, scrubbed from every error a run reports);
3. this file: one line in :data:`SOURCE_KINDS` below;
4. ``sluice_spark/kinds/s3_inventory.py``: its Spark module, which reads it as a streaming DataFrame (and the
   variables its credentials declared);
5. ``sluice_spark/kinds/__init__.py``: one line in ``READERS``.

A sink kind is the same with :class:`~sluice.constants.SinkFormat`, :class:`~sluice.kinds.base.SinkKind`,
:data:`SINK_KINDS` and ``SINKS``. ``tests/unit/test_kind_registries.py`` fails until the registries agree.

The catalog, the health gate, the lag probes and the backfill planner ask the kind; none of them branches on the
source type. The operators, the runners and the warm server reach its credentials through
:mod:`sluice.kinds.credentials` and never name a kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice.constants import SinkFormat, SourceType, TableRole
from sluice.kinds.base import Backlog, SinkKind, SourceKind
from sluice.kinds.delta import DeltaSinkKind, DeltaSourceKind
from sluice.kinds.files import FilesKind
from sluice.kinds.iceberg import IcebergSinkKind, IcebergSourceKind
from sluice.kinds.kafka import KafkaSinkKind, KafkaSourceKind
from sluice.model.section import Section
from sluice.model.sinks import SinkSpec
from sluice.model.sources import SourceSpec

if TYPE_CHECKING:
    from sluice.model.stream import StreamSpec
    from sluice.paths import Roots
    from sluice.storage.tableformat import TableFormat

SOURCE_KINDS: dict[SourceType, SourceKind] = {kind.type: kind for kind in (FilesKind(), DeltaSourceKind(),
                                                                           KafkaSourceKind(), IcebergSourceKind())}
SINK_KINDS: dict[SinkFormat, SinkKind] = {kind.format: kind for kind in (DeltaSinkKind(), KafkaSinkKind(),
                                                                         IcebergSinkKind())}

__all__ = ["SINK_KINDS", "SOURCE_KINDS", "Backlog", "SinkKind", "SourceKind", "parse_sink", "parse_source",
           "sink_kind", "sink_table_format", "source_kind", "table_formats"]


def source_kind(source: SourceSpec) -> SourceKind:
    return SOURCE_KINDS[source.type]


def sink_kind(sink: SinkSpec) -> SinkKind:
    return SINK_KINDS[sink.format]


def sink_table_format(stream: StreamSpec, roots: Roots) -> TableFormat | None:
    """The stream's sink table through the table-format seam (Delta or Iceberg); None for a sink that is no table
    (Kafka)."""
    from sluice.storage.tableformat import DeltaTableFormat

    if stream.sink.table is not None:
        return DeltaTableFormat(stream.sink_path(roots))
    return sink_kind(stream.sink).table_format(stream.sink, roots)


def table_formats(stream: StreamSpec, roots: Roots, *, tombstones: bool = False) -> list[tuple[str, TableFormat]]:
    """Every table the stream's batches commit to, by the name reports give it (``sink``, ``dead_letter``,
    ``fan_out[i]``), through the seam: its Delta tables (:meth:`~sluice.model.stream.StreamSpec.tables`, with a cdc
    sink's ``tombstones`` when asked), an Iceberg sink's table first and its Iceberg fan-out tables last."""
    from sluice.storage.tableformat import DeltaTableFormat

    formats: list[tuple[str, TableFormat]] = [(table.name, DeltaTableFormat(table.path))
                                              for table in stream.tables(roots, tombstones=tombstones)]
    kind = sink_kind(stream.sink)
    own = kind.table_format(stream.sink, roots) if stream.sink.table is None else None
    formats += [(f"{TableRole.FAN_OUT.value}[{index}]", table) for index, table in kind.fan_out_formats(stream, roots)]
    return [*([(TableRole.SINK.value, own)] if own is not None else []), *formats]


def parse_source(section: Section) -> SourceSpec:
    """A ``source`` section, read by the kind its ``type`` names."""
    return SOURCE_KINDS[section.enum("type", SourceType, required=True)].parse(section)


def parse_sink(section: Section) -> SinkSpec:
    """A ``sink`` section, read by the kind its ``format`` names (delta unless given)."""
    return SINK_KINDS[section.enum("format", SinkFormat, SinkFormat.DELTA)].parse(section)
