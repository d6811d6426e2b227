"""The run summary: what one availableNow run of a stream did, as the runner prints it and the operator reads it.

The runner prints one line per application, ``SLUICE_RUN_SUMMARY {json}``, on stdout and writes the same JSON to
a file. The operator takes it from either and pushes it to XCom.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from sluice.constants import SUMMARY_MARKER, RunStatus
from sluice.errors import StreamRunError


@dataclass
class StreamRunSummary:
    """The numbers of one stream's run. ``input_rows`` counts the rows read from the stream's sources (both sides
    of a join). For a row-wise stream, rows in always equal rows out plus dropped rows plus dead-letter rows."""

    stream: str
    query_id: str | None = None
    run_id: str | None = None
    status: str = RunStatus.PENDING
    batches: int = 0
    input_rows: int = 0
    output_rows: int = 0
    dead_letter_rows: int = 0
    duration_seconds: float = 0.0
    # When the stream's query started and ended, ISO 8601 in UTC.
    started_at: str | None = None
    ended_at: str | None = None
    delta_version_before: int | None = None
    delta_version_after: int | None = None
    dead_letter_version_before: int | None = None
    dead_letter_version_after: int | None = None
    # An Iceberg sink's current snapshot id before and after the run (its Delta versions above are None).
    snapshot_id_before: int | None = None
    snapshot_id_after: int | None = None
    engine: str | None = None
    error: str | None = None
    # False when a rerun cannot succeed without a change (bad config, a schema conflict): Airflow must not retry.
    retryable: bool = True
    batch_ids: list[int] = field(default_factory=list)
    # Stateful streams: rows dropped for arriving behind the watermark, duplicates dropped, rows held in state.
    late_rows: int = 0
    duplicate_rows: int = 0
    state_rows: int = 0
    # Rows an expectation dropped (counted, written nowhere): rows in = written + dropped + dead-lettered.
    dropped_rows: int = 0
    # A cdc or merge sink's changes to its table, summed over the run's batches, where the engine's commits say them:
    # {"inserted", "updated", "deleted", "versions_closed" (type 2)}.
    table_changes: dict[str, int] | None = None
    # Good rows that kept fields the schema does not read in ``_rescued_data`` (the ``rescue`` policy; else None).
    rescued_rows: int | None = None
    # Columns ``add_new_columns`` added to the stream's table in this run, with their Spark SQL types.
    added_columns: dict[str, str] = field(default_factory=dict)
    # Per expectation: {"rule", "on_violation", "checked", "violated"}, in catalog order.
    expectations: list[dict[str, Any]] = field(default_factory=list)
    # "driver" when a small run's batches were collected to the driver and appended there (rs engine).
    write_path: str | None = None
    # ``source.clean`` after the run: files archived, deleted and left (:class:`sluice.storage.clean.CleanReport`),
    # or {"error": ...} when cleaning failed (the run's commits stand; the next run cleans again).
    cleaned: dict[str, Any] | None = None
    # ``source.notifications``: the notified files the run read ("files"), the queue's messages it drained
    # ("messages"), and why it listed its landing folder instead ("listed"; None when it did not).
    notified: dict[str, Any] | None = None


@dataclass
class RunSummary:
    """Every stream of one Spark application, and where the application's time went (``phases_seconds``: the
    session's start, taking the locks, preparing the queries, running them, reconciling, the run log)."""

    app_id: str | None
    streams: list[StreamRunSummary]
    phases_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(stream.status == RunStatus.SUCCEEDED for stream in self.streams)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=str)

    def to_line(self) -> str:
        return SUMMARY_MARKER + self.to_json()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSummary:
        if not isinstance(data, dict) or not isinstance(data.get("streams"), list):
            raise StreamRunError(f"run summary has no 'streams' list: {data!r}")
        known = StreamRunSummary.__dataclass_fields__
        streams = [StreamRunSummary(**{k: v for k, v in item.items() if k in known}) for item in data["streams"]]
        phases = data.get("phases_seconds")
        return cls(app_id=data.get("app_id"), streams=streams, phases_seconds=dict(phases) if isinstance(phases, dict)
                   else {})

    @classmethod
    def from_json(cls, text: str) -> RunSummary:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StreamRunError(f"run summary is not valid JSON: {exc}") from exc
        return cls.from_dict(data)


class PhaseClock:
    """Seconds spent per phase of a run, in the order the phases came: ``clock.lap("prepare")`` charges the time
    since the previous lap to ``prepare``."""

    def __init__(self, started: float | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.monotonic() if started is None else started

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.seconds[phase] = round(self.seconds.get(phase, 0.0) + now - self._last, 3)
        self._last = now


def find_marked_json(lines: Iterable[str], marker: str) -> Any:
    """The JSON value of the last line that is exactly ``marker`` followed by one JSON value, or None.

    The runners print that line alone, from its first column. A marker anywhere else in a line is ignored, so that
    a record quoted in an error message, or a log line that repeats the marker, cannot pass for a summary.
    """
    found: Any = None
    decoder = json.JSONDecoder()
    for line in lines:
        if not line.startswith(marker):
            continue
        text = line[len(marker):].rstrip("\r\n")
        try:
            value, end = decoder.raw_decode(text)
        except json.JSONDecodeError as exc:
            raise StreamRunError(f"summary after {marker.strip()} is not valid JSON: {exc}") from exc
        if text[end:].strip():
            raise StreamRunError(f"summary after {marker.strip()} has text after its JSON value: "
                                 f"{text[end:end + 40]!r}")
        found = value
    return found


def find_summary_line(lines: Iterable[str]) -> RunSummary | None:
    """The last run summary among log lines, or None."""
    data = find_marked_json(lines, SUMMARY_MARKER)
    return None if data is None else RunSummary.from_dict(data)
