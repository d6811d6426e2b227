"""The stateful patterns a catalog stream may declare, and the output-mode rules that govern them.

A stream runs, in this order: source -> dead-letter split -> row transform -> ``dedupe`` -> ``join`` (stream-stream)
-> ``lookup`` (stream-static) -> ``aggregate`` -> sink. Every stateful step needs the stream's ``watermark`` so
that its state is evicted and a finalized result can be emitted; the catalog refuses a combination that Spark would
refuse at analysis time, or that it would accept and then keep state forever, and it says how to fix it
(:mod:`sluice.catalog.patterns` reads and checks them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from sluice.model.sources import SourceSpec

WINDOW_START = "window_start"
WINDOW_END = "window_end"


@dataclass(frozen=True)
class WatermarkSpec:
    """``withWatermark(column, delay)``: events older than the newest event time seen minus ``delay`` are late."""

    column: str
    delay_seconds: int


@dataclass(frozen=True)
class DedupeSpec:
    """``dropDuplicatesWithinWatermark(keys)``: a row whose keys were seen within the watermark delay is dropped.
    State for a key is kept until the watermark passes its first event time plus the delay."""

    keys: tuple[str, ...]


@dataclass(frozen=True)
class LookupSpec:
    """A stream-static left join with a dimension Delta table (under the lake root), read once per run."""

    table: str
    on: tuple[str, ...]
    columns: tuple[str, ...]


class JoinType(str, Enum):
    INNER = "inner"
    LEFT_OUTER = "left_outer"


@dataclass(frozen=True)
class JoinSpec:
    """A stream-stream join with a second Delta source, bounded in event time on both sides.

    A right row joins a left row with equal ``on`` keys when ``left.<left_time> <= right.<right_time> <=
    left.<left_time> + max_delay``. Both sides carry a watermark, so each side's state is evicted once no future row
    of the other side can match it; a left-outer row is emitted with NULLs once that is certain.
    """

    source: SourceSpec  # a Delta source (sluice.kinds.delta.DeltaSource)
    watermark: WatermarkSpec
    on: tuple[str, ...]
    left_time: str
    right_time: str
    max_delay_seconds: int
    type: JoinType = JoinType.INNER


class WindowType(str, Enum):
    TUMBLING = "tumbling"
    SLIDING = "sliding"
    SESSION = "session"


@dataclass(frozen=True)
class WindowSpec:
    """An event-time window over ``column``: tumbling (``duration``), sliding (``duration`` every ``slide``) or
    session (closed after ``gap`` without an event)."""

    type: WindowType
    column: str
    duration_seconds: int = 0
    slide_seconds: int = 0
    gap_seconds: int = 0


@dataclass(frozen=True)
class Measure:
    """``name: function(column)`` in the catalog, e.g. ``revenue: sum(amount)``."""

    name: str
    function: str
    column: str  # "*" for count(*)


@dataclass(frozen=True)
class AggregateSpec:
    window: WindowSpec | None
    group_by: tuple[str, ...]
    measures: tuple[Measure, ...]

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The columns that identify one result row: the window bounds and the grouping columns."""
        return ((WINDOW_START, WINDOW_END) if self.window else ()) + self.group_by


@dataclass(frozen=True)
class FanOutSpec:
    """One more table fed from the same batch: the good rows for which ``where`` (a Spark SQL predicate over the
    output columns) is true, optionally only some ``columns``. A Delta table by its ``path`` under the lake root, or,
    beside an Iceberg sink, an Iceberg table of the sink's catalog by its identifier ``table`` (``path`` empty; its
    ``partition_by`` Iceberg transforms)."""

    path: str
    where: str
    columns: tuple[str, ...] = ()
    partition_by: tuple[str, ...] = ()
    table: str | None = None
    #: An Iceberg fan-out table's ``partition_by: []``, given: its existing table is unpartitioned (left out, an
    #: existing table keeps its spec).
    unpartition: bool = False


@dataclass(frozen=True)
class Patterns:
    """Everything a stream declares beyond a row-wise transform."""

    watermark: WatermarkSpec | None = None
    dedupe: DedupeSpec | None = None
    join: JoinSpec | None = None
    lookup: tuple[LookupSpec, ...] = ()
    aggregate: AggregateSpec | None = None
    fan_out: tuple[FanOutSpec, ...] = field(default_factory=tuple)

    @property
    def stateful(self) -> bool:
        return self.dedupe is not None or self.join is not None or self.aggregate is not None
