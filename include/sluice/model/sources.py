"""What every source declares, whatever its kind: the base of the source specs in :mod:`sluice.kinds`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from sluice.constants import (
    RESCUED_COLUMN,
    SOURCE_FILE_COLUMN,
    Envelope,
    FileFormat,
    OnTruncate,
    SchemaEvolution,
    SourceType,
)
from sluice.model.schema import Column, Schema
from sluice.paths import Roots


@dataclass(frozen=True, kw_only=True)
class SourceSpec:
    """A source read with a declared ``schema``: its ``format`` (a file format, or a Kafka value encoding) and the
    reader ``options`` its kind accepts. Each kind (:mod:`sluice.kinds`) subclasses it with what it adds."""

    type: ClassVar[SourceType]
    #: The columns Sluice adds to every record it reads (its lineage), by name, with their Spark SQL types: a
    #: transform and an expectation may name them, and they ride along to the table.
    lineage: ClassVar[Mapping[str, str]] = {SOURCE_FILE_COLUMN: "STRING"}
    #: How many sources one read of it puts in Spark's checkpoint (``offsets/N`` lists one offset per source).
    checkpoint_sources: ClassVar[int] = 1
    format: FileFormat
    schema: Schema
    options: Mapping[str, str] = field(default_factory=dict)
    #: What the stream does with fields the schema does not declare (:class:`~sluice.constants.SchemaEvolution`).
    schema_evolution: SchemaEvolution = SchemaEvolution.NONE
    #: Under ``add_new_columns``, the columns earlier batches added to the stream's table, read like declared ones
    #: (filled in before a run from the table's schema, :func:`sluice.storage.delta.added_columns`).
    evolved: tuple[Column, ...] = ()
    #: How each record wraps its row: under ``debezium`` the schema declares the row (``after``, or ``before`` for a
    #: delete) and ends with the unwrapped operation, ts_ms and sequence (:data:`~sluice.constants.DEBEZIUM_COLUMNS`).
    envelope: Envelope = Envelope.NONE
    #: The envelope's field (a dotted path, ``source.lsn``) that orders two events of one millisecond.
    envelope_tiebreak: str | None = None
    envelope_truncate: OnTruncate = OnTruncate.FAIL

    def location(self, roots: Roots) -> str | None:
        """The resolved folder or table the source reads; None for a source without a path (Kafka)."""
        return None

    @property
    def columns(self) -> dict[str, str]:
        """What a record holds once read: the declared columns and the lineage, with their Spark SQL types."""
        rescued = {RESCUED_COLUMN: "STRING"} if self.rescues else {}
        return {**{column.name: column.data_type.sql() for column in self.schema.columns}, **rescued, **self.lineage}

    @property
    def never_null(self) -> set[str]:
        """The columns a record always has a value in: the declared ``not null`` ones, and what the kind adds so."""
        return set(self.schema.required)

    @property
    def rescues(self) -> bool:
        """Its rows carry ``_rescued_data``: under ``rescue``, and under ``add_new_columns`` for what is not a new
        top-level column (a new nested field, a value that does not fit its type)."""
        return self.schema_evolution in (SchemaEvolution.RESCUE, SchemaEvolution.ADD_NEW_COLUMNS)

    @property
    def read_schema(self) -> Schema:
        """What a run reads: the declared columns, and the ones ``add_new_columns`` added."""
        return Schema(self.schema.columns + self.evolved) if self.evolved else self.schema

    @property
    def record_options(self) -> Mapping[str, str]:
        """The options that say how one record's text is parsed (a file reader's ``sep``, ``multiLine``...), to
        read a rejected record again and tell why it was rejected."""
        return {}

    @property
    def origin(self) -> str:
        """Where the source reads, as the catalog names it (a folder, a table, a connection's topics)."""
        return self.table or self.landing or ""

    @property
    def connection(self) -> str | None:
        """The Airflow connection that holds where the source is and how to log in (Kafka)."""
        return None

    @property
    def table(self) -> str | None:
        """The Delta table under the lake root this source reads, as the catalog names it (a Delta source)."""
        return None

    @property
    def landing(self) -> str | None:
        """The folder under the landing root this source reads, as the catalog names it (a file source)."""
        return None
