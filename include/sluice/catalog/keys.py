"""Every key a catalog may hold, declared once: its type, default, bound and meaning.

The parsers (:mod:`sluice.catalog.loader`, :mod:`sluice.catalog.patterns`, :mod:`sluice.catalog.rules` and the kinds)
read the catalog through :class:`~sluice.model.section.Section`; this table says the same in data (each kind's own
source or sink blocks come from the kind, :meth:`~sluice.kinds.base.SourceKind.catalog_blocks`), for the JSON Schema
editors check a catalog with (:mod:`sluice.catalog.schema`) and the docs site's catalog reference. Its defaults, bounds
and choices are the parsers' own objects (the limits, the enums, the specs' dataclass defaults), so a change there
changes the reference; a unit test checks that each block lists exactly the keys its parser accepts, and that each
bound and choice is the one the parser refuses past (tests/unit/test_catalog_schema.py).
"""

from __future__ import annotations

from sluice.constants import HealthGate
from sluice.kinds import SINK_KINDS, SOURCE_KINDS
from sluice.kinds.delta import CDC_BLOCK
from sluice.kinds.iceberg import ICEBERG_IDENTIFIER
from sluice.limits import (
    ALERT_MAX,
    BACKFILL_MAX_CLOCK_SKEW_SECONDS,
    BACKFILL_MAX_RANGE_DAYS,
    MAX_DURATION_SECONDS,
    MAX_OBSERVATIONS,
    TRIGGER_MAX_BYTES,
    TRIGGER_MAX_FILES,
)
from sluice.model.expectations import NullResult, Violation
from sluice.model.keys import DURATION_PATTERN, Block, Key, Type, choices, positive
from sluice.model.patterns import JoinType, WindowType
from sluice.model.stream import AlertSpec, BackfillSpec
from sluice.model.transforms import TRANSFORMS

__all__ = ["BLOCKS", "DURATION_PATTERN", "NAME_PATTERN", "SINK_BLOCKS", "SOURCE_BLOCKS", "Block", "Key", "Type",
           "block", "reference_markdown"]

# The name of a stream or a group: it becomes a DAG id and a lock name.
NAME_PATTERN = r"^[a-z][a-z0-9_]{0,62}$"

_MEASURES = ("records", "files", "bytes", "seconds")
_MEASURE_ABOUT = {"records": "Kafka offsets or Delta rows behind", "files": "files the source holds unread",
                  "bytes": "bytes the source holds unread", "seconds": "age in seconds of the oldest unread data"}

