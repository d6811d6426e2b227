"""What the Streams page and its JSON routes show, read without Spark: every stream's status, and one stream's history.

The status is the lag monitor's latest observation from the lag history when it is recent (the monitor records one
every few minutes) and no run of the stream (of kind ``run``, as the list shows) has ended since, else a live check,
as ``make status`` makes it. The rows of the runs come from the run log (:mod:`sluice.storage.runlog`), the
dead-letter reasons and the Delta versions from the stream's tables, the checkpoint report from the health checks.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Iterable
from typing import Any

from sluice.catalog import Catalog
from sluice.lag.observe import LagReport, check, error_report
from sluice.lag.store import LagStore, default_path
from sluice.model.stream import StreamSpec
from sluice.operations.health import check_stream
from sluice.paths import Roots
from sluice.storage import runlog
from sluice.storage.delta import query, table_history
from sluice.times import iso_utc

# A recorded observation younger than this is shown as it is; an older one is measured again.
FRESH_SECONDS = 600
TREND_POINTS = 24
_SAMPLES = 5
_REASONS = 20


def _store(roots: Roots) -> LagStore | None:
    path = default_path(roots)
    return LagStore(path) if os.path.exists(path) else None


def _report(stream: StreamSpec, roots: Roots, history: list[LagReport], now: float,
            run_ended: dt.datetime | None) -> LagReport:
    """The latest observation while it is fresh and no run has ended after it (``run_ended``: a run changes the
    backlog and the last commit), else a live check."""
    if history:
        observed_at = history[-1].observation.observed_at
        if now - observed_at <= FRESH_SECONDS and (run_ended is None or run_ended.timestamp() <= observed_at):
            return history[-1]
    try:
        return check(stream, roots, history=[seen.observation for seen in history], now=now)
    except Exception as exc:  # one broken stream must not hide the others
        return error_report(stream, exc, now=now)


def _health(stream: StreamSpec, roots: Roots, now: float) -> dict[str, Any]:
    try:
        return check_stream(stream, roots, now=now).to_dict()
    except Exception as exc:
        return {"status": "ERROR", "findings": [{"message": f"{type(exc).__name__}: {exc}"}], "facts": {}}


def _run_summary(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    keep = ("run_id", "kind", "status", "started_at", "ended_at", "input_rows", "output_rows", "dead_letter_rows",
            "dropped_rows", "error")
    return {key: _plain(row[key]) for key in keep}


def _plain(value: Any) -> Any:
    return iso_utc(value) if hasattr(value, "tzinfo") else value


def dag_links(stream: StreamSpec) -> dict[str, str]:
    """The Airflow UI's pages that start the stream's DAG and open the backfill form with the stream chosen."""
    return {"dag": f"/dags/{stream.dag_id}", "trigger": f"/dags/{stream.dag_id}/trigger/single",
            "backfill": f"/dags/backfill/trigger/single?stream={stream.name}"}


def overview(catalog: Catalog, roots: Roots, streams: Iterable[str] | None = None, *,
             now: float | None = None) -> list[dict[str, Any]]:
    """One entry per stream (all, or those named): its lag status and reasons, the backlog, the last commit, the
    checkpoint health, the last run's rows and the backlog's trend."""
    now = now or time.time()
    wanted = set(streams) if streams is not None else None
    store = _store(roots)
    last_runs = runlog.latest_runs(roots.lake)
    entries = []
    for stream in catalog:
        if wanted is not None and stream.name not in wanted:
            continue
        history = store.history(stream.name, limit=TREND_POINTS) if store else []
        report = _report(stream, roots, history, now, (last_runs.get(stream.name) or {}).get("ended_at"))
        observation = report.observation
        trend = [*history, report] if not history or history[-1] is not report else history
        entries.append({
            "stream": stream.name, "description": stream.description, "source": stream.source.origin,
            "status": report.status.value, "reasons": list(report.reasons),
            "observed_at": iso_utc(observation.observed_at),
            "files": observation.backlog.files, "bytes": observation.backlog.bytes,
            "records": observation.backlog.records, "versions": observation.backlog.versions,
            "lag_seconds": observation.lag_seconds, "last_batch_id": observation.last_batch_id,
            "last_commit_at": None if observation.last_commit_at is None else iso_utc(observation.last_commit_at),
            "health": _health(stream, roots, now)["status"],
            "last_run": _run_summary(last_runs.get(stream.name)),
            "trend": [seen.observation.backlog.units for seen in trend[-TREND_POINTS:]],
            "links": dag_links(stream),
        })
    return entries


def _dead_letters(stream: StreamSpec, roots: Roots) -> dict[str, Any]:
    path = stream.dead_letter_table_path(roots)
    counts = query(path, f"SELECT reason, count(*) AS rows FROM t GROUP BY reason ORDER BY rows DESC, reason "
                         f"LIMIT {_REASONS}")
    samples = query(path, f"SELECT reason, raw_record, source_file, ingested_at FROM t ORDER BY ingested_at DESC "
                          f"LIMIT {_SAMPLES}")
    return {"reasons": [] if counts is None else counts.to_pylist(),
            "samples": [] if samples is None else [{key: _plain(value) for key, value in row.items()}
                                                   for row in samples.to_pylist()]}


def detail(stream: StreamSpec, roots: Roots, *, days: float = 30, now: float | None = None) -> dict[str, Any]:
    """One stream's history over the last ``days``: backlog per observation, rows and duration per run, the
    dead-letter reasons with counts and samples, the checkpoint report and the Delta versions."""
    now = now or time.time()
    store = _store(roots)
    since = now - days * 86400
    history = [seen for seen in (store.history(stream.name, limit=int(days * 24 * 12) + 1) if store else [])
               if seen.observation.observed_at >= since]
    runs = runlog.runs(roots.lake, stream.name, since=since)
    ended = [row["ended_at"] for row in runs if row["kind"] == "run" and row["ended_at"] is not None]
    current = _report(stream, roots, history[-TREND_POINTS:], now, max(ended, default=None))
    return {
        "stream": stream.name, "description": stream.description, "status": current.to_dict(),
        "backlog": [{"at": iso_utc(seen.observation.observed_at), "status": seen.status.value,
                     "files": seen.observation.backlog.files, "bytes": seen.observation.backlog.bytes,
                     "records": seen.observation.backlog.records, "units": seen.observation.backlog.units,
                     "lag_seconds": seen.observation.lag_seconds} for seen in history],
        "runs": [{**{key: _plain(value) for key, value in row.items()},
                  "duration_seconds": None if row["started_at"] is None or row["ended_at"] is None
                  else round((row["ended_at"] - row["started_at"]).total_seconds(), 3)} for row in runs],
        "dead_letters": _dead_letters(stream, roots),
        "health": _health(stream, roots, now),
        "versions": table_history(stream.sink_path(roots), limit=20) if stream.sink.table else [],
        "links": dag_links(stream),
    }
