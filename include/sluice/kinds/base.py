"""What a source kind and a sink kind are: the contract every kind module of :mod:`sluice.kinds` fulfils.

A kind owns everything Sluice does differently for one type of source or sink, on the core side (this package;
no pyspark, so the Airflow scheduler can load a catalog and a sensor can measure lag cheaply):

- its **spec**, a frozen dataclass subclassing :class:`~sluice.model.sources.SourceSpec` or
  :class:`~sluice.model.sinks.SinkSpec`, and the **parser** of its catalog section, which refuses what it does
  not accept with the field named;
- its **credentials** (:class:`Credentials`), when its streams name Airflow connections: how each connection
  becomes the environment of a run's driver, and which of that environment is secret (masked in the task log,
  scrubbed from every error a run reports). The operators, the runners and the warm server ask
  :mod:`sluice.kinds.credentials`, which asks the kinds; none of them names a kind;
- for a source, its **lag probe** (what the next run will read, measured without Spark), its own **health
  findings**, whether it takes the file **trigger limits**, whether it needs a **schedule** of its own, and
  whether it can be **backfilled** by file time.

How it is read or written in Spark is its module in :mod:`sluice_spark.kinds`.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from sluice.constants import (
    DEBEZIUM_COLUMNS,
    DEBEZIUM_SEQUENCE_COLUMN,
    DEBEZIUM_TS_COLUMN,
    Envelope,
    OnTruncate,
    SchemaEvolution,
    SinkFormat,
    SourceType,
)
from sluice.model.findings import Finding
from sluice.model.keys import Block, Key, Type, choices
from sluice.model.schema import Column, Schema, parse_schema
from sluice.model.section import Section
from sluice.model.sinks import SinkSpec
from sluice.model.sources import SourceSpec
from sluice.model.types import parse as parse_type

if TYPE_CHECKING:
    from sluice.model.stream import StreamSpec
    from sluice.paths import Roots
    from sluice.storage.checkpoint import CheckpointReader
    from sluice.storage.tableformat import TableFormat


@dataclass
class Backlog:
    """What the stream's source holds that its checkpoint has not processed. A measure the source kind cannot
    tell is None: files for Kafka, records for files."""

    files: int | None = None
    bytes: int | None = None
    records: int | None = None
    versions: int | None = None
    oldest_unread_at: float | None = None
    partitions: dict[str, int] = field(default_factory=dict)
    new_partitions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: The unread data by identity (a file's path, a partition's end offset, a table's version): a member the last
    #: look did not see is new data, which is what the arrival watcher starts runs on.
    arrivals: frozenset[str] = frozenset()

    @property
    def units(self) -> int | None:
        """The count the trend rules follow: records where known, else files, else versions."""
        for value in (self.records, self.files, self.versions):
            if value is not None:
                return value
        return None

    @property
    def empty(self) -> bool:
        return not any((self.files, self.bytes, self.records, self.versions))


class Credentials(ABC):
    """How the Airflow connections a kind's streams name (``source.connection``, ``sink.connection``) reach a run:
    as environment variables of its driver, never on a command line, in XCom or in a log."""

    @abstractmethod
    def environment(self, conn_id: str) -> dict[str, str]:
        """The variables that carry connection ``conn_id`` to the driver, read from Airflow now (in the worker at
        run time, never while a DAG file is parsed). Raise :class:`~sluice.errors.SluiceError` naming the connection
        when it is not defined or not usable."""

    @abstractmethod
    def secrets(self, environ: Mapping[str, str]) -> list[str]:
        """Every form of every secret that this kind's variables in ``environ`` carry: what the launcher masks and
        the driver scrubs from its errors."""

    def described(self, env: Mapping[str, str]) -> str:
        """``env`` (what :meth:`environment` returned) as a log may show it; the variables' names by default."""
        return ", ".join(sorted(env))


