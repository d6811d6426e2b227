"""Source and sink kinds: everything Sluice does differently for one type of source or sink lives in its module.

To add a source kind (say ``type: s3_inventory``):

1. a member of :class:`~sluice.constants.SourceType`;
2. its core module here, beside :mod:`~sluice.kinds.files`: a spec dataclass subclassing
   :class:`~sluice.model.sources.SourceSpec`, and a :class:`~sluice.kinds.base.SourceKind` that parses its catalog
   section and measures its backlog;
3. its Spark module in :mod:`sluice_spark.kinds`, which reads it as a streaming DataFrame;
4. one line in :data:`SOURCE_KINDS` below, and one in ``sluice_spark.kinds.READERS``.

The catalog, the health gate, the lag probes and the backfill planner ask the kind; none of them branches on the
source type.
"""

from __future__ import annotations

from sluice.constants import SinkFormat, SourceType
from sluice.kinds.base import Backlog, SinkKind, SourceKind
from sluice.kinds.delta import DeltaSinkKind, DeltaSourceKind
from sluice.kinds.files import FilesKind
from sluice.kinds.kafka import KafkaSinkKind, KafkaSourceKind
from sluice.model.section import Section
from sluice.model.sinks import SinkSpec
from sluice.model.sources import SourceSpec

SOURCE_KINDS: dict[SourceType, SourceKind] = {kind.type: kind for kind in (FilesKind(), DeltaSourceKind(),
                                                                           KafkaSourceKind())}
SINK_KINDS: dict[SinkFormat, SinkKind] = {kind.format: kind for kind in (DeltaSinkKind(), KafkaSinkKind())}

__all__ = ["SINK_KINDS", "SOURCE_KINDS", "Backlog", "SinkKind", "SourceKind", "parse_sink", "parse_source",
           "sink_kind", "source_kind"]


def source_kind(source: SourceSpec) -> SourceKind:
    return SOURCE_KINDS[source.type]


def sink_kind(sink: SinkSpec) -> SinkKind:
    return SINK_KINDS[sink.format]


def parse_source(section: Section) -> SourceSpec:
    """A ``source`` section, read by the kind its ``type`` names."""
    return SOURCE_KINDS[section.enum("type", SourceType, required=True)].parse(section)


def parse_sink(section: Section) -> SinkSpec:
    """A ``sink`` section, read by the kind its ``format`` names (delta unless given)."""
    return SINK_KINDS[section.enum("format", SinkFormat, SinkFormat.DELTA)].parse(section)
