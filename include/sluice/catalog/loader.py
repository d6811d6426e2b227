"""Load the stream catalog: a declarative list of streams, validated on load.

Each stream names its source (with a declared schema), its transform, its sink, its checkpoint, its cron schedule,
its trigger limits and its alert thresholds. The source and sink sections are read by their kinds
(:mod:`sluice.kinds`). Every validation failure raises :class:`CatalogError`
with the stream and the dotted field in the message.

The default catalog is ``include/sluice/streams.yaml``; ``SLUICE_CATALOG`` points elsewhere.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path

from croniter import croniter

from sluice.catalog.keys import NAME_PATTERN
from sluice.catalog.patterns import check_patterns, parse_patterns
from sluice.catalog.rules import read_expectations, read_transform
from sluice.catalog.streams import Catalog, Claims
from sluice.catalog.yaml_loader import load_yaml
from sluice.constants import HealthGate, SchemaEvolution, SinkMode
from sluice.errors import CatalogError
from sluice.kinds import parse_sink, parse_source, sink_kind, source_kind
from sluice.limits import (
    ALERT_MAX,
    BACKFILL_MAX_CLOCK_SKEW_SECONDS,
    BACKFILL_MAX_RANGE_DAYS,
    CATALOG_MAX_BYTES,
    MAX_DURATION_SECONDS,
    MAX_OBSERVATIONS,
    REPAIR_COPY_MARKERS,
    RESERVED_ROOT_FOLDERS,
    TRIGGER_MAX_BYTES,
    TRIGGER_MAX_FILES,
)
from sluice.model.patterns import Patterns
from sluice.model.section import Section
from sluice.model.sinks import SinkSpec
from sluice.model.sources import SourceSpec
from sluice.model.stream import AlertSpec, ArrivalSpec, BackfillSpec, StreamSpec, TriggerSpec, WrittenPath
from sluice.paths import is_absolute, path_key

DEFAULT_CATALOG = Path(__file__).parent.parent / "streams.yaml"
_STREAM_NAME = re.compile(NAME_PATTERN)


def _parse_trigger(section: Section) -> TriggerSpec:
    trigger = TriggerSpec(
        max_files_per_trigger=section.positive_int("max_files_per_trigger", maximum=TRIGGER_MAX_FILES),
        max_bytes_per_trigger=section.positive_int("max_bytes_per_trigger", maximum=TRIGGER_MAX_BYTES),
    )
    section.done()
    if trigger.max_files_per_trigger and trigger.max_bytes_per_trigger:
        raise section.error("max_bytes_per_trigger", "set max_files_per_trigger or max_bytes_per_trigger, not both")
    return trigger


def _parse_arrival(section: Section) -> ArrivalSpec:
    defaults = ArrivalSpec()
    arrival = ArrivalSpec(
        poll_seconds=section.interval("poll") or defaults.poll_seconds,
        settle_seconds=section.interval("settle") or defaults.settle_seconds,
        max_wait_seconds=section.interval("max_wait") or defaults.max_wait_seconds,
        min_interval_seconds=section.interval("min_interval") or defaults.min_interval_seconds,
    )
    section.done()
    if arrival.settle_seconds > arrival.max_wait_seconds:
        raise section.error("settle", f"must not be longer than max_wait ({arrival.max_wait_seconds}s): the first "
                                      "new data would wait for max_wait whatever came after it")
    return arrival


_MEASURES = ("records", "files", "bytes", "seconds")


def _parse_alerts(section: Section) -> AlertSpec:
    thresholds = {f"{level}_{measure}": section.positive_int(f"{level}_{measure}", maximum=ALERT_MAX[measure])
                  for measure in _MEASURES for level in ("warn", "critical")}
    email_to = section.get("email_to", list, [])
    if not all(isinstance(address, str) and "@" in address for address in email_to):
        raise section.error("email_to", f"expected a list of email addresses, got {email_to!r}")
    alerts = AlertSpec(
        stale_after_seconds=section.positive_int("stale_after_seconds", maximum=MAX_DURATION_SECONDS),
        stall_observations=section.positive_int("stall_observations", maximum=MAX_OBSERVATIONS)
        or AlertSpec.stall_observations,
        resolve_after_observations=section.positive_int("resolve_after_observations", maximum=MAX_OBSERVATIONS)
        or AlertSpec.resolve_after_observations,
        catch_up=section.get("catch_up", bool, False),
        email_to=tuple(email_to),
        **thresholds,
    )
    section.done()
    if alerts.stall_observations < 2:
        raise section.error("stall_observations", "a trend needs at least 2 observations")
    for measure in _MEASURES:
        warn, critical = getattr(alerts, f"warn_{measure}"), getattr(alerts, f"critical_{measure}")
        if warn is not None and critical is not None and warn > critical:
            raise section.error(f"warn_{measure}", f"WARN threshold {warn} exceeds CRITICAL threshold {critical}")
    return alerts


def _parse_backfill(section: Section, source: SourceSpec) -> BackfillSpec:
    column = section.get("event_time_column", str)
    spec = BackfillSpec(
        event_time_column=column,
        max_range_days=section.positive_int("max_range_days", maximum=BACKFILL_MAX_RANGE_DAYS)
        or BackfillSpec.max_range_days,
        clock_skew_seconds=section.bounded_int("clock_skew_seconds", BackfillSpec.clock_skew_seconds, minimum=0,
                                               maximum=BACKFILL_MAX_CLOCK_SKEW_SECONDS),
    )
    section.done()
    if column is not None:
        types = {c.name: c.sql_type.lower() for c in source.schema.columns}
        if types.get(column) != "timestamp":
            raise section.error("event_time_column", f"must name a timestamp column of the source schema, got "
                                f"{column!r} ({types.get(column, 'not declared')})")
    return spec


def parse_stream(raw: object, *, index: int) -> StreamSpec:
    """Validate one catalog entry."""
    if not isinstance(raw, Mapping):
        raise CatalogError(f"expected a mapping, got {type(raw).__name__}", field=f"streams[{index}]")
    name = raw.get("name")
    if not isinstance(name, str) or not _STREAM_NAME.match(name):
        raise CatalogError(f"name must match {_STREAM_NAME.pattern} (it becomes a DAG id and a lock name), "
                           f"got {name!r}", field=f"streams[{index}].name")
    top = Section(raw, stream=name, path="")
    top.get("name", str)
    description = top.get("description", str, "")
    source = parse_source(top.section("source", required=True))
    kind = source_kind(source)
    sink = parse_sink(top.section("sink", required=True))
    patterns = parse_patterns(top)
    source = _settle_drift_policy(name, top.raw["source"], source, sink, patterns)
    transform, columns = read_transform(top, source)
    expectations = read_expectations(top, columns)
    data_columns = {column: kind for column, kind in columns.items() if column not in source.lineage}
    output_columns = check_patterns(name, patterns, data_columns, source, sink, required=source.never_null)
    sink_kind(sink).check_output(sink, output_columns, stream=name)
    _check_fan_out(name, sink, patterns)
    dead_letter = top.section("dead_letter")
    dead_letter_path = dead_letter.folder("path", f"{sink.table}_dead_letter" if sink.table else f"_dead_letter/{name}")
    dead_letter.done()
    checkpoint = top.folder("checkpoint", name)
    arrival_section = top.section("arrival")
    arrival = _parse_arrival(arrival_section) if "arrival" in top.raw else None
    schedule = top.get("schedule", str, required=kind.needs_schedule and arrival is None)
    if schedule is not None and not croniter.is_valid(schedule):
        raise top.error("schedule", f"{schedule!r} is not a valid cron expression (five fields, e.g. '*/5 * * * *')")
    trigger = _parse_trigger(top.section("trigger"))
    if not kind.trigger_limits and (trigger.max_files_per_trigger or trigger.max_bytes_per_trigger):
        raise top.error("trigger", f"a {source.type.value} source has no files or bytes limits; set its own limit "
                                   "in source.options (Kafka: maxOffsetsPerTrigger)")
    alerts = _parse_alerts(top.section("alerts"))
    allow_new_query_id = top.get("allow_new_query_id", bool, False)
    backfill = _parse_backfill(top.section("backfill"), source)
    group = top.get("group", str)
    if group is not None and not _STREAM_NAME.match(group):
        raise top.error("group", f"must match {_STREAM_NAME.pattern} (it becomes part of a DAG id), got {group!r}")
    if group is not None and arrival is not None:
        raise top.error("arrival", f"the streams of group {group!r} run together on one cron; run this stream on "
                                   "arrival outside the group")
    # A run started by arrival waits for each task's start: the gate inside the run task spares it one task process
    # and one scheduler turn (docs/guides/scheduling.md, what latency to expect).
    health_gate = top.enum("health_gate", HealthGate, HealthGate.INLINE if arrival is not None else HealthGate.TASK)
    owner = top.get("owner", str, "data-eng")
    tags = top.get("tags", list, [])
    if not all(isinstance(tag, str) and tag for tag in tags):
        raise top.error("tags", f"expected a list of strings, got {tags!r}")
    top.done()
    stream = StreamSpec(
        name=name,
        description=description,
        source=source,
        transform=transform,
        sink=sink,
        dead_letter_path=dead_letter_path,
        checkpoint=checkpoint,
        schedule=schedule,
        trigger=trigger,
        alerts=alerts,
        owner=owner,
        tags=tuple(tags),
        allow_new_query_id=allow_new_query_id,
        backfill=backfill,
        patterns=patterns,
        output_columns=tuple(output_columns),
        expectations=expectations,
        group=group,
        health_gate=health_gate,
        arrival=arrival,
    )
    for written in stream.written_paths:
        _check_own_name(written)
    return stream


def _check_fan_out(name: str, sink: SinkSpec, patterns: Patterns) -> None:
    """A sink's fan-out tables are of its own format: a Delta sink's are Delta tables by ``path``, an Iceberg sink's
    Iceberg tables of its catalog by ``table``; a Kafka sink takes none."""
    key = sink_kind(sink).fan_out_key
    if key is None and patterns.fan_out:
        raise CatalogError(f"a {sink.format.value} sink takes no fan_out: fan-out tables are cut from the batch a "
                           "Delta or Iceberg sink commits", stream=name, field="fan_out")
    for index, spec in enumerate(patterns.fan_out):
        given = "path" if spec.table is None else "table"
        if given != key:
            wanted = "a Delta table by path" if key == "path" else "an Iceberg table of the sink's catalog by table"
            raise CatalogError(f"a {sink.format.value} sink's fan-out tables are {wanted}, not by {given}",
                               stream=name, field=f"fan_out[{index}].{given}")


def _settle_drift_policy(name: str, raw: Mapping[str, object], source: SourceSpec, sink: SinkSpec,
                         patterns: Patterns) -> SourceSpec:
    """The source's drift policy, once the stream's patterns are known. An aggregate keeps no row to carry rescued
    data (a value that does not fit would be counted as NULL), and a stream-stream join keeps whole rows in its
    checkpoint's state (a new column would not match an existing checkpoint): such a stream takes ``none`` unless
    the catalog says otherwise, and an aggregate cannot rescue. ``add_new_columns`` widens one Delta table, in the
    commit of the rows that brought the new fields: a stream where that is not one append is refused."""
    policy = source.schema_evolution
    stateful = patterns.aggregate is not None or patterns.join is not None
    if stateful and "schema_evolution" not in raw and policy is SchemaEvolution.RESCUE:
        return dataclasses.replace(source, schema_evolution=SchemaEvolution.NONE)
    reason = None
    if patterns.aggregate is not None and policy is SchemaEvolution.RESCUE:
        reason = ("an aggregate keeps no row to carry _rescued_data, and would count a value that does not fit as "
                  "NULL; choose fail_on_new_columns or none")
    elif policy is SchemaEvolution.ADD_NEW_COLUMNS:
        if sink.table is None:
            reason = f"a {sink.format.value} sink has no table schema to add columns to"
        elif sink.mode is not SinkMode.APPEND:
            reason = (f"a new column is added in the commit that appends its batch; mode {sink.mode.value} does not "
                      "append")
        elif patterns.fan_out:
            reason = "a new column would have to reach the fan-out tables in the same commit"
        elif patterns.stateful:
            reason = "the stateful steps (dedupe, join, aggregate) fix their columns in the checkpoint's state"
        if reason is not None:
            reason = f"add_new_columns cannot be followed here: {reason}; choose rescue"
    if reason is not None:
        raise CatalogError(reason, stream=name, field="source.schema_evolution")
    return source


def _check_own_name(written: WrittenPath) -> None:
    """Refuse a written path that takes a name Sluice gives its own folders."""
    parts = path_key(written.path)[1]
    if not is_absolute(written.path) and parts[0] in RESERVED_ROOT_FOLDERS:
        raise written.error(f"path {written.path!r} starts with {parts[0]}/, a folder Sluice keeps for itself under "
                            f"the checkpoint root; reserved: {', '.join(RESERVED_ROOT_FOLDERS)}")
    if written.root == "checkpoints" and any(marker in parts[-1] for marker in REPAIR_COPY_MARKERS):
        raise written.error(f"path {written.path!r} looks like a copy the repair tools make beside a checkpoint "
                            f"(<checkpoint>{'<time>, <checkpoint>'.join(REPAIR_COPY_MARKERS)}<time>), which an "
                            "operator may delete; rename it")


def parse_catalog(raw: object, *, source_file: str | None = None) -> Catalog:
    """Validate a whole catalog document, including what streams must not share."""
    top = Section(raw, stream=None, path="")
    version = top.get("version", int, 1)
    if version != 1:
        raise top.error("version", f"unsupported catalog version {version}; this Sluice reads version 1")
    entries = top.get("streams", list, required=True)
    top.done()
    streams: dict[str, StreamSpec] = {}
    claims = Claims()
    for index, entry in enumerate(entries):
        stream = parse_stream(entry, index=index)
        if stream.name in streams:
            raise CatalogError("is defined twice", stream=stream.name, field="name")
        for written in stream.written_paths:
            # Relative paths are compared under their own root; absolute ones with each other, whatever they are
            # (Catalog.check_roots compares across roots once they are known).
            storage, parts = path_key(written.path)
            key = (storage or f"<{written.root} root>/", parts)
            claims.claim(key, written, shown=repr(written.path))
        streams[stream.name] = stream
    catalog = _follow_change_feeds(Catalog(streams=streams, source_file=source_file))
    for stream in catalog:
        upstreams = catalog.upstreams_of(stream)
        if any(upstream.name == stream.name for upstream in upstreams):
            raise CatalogError("a stream cannot read its own table", stream=stream.name, field="source.path")
        if stream.schedule is None and stream.arrival is None and not upstreams:
            read = stream.source.table or getattr(stream.source, "identifier", None)
            raise CatalogError(f"is required: no stream of the catalog writes {read!r}, so there is no "
                               "table update to schedule the stream on", stream=stream.name, field="schedule")
    _check_groups(catalog)
    _check_cleaning(catalog)
    return catalog


def _check_cleaning(catalog: Catalog) -> None:
    """``source.clean`` moves or deletes the files of one stream's landing folder: no other stream may read that
    folder (it would lose files it has not read), and no stream may read the archive (it would read them again)."""

    def overlap(one: str, other: str) -> bool:
        (storage, parts), (other_storage, other_parts) = path_key(one), path_key(other)
        shorter = min(len(parts), len(other_parts))
        return storage == other_storage and parts[:shorter] == other_parts[:shorter]

    readers = [(stream.name, stream.source.landing) for stream in catalog if stream.source.landing is not None]
    for stream in catalog:
        clean = getattr(stream.source, "clean", None)
        if clean is None or stream.source.landing is None:
            continue
        for name, landing in readers:
            if name != stream.name and overlap(stream.source.landing, landing):
                raise CatalogError(f"stream '{name}' also reads {landing!r}; cleaning would take its unread files "
                                   "away", stream=stream.name, field="source.clean")
            if clean.archive_to is not None and overlap(clean.archive_to, landing):
                raise CatalogError(f"the archive {clean.archive_to!r} overlaps the landing folder {landing!r} that "
                                   f"stream '{name}' reads: archived files would be read again",
                                   stream=stream.name, field="source.clean.archive_to")


def _follow_change_feeds(catalog: Catalog) -> Catalog:
    """Mark the sink of every stream whose table another stream reads with ``read: changes``: its table records its
    changes (``delta.enableChangeDataFeed``), set when the run creates it, or by its next run. A table no stream of
    the catalog writes must have it already; the reading run says so otherwise."""
    from sluice.kinds.delta import DeltaRead, DeltaSink

    followed: set[str] = set()
    for stream in catalog:
        if getattr(stream.source, "read", None) is not DeltaRead.CHANGES:
            continue
        upstream = catalog.upstream_of(stream)
        if upstream is None:
            continue
        if not isinstance(upstream.sink, DeltaSink) or os.path.normpath(upstream.sink.path) != os.path.normpath(
                stream.source.table or ""):
            raise CatalogError(f"read: changes follows a stream's own table; {stream.source.table!r} is a fan-out "
                               f"table of stream '{upstream.name}', whose changes are not recorded",
                               stream=stream.name, field="source.read")
        followed.add(upstream.name)
    if not followed:
        return catalog
    streams = dict(catalog.streams)
    for name in followed:
        sink = streams[name].sink
        assert isinstance(sink, DeltaSink)
        streams[name] = dataclasses.replace(streams[name], sink=dataclasses.replace(sink, change_feed=True))
    return dataclasses.replace(catalog, streams=streams)


def _check_groups(catalog: Catalog) -> None:
    """The streams of a group run in one Spark application from one DAG: on one cron, with one kind of health gate,
    none on another stream's table, and no DAG id taken twice."""
    first: dict[str, StreamSpec] = {}
    for stream in catalog:
        if stream.group is None:
            continue
        if catalog.upstreams_of(stream):
            raise CatalogError("a stream that runs on another stream's table updates cannot join a group: a group "
                               "runs on one cron", stream=stream.name, field="group")
        if stream.group in first and first[stream.group].schedule != stream.schedule:
            raise CatalogError(f"the streams of group {stream.group!r} run together, on one cron: "
                               f"{first[stream.group].name!r} has {first[stream.group].schedule!r}, this stream "
                               f"{stream.schedule!r}", stream=stream.name, field="schedule")
        if stream.group in first and first[stream.group].health_gate is not stream.health_gate:
            raise CatalogError(f"the streams of group {stream.group!r} share one DAG, so one kind of health gate: "
                               f"{first[stream.group].name!r} has {first[stream.group].health_gate}, this stream "
                               f"{stream.health_gate}", stream=stream.name, field="health_gate")
        first.setdefault(stream.group, stream)
    for group in first:
        if f"group_{group}" in catalog.streams:
            raise CatalogError(f"the DAG of group {group!r} would be ingest_group_{group}, the DAG id of this "
                               "stream's own DAG; rename one", stream=f"group_{group}", field="name")