class SourceKind(ABC):
    """One type of source (``source.type`` in the catalog)."""

    type: ClassVar[SourceType]
    #: How the connections its streams name reach a run; None for a kind that needs none.
    credentials: ClassVar[Credentials | None] = None
    #: Takes ``trigger.max_files_per_trigger`` and ``trigger.max_bytes_per_trigger`` (Spark's file and Delta
    #: sources do; Kafka limits offsets with its own option).
    trigger_limits: ClassVar[bool] = True
    #: A stream of this kind needs a cron ``schedule``; a Delta source may instead run when the catalog stream that
    #: writes its table commits (an Airflow asset).
    needs_schedule: ClassVar[bool] = True
    #: Its backlog tells its unread bytes without reading them (a Kafka topic's records have no size until read).
    measures_bytes: ClassVar[bool] = True
    #: Why a backfill of this kind is refused; None when it can be backfilled (by file time).
    backfill_refusal: ClassVar[str | None] = "backfills select files by time, and this source has no files"

    @abstractmethod
    def parse(self, section: Section) -> SourceSpec:
        """The source section of a catalog entry, checked; refuse anything else with the field named."""

    @abstractmethod
    def catalog_blocks(self) -> tuple[Block, ...]:
        """The keys its source section takes, as data (one block per variant): the catalog reference and the JSON
        Schema are generated from them, and a unit test holds them to what :meth:`parse` accepts."""

    @abstractmethod
    def backlog(self, stream: StreamSpec, roots: Roots, reader: CheckpointReader) -> Backlog:
        """What the stream's next run will read, from the source and the checkpoint alone (no JVM)."""

    def findings(self, stream: StreamSpec, roots: Roots) -> list[Finding]:
        """What the health gate must know about the source itself before a run."""
        return []


def declared_schema(section: Section, what: str) -> Schema:
    """The source's declared ``schema``, required: inferring one from whatever arrives first is not reproducible."""
    if "schema" not in section.raw or section.raw["schema"] is None:
        raise section.error("schema", f"a {what} source needs a declared schema; inferring one from whatever "
                                      "arrives first is not reproducible")
    return parse_schema(section.get("schema", Mapping), stream=section.stream or "", field=section.field("schema"))


def schema_evolution(section: Section, supported: Collection[SchemaEvolution], what: str) -> SchemaEvolution:
    """The source's drift policy (``schema_evolution``): ``rescue`` by default where the kind can rescue, else
    ``none``. A policy the kind cannot follow is refused, not approximated."""
    default = SchemaEvolution.RESCUE if SchemaEvolution.RESCUE in supported else SchemaEvolution.NONE
    policy: SchemaEvolution = section.enum("schema_evolution", SchemaEvolution, default)
    if policy not in supported:
        choices = ", ".join(member.value for member in SchemaEvolution if member in supported)
        raise section.error("schema_evolution", f"a {what} source cannot follow {policy.value}; it takes {choices}")
    return policy


