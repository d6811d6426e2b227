"""One catalog stream as the rest of Sluice sees it: its source and sink (each of its kind), its patterns, its
limits and thresholds, and the one answer to "which tables does it write"."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.constants import CDC_TOMBSTONES, HealthGate, SinkMode, TableRole
from sluice.errors import CatalogError, SluiceError
from sluice.model.expectations import Expectation
from sluice.model.patterns import Patterns
from sluice.model.sinks import SinkSpec
from sluice.model.sources import SourceSpec
from sluice.model.sql import SqlTransform
from sluice.paths import Roots, join


@dataclass(frozen=True)
class TriggerSpec:
    """Per-micro-batch admission limits. Spark refuses both at once for the file source, so the catalog does too."""

    max_files_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None


@dataclass(frozen=True)
class AlertSpec:
    """Thresholds for the lag sensors, the lag monitor and the staleness check; WARN must not exceed CRITICAL.

    ``records`` are Kafka offsets or Delta rows behind; ``files`` and ``bytes`` what the source holds unread;
    ``seconds`` the age of the oldest unread data. A stream with a backlog and no commit for longer than
    ``stale_after_seconds`` is STOPPED; one whose backlog grew over ``stall_observations`` observations without a
    commit is STALLED. A resolve message waits for ``resolve_after_observations`` OK observations in a row (against
    a stream that flaps around a threshold). ``catch_up`` lets the lag monitor trigger the stream's DAG when it is
    CRITICAL or STOPPED and no run is active. ``email_to`` receives the monitor's alerts by email (through Airflow's
    SMTP connection).
    """

    stale_after_seconds: int | None = None
    warn_records: int | None = None
    critical_records: int | None = None
    warn_files: int | None = None
    critical_files: int | None = None
    warn_bytes: int | None = None
    critical_bytes: int | None = None
    warn_seconds: int | None = None
    critical_seconds: int | None = None
    stall_observations: int = 5
    resolve_after_observations: int = 1
    catch_up: bool = False
    email_to: tuple[str, ...] = ()


@dataclass(frozen=True)
class ArrivalSpec:
    """When the stream's DAG runs on the arrival of data (besides or instead of its cron): its source is looked at
    every ``poll_seconds`` on the triggerer (without a JVM); new data starts a run once nothing newer has come for
    ``settle_seconds`` (a burst of files is one run), or ``max_wait_seconds`` after the first of it at the latest
    (a steady trickle still runs), and never sooner than ``min_interval_seconds`` after the previous start."""

    poll_seconds: int = 5
    settle_seconds: int = 5
    max_wait_seconds: int = 60
    min_interval_seconds: int = 0


@dataclass(frozen=True)
class BackfillSpec:
    """What a backfill of the stream may do: the event-time column that ranges select on (none: file time
    only), the longest range one backfill may cover, and how far an event may be ahead of its file's time."""

    event_time_column: str | None = None
    max_range_days: int = 31
    clock_skew_seconds: int = 300


