"""Redrive: dead letters sent again through their stream's current definition, exactly once.

After a fix (a field declared, a rule relaxed, a transform corrected), the dead letters a stream rejected before the
fix can be read again from their raw record, through the stream's *current* schema, drift policy, transform, rules
and patterns. Rows that now pass land in the stream's table, with their original lineage (``_source_file`` and the
original ingestion time) and the redrive's run id in the commit info; rows that still fail stay dead letters, with
the reason the current definition gives. A dead letter that landed (or that a ``drop`` rule now drops) is marked
with the redrive's run id in the dead-letter table's ``redriven_by`` column, and a redrive selects only unmarked rows.

Exactly once, by the write path's own protocol: the redrive's selection is frozen on its first attempt (the
dead-letter table's version and the filter), and each table gets at most one commit per redrive, carrying the Delta
transaction ``sluice-redrive/<stream>/<run key>`` version 0. A redrive killed at any point and run again with the same
run id skips what is committed and commits the rest; a new redrive of the same stream is refused while an older one
is unfinished, so no row can be selected by two redrives.

This module is plain Python and delta-rs: a request is validated and a dry run's counts come without a JVM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sluice.arguments import option_args
from sluice.catalog import Catalog
from sluice.constants import REDRIVEN_BY_COLUMN, FileFormat
from sluice.errors import SluiceError
from sluice.kinds import sink_kind
from sluice.model.predicates import DATAFUSION
from sluice.model.stream import StreamSpec
from sluice.operations.backfill import _RUN_KEY, MAX_REASON_LENGTH, BackfillError, _parse_time, parse_zone
from sluice.paths import Roots, join
from sluice.storage.delta import open_table, query

# The manual redrive DAG (sluice_airflow.redrive_dag): the Streams page links to it, the trigger check guards it.
DAG_ID = "redrive"
PARAMS = ("stream", "reason", "since", "until", "timezone", "dry_run")
REDRIVE_ROOT = "_redrive"
# The dead-letter table's columns a redrive reads: the record, why it was rejected, and its lineage.
DEAD_LETTER_COLUMNS = ("raw_record", "reason", "source_file", "stream", "ingested_at")


class RedriveError(SluiceError):
    """A redrive request was refused; nothing was read or written. The message starts with the field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class RedriveRequest:
    """A validated redrive: dead letters of ``stream`` whose reason starts with ``reason`` (all when None), ingested
    in ``[since, until)`` (open on a side that is None), not redriven yet."""

    stream: str
    reason: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    dry_run: bool = True
    run_id: str = "manual"

    @property
    def run_key(self) -> str:
        """The run id as a folder name and a transaction id part (as a backfill's)."""
        return _RUN_KEY.sub("_", self.run_id).strip("._")[:150] or "run"

    @property
    def app_id(self) -> str:
        """The Delta transaction app id of this redrive's commits (version 0 in each table)."""
        return f"sluice-redrive/{self.stream}/{self.run_key}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["since"] = self.since.isoformat() if self.since else None
        data["until"] = self.until.isoformat() if self.until else None
        return data

    def to_args(self) -> list[str]:
        """The redrive runner's command-line arguments for this request."""
        return option_args({"stream": self.stream, "reason": self.reason, "since": self.since.isoformat()
                            if self.since else None, "until": self.until.isoformat() if self.until else None,
                            "dry-run": self.dry_run, "run-id": self.run_id})


def redrive_refusal(stream: StreamSpec) -> str | None:
    """Why ``stream``'s dead letters cannot be redriven, or None. A redrive re-reads a dead letter's raw record as
    the JSON text it arrived as, and writes the stream's own Delta table by appending."""
    source = stream.source
    if getattr(source, "format", None) is not FileFormat.JSON:
        return (f"its source is {source.type.value} ({getattr(source, 'format', None) or 'typed rows'}); a redrive "
                "reads a dead letter's raw record as the JSON text it arrived as, so only JSON sources (files or "
                "Kafka) are redriven")
    if sink_kind(stream.sink).backfill_refusal is not None or stream.sink.table is None:
        return f"it writes to {stream.sink.format.value}; a redrive appends to the stream's Delta table"
    if stream.patterns.stateful or stream.patterns.fan_out or stream.sink.mode.value != "append":
        return ("it keeps state in its checkpoint, upserts its table or fans out; a redrive appends rows to the "
                "stream's own table only, and could neither see that state nor keep the tables in step")
    return None