def reader_options(section: Section, allowed: frozenset[str], what: str) -> dict[str, str]:
    """The source's reader ``options``, each one the kind accepts, as the strings Spark takes."""
    options_section = section.section("options")
    options: dict[str, str] = {}
    for key, value in options_section.raw.items():
        if key not in allowed:
            raise options_section.error(str(key), f"not a supported {what} source option; allowed: "
                                                  f"{', '.join(sorted(allowed))}")
        if isinstance(value, Mapping | list):
            raise options_section.error(str(key), "expected a scalar value")
        options[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
        options_section.allowed.add(key)
    options_section.done()
    return options


class SinkKind(ABC):
    """One type of sink (``sink.format`` in the catalog)."""

    format: ClassVar[SinkFormat]
    #: How the connections its streams name reach a run; None for a kind that needs none.
    credentials: ClassVar[Credentials | None] = None
    #: Why a backfill into this sink is refused; None when it can take one (a Delta table).
    backfill_refusal: ClassVar[str | None] = None
    #: The key that names a fan-out table beside this sink (``path``: a Delta table; ``table``: an Iceberg table of
    #: the sink's catalog); None for a sink that takes no fan-out (Kafka).
    fan_out_key: ClassVar[str | None] = None

    @abstractmethod
    def parse(self, section: Section) -> SinkSpec:
        """The sink section of a catalog entry, checked."""

    @abstractmethod
    def catalog_blocks(self) -> tuple[Block, ...]:
        """The keys its sink section takes, as data (see :meth:`SourceKind.catalog_blocks`)."""

    def asset_uri(self, sink: SinkSpec) -> tuple[str, str] | None:
        """The URI and group of the Airflow Asset a stream writing this sink produces, when it is no table (a
        table's is its path); None for a table."""
        return None

    def table_format(self, sink: SinkSpec, roots: Roots) -> TableFormat | None:
        """The sink's table through the table-format seam, when it is a table that is no Delta table of
        :meth:`~sluice.model.stream.StreamSpec.tables` (an Iceberg table); None otherwise."""
        return None

    def fan_out_formats(self, stream: StreamSpec, roots: Roots) -> Sequence[tuple[int, TableFormat]]:
        """The stream's fan-out tables that are no Delta tables of :meth:`~sluice.model.stream.StreamSpec.tables`
        (an Iceberg sink's), by their position in ``fan_out``."""
        return []

    def check_output(self, sink: SinkSpec, columns: list[str], *, stream: str) -> None:
        """Refuse a sink that names a column the stream does not produce (``columns``: its output columns). A
        Delta sink's columns are checked with the patterns (:func:`sluice.catalog.patterns.check_patterns`)."""
        return None


ENVELOPE_KEYS = (
    Key("envelope", Type.CHOICE, "how a record wraps its row: `debezium` unwraps before/after/op/ts_ms into the "
        "row and `__op`, `__ts_ms`, `__sequence` (change-data guide)", default=Envelope.NONE,
        choices=choices(Envelope)),
    Key("envelope_tiebreak", Type.STRING, "debezium: the envelope's integer field that orders events of one "
        "millisecond in `__sequence` (e.g. `source.lsn`)",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"),
    Key("envelope_truncate", Type.CHOICE, "debezium: what a truncate event does: stop the run, or be skipped",
        default=OnTruncate.FAIL, choices=choices(OnTruncate)),
)
_FIELD_PATH = re.compile(ENVELOPE_KEYS[1].pattern or "")


@dataclass(frozen=True)
class EnvelopeSpec:
    envelope: Envelope = Envelope.NONE
    tiebreak: str | None = None
    truncate: OnTruncate = OnTruncate.FAIL


def read_envelope(section: Section, schema: Schema, *, json: bool) -> tuple[EnvelopeSpec, Schema]:
    """The source's envelope keys, and its schema as a run reads it: under ``debezium``, the declared row and the
    unwrapped columns (a declared name cannot start with ``_``: they cannot clash). Only a JSON record is unwrapped."""
    if not json:
        if section.raw.get("envelope") not in (None, Envelope.NONE.value):
            raise section.error("envelope", "a debezium envelope is unwrapped from JSON records; read format json")
        return EnvelopeSpec(), schema
    kind = section.enum("envelope", Envelope, Envelope.NONE)
    tiebreak = section.get("envelope_tiebreak", str)
    truncate = section.enum("envelope_truncate", OnTruncate, OnTruncate.FAIL)
    if kind is Envelope.NONE:
        for key in ("envelope_tiebreak", "envelope_truncate"):
            if section.raw.get(key) is not None:
                raise section.error(key, "is for source.envelope: debezium")
        return EnvelopeSpec(), schema
    if tiebreak is not None and not _FIELD_PATH.match(tiebreak):
        raise section.error("envelope_tiebreak", f"expected a dotted field path such as source.lsn, got {tiebreak!r}")
    required = {DEBEZIUM_TS_COLUMN, DEBEZIUM_SEQUENCE_COLUMN}
    added = tuple(Column(name, sql, name not in required, parse_type(sql)[0]) for name, sql in DEBEZIUM_COLUMNS.items())
    return EnvelopeSpec(kind, tiebreak, truncate), Schema(schema.columns + added)