@dataclass(frozen=True)
class StreamSpec:
    """One catalog stream: everything the runner, the DAG factory and the checks need to know about it."""

    name: str
    description: str
    source: SourceSpec
    # A Python transform's name (:mod:`sluice.model.transforms`), or a transform in Spark SQL.
    transform: str | SqlTransform
    sink: SinkSpec
    dead_letter_path: str
    checkpoint: str
    schedule: str | None
    trigger: TriggerSpec
    alerts: AlertSpec
    owner: str = "data-eng"
    tags: tuple[str, ...] = ()
    # A new checkpoint in front of a table this stream already fed is refused (QUERY_ID_UNKNOWN_TO_SINK) unless
    # this is set, for a deliberate full reload into a table whose rows are replaced downstream.
    allow_new_query_id: bool = False
    backfill: BackfillSpec = field(default_factory=BackfillSpec)
    patterns: Patterns = field(default_factory=Patterns)
    # The columns the stream's table receives, before Sluice's metadata columns.
    output_columns: tuple[str, ...] = ()
    # Row rules checked after the transform, before the stateful steps.
    expectations: tuple[Expectation, ...] = ()
    # Streams of one group run in one Spark application from one DAG (``ingest_group_<group>``).
    group: str | None = None
    # Where the DAG checks the stream's checkpoint before each run: a task of its own, or the run's task.
    health_gate: HealthGate = HealthGate.TASK
    # Run on the arrival of data too (an Airflow AssetWatcher on the source); None: on the schedule only.
    arrival: ArrivalSpec | None = None

    @property
    def dag_id(self) -> str:
        """The DAG that runs the stream: its own, or its group's."""
        return f"ingest_group_{self.group}" if self.group else f"ingest_{self.name}"

    @property
    def transform_name(self) -> str:
        """How messages name the transform: a Python transform's name, or ``sql``."""
        return self.transform if isinstance(self.transform, str) else "sql"

    def tables(self, roots: Roots, *, tombstones: bool = False) -> list[StreamTable]:
        """Every Delta table the stream's batches commit to, resolved under the lake root: its sink (a Delta sink
        only), its dead-letter table, then its fan-out tables (a Delta sink's). The one answer the runner, the health
        checks, repair and backfill use. With ``tombstones``, a cdc sink's remembered deletes last: the cdc writer
        commits them after its table, with the same transaction ids, so the health checks and repair see them like a
        table."""
        tables = [StreamTable(TableRole.SINK, join(roots.lake, self.sink.table))] if self.sink.table else []
        tables.append(StreamTable(TableRole.DEAD_LETTER, self.dead_letter_table_path(roots)))
        tables += [StreamTable(TableRole.FAN_OUT, join(roots.lake, spec.path), index)
                   for index, spec in enumerate(self.patterns.fan_out) if spec.table is None]
        if tombstones and self.sink.table and self.sink.mode is SinkMode.CDC:
            tables.append(StreamTable(TableRole.TOMBSTONES, join(join(roots.lake, self.sink.table), CDC_TOMBSTONES)))
        return tables

    @property
    def table_paths(self) -> list[str]:
        """The tables the stream's batches write, under the lake root: its sink and its fan-out tables."""
        return [*([self.sink.table] if self.sink.table else []),
                *(spec.path for spec in self.patterns.fan_out if spec.table is None)]

    @property
    def checkpoint_sources(self) -> int:
        """How many sources Spark records in this stream's checkpoint. A stateful stream reads its source twice in
        one query: its good rows feed the stateful operators, its dead letters bypass them (the runner unions the
        two before the sink); a join does the same with the joined stream."""
        reads = 2 if self.patterns.stateful else 1
        join = self.patterns.join
        return reads * (self.source.checkpoint_sources + (join.source.checkpoint_sources if join else 0))

    @property
    def connections(self) -> list[str]:
        """The Airflow connections the stream's source and sink use, each once."""
        return list(dict.fromkeys(conn for conn in (self.source.connection, self.sink.connection) if conn))

    def locations(self, roots: Roots) -> list[str]:
        """Every place the stream reads or writes, resolved: its source's (and a joined stream's), its checkpoint, its
        tables and its lookup tables. A catalog may name an absolute object-store path under local roots."""
        sources = [self.source, *([self.patterns.join.source] if self.patterns.join else [])]
        return [*(found for source in sources if (found := source.location(roots)) is not None),
                self.checkpoint_path(roots), *(table.path for table in self.tables(roots)),
                *(join(roots.lake, lookup.table) for lookup in self.patterns.lookup)]

    def source_path(self, roots: Roots) -> str:
        """The resolved folder or table the source reads."""
        location = self.source.location(roots)
        if location is None:
            raise SluiceError(f"stream '{self.name}' reads a {self.source.type.value} source, which has no path")
        return location

    def sink_path(self, roots: Roots) -> str:
        """The resolved Delta table the sink writes."""
        if self.sink.table is None:
            raise SluiceError(f"stream '{self.name}' writes to {self.sink.format.value}, which is not a Delta table")
        return join(roots.lake, self.sink.table)

    def dead_letter_table_path(self, roots: Roots) -> str:
        return join(roots.lake, self.dead_letter_path)

    def checkpoint_path(self, roots: Roots) -> str:
        return join(roots.checkpoints, self.checkpoint)

    @property
    def written_paths(self) -> list[WrittenPath]:
        """The folders the stream writes: its checkpoint, its sink, dead-letter and fan-out tables."""
        paths = [WrittenPath(self.name, "checkpoint", "checkpoint", self.checkpoint, "checkpoints")]
        if self.sink.table:
            paths.append(WrittenPath(self.name, "sink table", "sink.path", self.sink.table, "lake"))
        elif self.sink.lake_folder:
            paths.append(WrittenPath(self.name, "sink table", "sink.table", self.sink.lake_folder, "lake"))
        paths.append(WrittenPath(self.name, "dead-letter table", "dead_letter.path", self.dead_letter_path, "lake"))
        for position, fan_out in enumerate(self.patterns.fan_out):
            folder = fan_out.path if fan_out.table is None else self.sink.folder_of(fan_out.table)
            if folder:
                paths.append(WrittenPath(self.name, "fan-out table", f"fan_out[{position}]."
                                         f"{'path' if fan_out.table is None else 'table'}", folder, "lake"))
        return paths


@dataclass(frozen=True)
class StreamTable:
    """A Delta table a stream writes: its role, its resolved path, and its position among the fan-out tables."""

    role: TableRole
    path: str
    index: int = 0

    @property
    def name(self) -> str:
        """``sink``, ``dead_letter`` or ``fan_out[<index>]``: how reports name it."""
        return f"{self.role.value}[{self.index}]" if self.role is TableRole.FAN_OUT else self.role.value


@dataclass(frozen=True)
class WrittenPath:
    """A folder a stream writes, as the catalog names it; ``root`` is the field of :class:`Roots` that a relative
    ``path`` lives under."""

    stream: str
    what: str
    field: str
    path: str
    root: str

    def error(self, message: str) -> CatalogError:
        return CatalogError(message, stream=self.stream, field=self.field)