BLOCKS: tuple[Block, ...] = (
    Block("catalog", "", "The document: a version and a list of streams.", (
        Key("version", Type.INTEGER, "the catalog format; this Sluice reads 1", default=1, minimum=1, maximum=1),
        Key("streams", Type.BLOCKS, "the streams, one DAG each (or one per group)", required=True, block="stream"),
    )),
    Block("stream", "", "One stream: where it reads, what it does, where it writes, when it runs.", (
        Key("name", Type.STRING, "the stream's name; its DAG is `ingest_<name>`", required=True, pattern=NAME_PATTERN),
        Key("description", Type.STRING, "shown on the DAG and the Streams page", default=""),
        Key("owner", Type.STRING, "the DAG's owner", default="data-eng"),
        Key("tags", Type.STRINGS, "the DAG's tags"),
        Key("source", Type.BLOCK, "where the stream reads; its `type` selects the kind", required=True,
            block="source"),
        Key("transform", Type.TRANSFORM, "a Python transform's name, or `{sql: ...}`: Spark SQL over `source`",
            default="identity", choices=tuple(TRANSFORMS)),
        Key("expectations", Type.NAMED_BLOCKS, "row rules over the transformed row, by name", block="expectation"),
        Key("watermark", Type.BLOCK, "the event-time watermark of the stateful steps", block="watermark"),
        Key("dedupe", Type.BLOCK, "drop repeated keys (within the watermark)", block="dedupe"),
        Key("join", Type.BLOCK, "a stream-stream join with another Delta table", block="join"),
        Key("lookup", Type.BLOCKS, "stream-static joins with Delta tables", block="lookup"),
        Key("aggregate", Type.BLOCK, "a (windowed) aggregate", block="aggregate"),
        Key("fan_out", Type.BLOCKS, "more tables cut from each batch by a condition", block="fan_out"),
        Key("sink", Type.BLOCK, "where the good rows go; its `format` selects the kind", required=True, block="sink"),
        Key("dead_letter", Type.BLOCK, "the dead-letter table", block="dead_letter"),
        Key("checkpoint", Type.FOLDER, "the checkpoint folder under the checkpoint root", default_text="the name"),
        Key("schedule", Type.CRON, "the DAG's cron (five fields); a delta or iceberg source without one runs on its "
            "upstream table's updates", default_text="required, except for a delta or iceberg source or a stream "
            "with `arrival`"),
        Key("arrival", Type.BLOCK, "also run when data arrives: the source is watched on Airflow's triggerer",
            block="arrival"),
        Key("trigger", Type.BLOCK, "per-micro-batch admission limits (files sources)", block="trigger"),
        Key("alerts", Type.BLOCK, "lag thresholds and alerting", block="alerts"),
        Key("allow_new_query_id", Type.BOOLEAN, "accept a new checkpoint in front of a table this stream already fed "
            "(QUERY_ID_UNKNOWN_TO_SINK becomes a WARN)", default=False),
        Key("backfill", Type.BLOCK, "what a backfill of the stream may do", block="backfill"),
        Key("group", Type.STRING, "run with the other streams of the group in one Spark application "
            "(DAG `ingest_group_<group>`)", pattern=NAME_PATTERN),
        Key("health_gate", Type.CHOICE, "where the checkpoint health gate runs: a task of its own, or inside the run "
            "task", default_text="`task`; `inline` for a stream with `arrival`", choices=choices(HealthGate)),
    )),
    *(block for kind in SOURCE_KINDS.values() for block in kind.catalog_blocks()),
    *(block for kind in SINK_KINDS.values() for block in kind.catalog_blocks()),
    CDC_BLOCK,
    Block("expectation", "expectations.<name>", "One row rule.", (
        Key("check", Type.SQL, "a boolean Spark SQL expression over the transformed row", required=True),
        Key("on_violation", Type.CHOICE, "what a broken rule does to its row", default=Violation.WARN,
            choices=choices(Violation)),
        Key("on_null", Type.CHOICE, "how a check that gives NULL counts", default=NullResult.VIOLATES,
            choices=choices(NullResult)),
    )),
    Block("watermark", "watermark", "How late an event may arrive and still count.", (
        Key("column", Type.STRING, "the event-time column", required=True),
        Key("delay", Type.DURATION, "how late", required=True, pattern=DURATION_PATTERN),
    )),
    Block("dedupe", "dedupe", "Drop rows whose keys were seen before.", (
        Key("keys", Type.NAMES, "the key columns", required=True),
    )),
    Block("join", "join", "A stream-stream join with another Delta table's stream.", (
        Key("source", Type.BLOCK, "the joined stream: a delta source", required=True, block="source (delta)"),
        Key("watermark", Type.BLOCK, "the joined side's watermark", required=True, block="watermark"),
        Key("on", Type.NAMES, "the join columns", required=True),
        Key("type", Type.CHOICE, "the join type", default=JoinType.INNER, choices=choices(JoinType)),
        Key("within", Type.BLOCK, "the time bound between the sides", required=True, block="within"),
    )),
    Block("within", "join.within", "The time bound of a join: right time within max_delay of left time.", (
        Key("left", Type.STRING, "the stream's time column", required=True),
        Key("right", Type.STRING, "the joined side's time column", required=True),
        Key("max_delay", Type.DURATION, "the largest distance", required=True, pattern=DURATION_PATTERN),
    )),
    Block("lookup", "lookup[<i>]", "A stream-static join: columns of a Delta table added by key.", (
        Key("table", Type.FOLDER, "the table under the lake root", required=True),
        Key("on", Type.NAMES, "the join columns", required=True),
        Key("columns", Type.NAMES, "the columns it adds", required=True),
    )),
    Block("aggregate", "aggregate", "Group the rows (by window) and compute measures.", (
        Key("window", Type.BLOCK, "the event-time window", block="window"),
        Key("group_by", Type.NAMES, "the grouping columns"),
        Key("measures", Type.NAMED_SQL, "name to `count(*)`, `sum(c)`, `min(c)`, `max(c)`, `avg(c)` or "
            "`approx_count_distinct(c)`", required=True),
    )),
    Block("window", "aggregate.window", "An event-time window.", (
        Key("type", Type.CHOICE, "the window kind", required=True, choices=choices(WindowType)),
        Key("column", Type.STRING, "the event-time column", required=True),
        Key("duration", Type.DURATION, "its length (tumbling, sliding)", pattern=DURATION_PATTERN),
        Key("slide", Type.DURATION, "how far it moves (sliding only)", pattern=DURATION_PATTERN),
        Key("gap", Type.DURATION, "the inactivity that closes it (session only)", pattern=DURATION_PATTERN),
    )),
    Block("fan_out", "fan_out[<i>]", "Another table of the sink's format, cut from each batch by a condition, "
          "written once per batch with the sink's.", (
        Key("path", Type.FOLDER, "a Delta sink's: the table under the lake root"),
        Key("table", Type.STRING, "an Iceberg sink's: the table's identifier `namespace.table`, in the sink's catalog",
            pattern=ICEBERG_IDENTIFIER.pattern),
        Key("where", Type.SQL, "the rows it takes: a Spark SQL condition", required=True),
        Key("columns", Type.NAMES, "the columns it keeps (default: all)"),
        Key("partition_by", Type.STRINGS, "its partition columns (an Iceberg table's: its partition spec, columns "
            "and transforms as `sink.partition_by`, `[]` unpartitioning it)"),
    )),
    Block("dead_letter", "dead_letter", "Where rows that cannot be read, or that a rule quarantines, go.", (
        Key("path", Type.FOLDER, "the table under the lake root",
            default_text="`<sink.path>_dead_letter` (a Kafka sink: `_dead_letter/<name>`)"),
    )),
    Block("arrival", "arrival", "Run when data arrives (an Airflow AssetWatcher on the source, without a JVM): "
          "new data starts a run once nothing newer came for `settle`, at the latest `max_wait` after it came.", (
              Key("poll", Type.DURATION, "how often the source is looked at", default="5s", pattern=DURATION_PATTERN),
              Key("settle", Type.DURATION, "how long no newer data must come before a run starts (a burst of files is "
                  "one run)", default="5s", pattern=DURATION_PATTERN),
              Key("max_wait", Type.DURATION, "the longest new data waits for its run while more keeps coming",
                  default="1 minute", pattern=DURATION_PATTERN),
              Key("min_interval", Type.DURATION, "the least time between two arrival-started runs",
                  default_text="none", pattern=DURATION_PATTERN),
          )),
    Block("trigger", "trigger", "Per-micro-batch admission limits of a files or delta source (Kafka: "
          "source.options.maxOffsetsPerTrigger); at most one of them.", (
              positive("max_files_per_trigger", "files per micro-batch", TRIGGER_MAX_FILES),
              positive("max_bytes_per_trigger", "bytes per micro-batch", TRIGGER_MAX_BYTES),
          ), exclusive=("max_files_per_trigger", "max_bytes_per_trigger")),
    Block("alerts", "alerts", "Thresholds of the lag sensors, the lag monitor and the staleness check; WARN must not "
          "exceed CRITICAL.", (
              positive("stale_after_seconds", "a stream with a backlog and no commit for longer is STOPPED",
                        MAX_DURATION_SECONDS),
              *(positive(f"{level}_{measure}", f"{level.upper()} when the backlog reaches this many "
                          f"{_MEASURE_ABOUT[measure]}", ALERT_MAX[measure])
                for measure in _MEASURES for level in ("warn", "critical")),
              Key("stall_observations", Type.INTEGER, "a backlog that grew over this many observations without a "
                  "commit is STALLED", default=AlertSpec.stall_observations, minimum=2, maximum=MAX_OBSERVATIONS),
              positive("resolve_after_observations", "OK observations in a row before a resolve message",
                        MAX_OBSERVATIONS, AlertSpec.resolve_after_observations),
              Key("catch_up", Type.BOOLEAN, "the lag monitor triggers the DAG when the stream is CRITICAL or STOPPED "
                  "and no run is active", default=False),
              Key("email_to", Type.EMAILS, "who receives the monitor's alerts by email (Airflow's SMTP connection)"),
          )),
    Block("backfill", "backfill", "What a backfill of the stream may do.", (
        Key("event_time_column", Type.STRING, "the timestamp column of the source schema that ranges select on "
            "(none: file time only)"),
        positive("max_range_days", "the longest range one backfill may cover", BACKFILL_MAX_RANGE_DAYS,
                  BackfillSpec.max_range_days),
        Key("clock_skew_seconds", Type.INTEGER, "how far an event may be ahead of its file's time",
            default=BackfillSpec.clock_skew_seconds, minimum=0, maximum=BACKFILL_MAX_CLOCK_SKEW_SECONDS),
    )),
)

SOURCE_BLOCKS = tuple(block for block in BLOCKS if block.path == "source")
SINK_BLOCKS = tuple(block for block in BLOCKS if block.path == "sink")


def block(name: str) -> Block:
    return next(found for found in BLOCKS if found.name == name)


def reference_markdown() -> str:
    """The catalog reference of the docs site: one table per block."""
    lines: list[str] = []
    for found in BLOCKS:
        where = f" (`{found.path}`)" if found.path else ""
        lines += [f"### {found.name}{where}", "", found.about, ""]
        if found.exclusive:
            lines += [f"At most one of {', '.join(f'`{name}`' for name in found.exclusive)}.", ""]
        lines += ["| key | type | default | bound or choices | meaning |", "| --- | --- | --- | --- | --- |"]
        for key in found.keys:
            kind = key.type.value + (f" ({key.block})" if key.block and key.block not in ("source", "sink") else "")
            default = "required" if key.required else key.shown_default
            about = key.about + (f"; allowed: {', '.join(f'`{o}`' for o in key.choices)}"
                                 if key.type is Type.OPTIONS else "")
            lines.append(f"| `{key.name}` | {kind} | {default} | {key.bound.replace('|', '&#124;')} | {about} |")
        lines.append("")
    return "\n".join(lines)