def parse_request(params: Mapping[str, Any], catalog: Catalog, *, run_id: str) -> RedriveRequest:
    """Validate redrive params (from the trigger form or the command line); every refusal names its field."""

    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise RedriveError(unknown[0], f"unknown param(s) {', '.join(unknown)}; a redrive takes {', '.join(PARAMS)}")
    name = params.get("stream")
    if not isinstance(name, str) or name not in catalog.streams:
        known = ", ".join(stream.name for stream in catalog)
        raise RedriveError("stream", f"unknown stream {name!r}; known streams: {known}")
    refusal = redrive_refusal(catalog.get(name))
    if refusal is not None:
        raise RedriveError("stream", f"stream '{name}' cannot be redriven: {refusal}")
    moments: dict[str, datetime | None] = {}
    try:  # a backfill's rules for times, refused in the redrive's words
        zone = parse_zone(params.get("timezone"))
        for key in ("since", "until"):
            value = params.get(key)
            moments[key] = None if value in (None, "") else _parse_time(key, value, zone)
    except BackfillError as exc:
        raise RedriveError(exc.field, str(exc).split(": ", 1)[1]) from None
    since, until = moments["since"], moments["until"]
    if since is not None and until is not None and until <= since:
        raise RedriveError("until", f"{until.isoformat()} is not after since {since.isoformat()}")
    reason = params.get("reason")
    if reason == "":
        reason = None
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON_LENGTH
                               or not reason.isprintable()):
        raise RedriveError("reason", f"expected one line of text of at most {MAX_REASON_LENGTH} characters")
    dry_run = params.get("dry_run", True)
    if isinstance(dry_run, str) and dry_run.strip().lower() in {"true", "false"}:
        dry_run = dry_run.strip().lower() == "true"
    if not isinstance(dry_run, bool):
        raise RedriveError("dry_run", f"expected true or false, got {dry_run!r}")
    return RedriveRequest(stream=name, reason=reason, since=since, until=until, dry_run=dry_run, run_id=run_id)


def selection_sql(request: RedriveRequest, *, marked: bool, ingested_until: str | None = None) -> str:
    """The WHERE clause (DataFusion) of the dead letters a request selects; ``marked`` says whether the table has
    the ``redriven_by`` column yet. ``ingested_until`` bounds a frozen selection to what its version held."""
    string = DATAFUSION.string
    parts = [f"{DATAFUSION.identifier(REDRIVEN_BY_COLUMN)} IS NULL"] if marked else []
    if request.reason is not None:
        parts.append(f"starts_with(reason, {string(request.reason)})")
    if request.since is not None:
        parts.append(f"ingested_at >= {string(_utc(request.since))}")
    if request.until is not None:
        parts.append(f"ingested_at < {string(_utc(request.until))}")
    if ingested_until is not None:
        parts.append(f"ingested_at <= {string(ingested_until)}")
    return " AND ".join(parts) or "TRUE"


def _utc(moment: datetime) -> str:
    from datetime import timezone

    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def has_mark(path: str, version: int | None = None) -> bool:
    """Whether the dead-letter table at ``path`` has the ``redriven_by`` column (at ``version``)."""
    table = open_table(path, version=version) if version is not None else open_table(path)
    return REDRIVEN_BY_COLUMN in [item.name for item in table.schema().fields]


@dataclass
class RedrivePlan:
    """What a redrive selects: the dead-letter table's version and the rows per reason there. Frozen into the
    redrive's folder on its first attempt, so that a rerun reads the same rows."""

    request: dict[str, Any]
    dead_letter_version: int | None
    rows: int = 0
    reasons: list[dict[str, Any]] = field(default_factory=list)
    # The latest ingestion time of a selected row: rows the live stream adds later are never part of the selection.
    ingested_until: str | None = None
    marked: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RedrivePlan:
        return cls(**{key: value for key, value in data.items() if key in cls.__dataclass_fields__})


def plan_redrive(request: RedriveRequest, stream: StreamSpec, roots: Roots) -> RedrivePlan:
    """The dead letters the request selects now, counted per reason, without Spark."""
    from deltalake.exceptions import TableNotFoundError

    path = stream.dead_letter_table_path(roots)
    try:
        version = open_table(path).version()
    except TableNotFoundError:
        return RedrivePlan(request=request.to_dict(), dead_letter_version=None)
    marked = has_mark(path, version)
    where = selection_sql(request, marked=marked)
    counts = query(path, f"SELECT reason, count(*) AS rows, max(ingested_at) AS latest FROM t WHERE {where} "
                         "GROUP BY reason ORDER BY rows DESC, reason", version=version)
    listed = counts.to_pylist() if counts is not None else []
    latest = max((row["latest"] for row in listed if row["latest"] is not None), default=None)
    return RedrivePlan(request=request.to_dict(), dead_letter_version=version,
                       rows=sum(int(row["rows"]) for row in listed),
                       reasons=[{"reason": row["reason"], "rows": int(row["rows"])} for row in listed],
                       ingested_until=_utc(latest) if latest is not None else None, marked=marked)


def redrivable(stream: StreamSpec, roots: Roots, *, limit: int = 20) -> list[dict[str, Any]]:
    """The stream's dead letters not redriven yet, per reason (most first): what the Streams page offers to
    redrive. Empty for a stream whose dead letters cannot be redriven."""
    from deltalake.exceptions import TableNotFoundError

    if redrive_refusal(stream) is not None:
        return []
    path = stream.dead_letter_table_path(roots)
    try:
        where = f"{DATAFUSION.identifier(REDRIVEN_BY_COLUMN)} IS NULL" if has_mark(path) else "TRUE"
    except TableNotFoundError:
        return []
    counts = query(path, f"SELECT reason, count(*) AS rows FROM t WHERE {where} GROUP BY reason "
                         f"ORDER BY rows DESC, reason LIMIT {int(limit)}")
    return [] if counts is None else [{"reason": row["reason"], "rows": int(row["rows"])} for row in counts.to_pylist()]


def redrive_folder(stream: StreamSpec, roots: Roots, request: RedriveRequest) -> str:
    """``<checkpoint root>/_redrive/<stream>/<run key>``: the redrive's frozen plan and its end mark."""
    return join(roots.checkpoints, f"{REDRIVE_ROOT}/{stream.name}/{request.run_key}")
