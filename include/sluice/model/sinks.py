"""What every sink declares, whatever its kind: the base of the sink specs in :mod:`sluice.kinds`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

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
    def destination(self) -> str:
        """Where the sink writes, as the catalog names it (a table path, a topic)."""
        return self.table or ""
