"""What every sink declares, whatever its kind: the base of the sink specs in :mod:`sluice.kinds`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from sluice.constants import DeltaEngine, SinkFormat, SinkMode


@dataclass(frozen=True, kw_only=True)
class SinkSpec:
    """Where the stream's good rows go. ``engine`` is the Delta engine of every table the stream writes (its sink
    table, if the sink is one, and its dead-letter table, which every stream has)."""

    format: ClassVar[SinkFormat]
    engine: DeltaEngine = DeltaEngine.AUTO

    @property
    def mode(self) -> SinkMode:
        """How a batch is written: appended, merged by key, or rewritten whole."""
        return SinkMode.APPEND

    @property
    def connection(self) -> str | None:
        """The Airflow connection that holds where the sink is and how to log in (Kafka)."""
        return None

    @property
    def table(self) -> str | None:
        """The Delta table under the lake root the sink writes, as the catalog names it; None for a sink that is
        not a Delta table (Kafka)."""
        return None

    @property
    def partition_by(self) -> tuple[str, ...]:
        return ()

    @property
    def lake_folder(self) -> str | None:
        """The folder under the lake root that a sink which is no Delta table writes its table in (an Iceberg
        table's, in the default catalog's warehouse), claimed like a table path so that no two streams write it."""
        return None

    def folder_of(self, table: str) -> str | None:
        """The folder under the lake root where another table of this sink's catalog lives (an Iceberg sink's
        fan-out table ``table``), claimed as :attr:`lake_folder` is; None for a sink whose fan-out tables are Delta
        paths."""
        return None

    @property
    def destination(self) -> str:
        """Where the sink writes, as the catalog names it (a table path, a topic)."""
        return self.table or ""


@dataclass(frozen=True, kw_only=True)
class CdcSpec:
    """How a ``mode: cdc`` sink applies a feed of changes by key, in ``sequence_by`` order.

    ``delete_when`` is the Spark SQL predicate over the source row that makes it a delete (a Debezium envelope's
    default: its operation is ``d``). Type 1 keeps the newest row per key; type 2 every version, from ``__start_at``
    to ``__end_at``, a change to a column outside ``track_history_columns`` (when named) updating the current version
    in place. A delete is remembered for ``delete_retention_seconds``, so that an older change arriving after it does
    not bring the key back.
    """

    delete_when: str | None = None
    scd_type: int = 1
    except_columns: tuple[str, ...] = ()
    track_history_columns: tuple[str, ...] = ()
    delete_retention_seconds: int = 7 * 86_400

    def to_dict(self) -> dict[str, Any]:
        return {"delete_when": self.delete_when, "scd_type": self.scd_type, "except_columns": list(self.except_columns),
                "track_history_columns": list(self.track_history_columns),
                "delete_retention_seconds": self.delete_retention_seconds}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CdcSpec:
        return cls(delete_when=data.get("delete_when"), scd_type=int(data.get("scd_type", 1)),
                   except_columns=tuple(data.get("except_columns", ())),
                   track_history_columns=tuple(data.get("track_history_columns", ())),
                   delete_retention_seconds=int(data.get("delete_retention_seconds", 7 * 86_400)))