def load_catalog(path: str | os.PathLike[str] | None = None) -> Catalog:
    """Load and validate a catalog file (default: ``SLUICE_CATALOG`` or the bundled ``streams.yaml``)."""
    catalog_path = Path(path or os.environ.get("SLUICE_CATALOG") or DEFAULT_CATALOG)
    chunks: list[bytes] = []
    size = 0
    try:
        with catalog_path.open("rb") as handle:
            # In pieces: a catalog path may name a pipe or a device that never ends.
            while chunk := handle.read(64 * 1024):
                size += len(chunk)
                if size > CATALOG_MAX_BYTES:
                    raise CatalogError(f"catalog {catalog_path} is larger than {CATALOG_MAX_BYTES:,} bytes")
                chunks.append(chunk)
    except OSError as exc:
        raise CatalogError(f"cannot read catalog {catalog_path}: {exc.strerror or exc}") from exc
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CatalogError(f"catalog {catalog_path} is not UTF-8: {exc}") from exc
    return parse_catalog(load_yaml(text, source=str(catalog_path)), source_file=str(catalog_path))


# The catalog a long-lived reader last loaded, by the identity of its file (see cached_catalog).
_last_loaded: tuple[tuple[str, int, int, int], Catalog] | None = None


def cached_catalog(path: str | os.PathLike[str] | None = None) -> Catalog:
    """:func:`load_catalog` for a server that needs the catalog on every request (the Streams page): parsed again
    only when the file's identity changes (its path, size, modification time in ns and inode; an editor's save or an
    atomic replace changes them), else the catalog parsed before."""
    global _last_loaded
    catalog_path = Path(path or os.environ.get("SLUICE_CATALOG") or DEFAULT_CATALOG)
    try:
        info = os.stat(catalog_path)
    except OSError:
        return load_catalog(catalog_path)  # which says why it cannot be read
    identity = (str(catalog_path), info.st_size, info.st_mtime_ns, info.st_ino)
    last = _last_loaded
    if last is not None and last[0] == identity:
        return last[1]
    catalog = load_catalog(catalog_path)
    _last_loaded = (identity, catalog)
    return catalog
