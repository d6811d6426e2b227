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
from urllib.parse import quote

from sluice.catalog import Catalog
from sluice.kinds import sink_table_format
from sluice.lag.observe import LagReport, check, error_report
from sluice.lag.store import LagStore, default_path
from sluice.model.stream import StreamSpec
from sluice.operations.backfill import DAG_ID as BACKFILL_DAG_ID
from sluice.operations.health import check_stream
from sluice.operations.redrive import DAG_ID as REDRIVE_DAG_ID
from sluice.operations.redrive import redrivable
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
    """The checkpoint report as the page shows it: ``status`` is RUNNING while a live run holds the lock and nothing
    else fails (``running`` names that run), and that lock's finding is RUNNING, not FAIL."""
    try:
        report = check_stream(stream, roots, now=now)
    except Exception as exc:
        return {"status": "ERROR", "running": None, "codes": [],
                "findings": [{"message": f"{type(exc).__name__}: {exc}"}], "facts": {}}
    running = report.running
    if running is not None:
        running["link"] = run_link(str(running["run_id"]))
    return {"stream": report.stream, "checkpoint": report.checkpoint, "status": report.shown_status,
            "gate": report.status.value, "running": running, "codes": report.shown_codes(),
            "findings": report.shown_findings(), "facts": report.facts}


def _health_summary(health: dict[str, Any]) -> dict[str, Any]:
    """The list's checkpoint column: the status, the run that holds the lock, and the codes of what is not OK."""
    return {"health": health["status"], "running": health["running"], "health_codes": health.get("codes", [])}


def _run_summary(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    keep = ("run_id", "kind", "status", "started_at", "ended_at", "input_rows", "output_rows", "dead_letter_rows",
            "dropped_rows", "error")
    return {key: _plain(row[key]) for key in keep}


def _plain(value: Any) -> Any:
    return iso_utc(value) if hasattr(value, "tzinfo") else value


def dag_links(stream: StreamSpec) -> dict[str, str]:
    """The Airflow UI's pages for the stream: its DAG's page, whose Trigger button runs it, and the backfill and
    redrive DAGs', whose Trigger buttons open their forms. Airflow 3.3's UI has no address that opens the trigger form
    itself (it is a dialog of the DAG's page), so "run" and "backfill" land on the page that holds it."""
    dag = f"/dags/{quote(stream.dag_id, safe='')}"
    return {"dag": dag, "trigger": dag, "backfill": f"/dags/{BACKFILL_DAG_ID}", "redrive": f"/dags/{REDRIVE_DAG_ID}"}


def run_link(run_id: str) -> str | None:
    """The Airflow UI's page of the task run behind a Sluice run id (``<dag_id>/<dag_run_id>/<task_id>``, which the
    maintenance prefixes with ``maintenance/`` in its lock), or of the backfill's DAG run (``backfill/<dag_run_id>``);
    None for a run id of no Airflow run (a shell's)."""
    kind, _, rest = run_id.partition("/")
    if kind in (BACKFILL_DAG_ID, REDRIVE_DAG_ID) and rest and "/" not in rest:
        return f"/dags/{kind}/runs/{quote(rest, safe='')}"
    dag_id, dag_run_id = runlog.split_run_id(rest if kind == "maintenance" else run_id)
    if not dag_id or not dag_run_id:
        return None
    task_id = run_id.rsplit("/", 1)[1]
    return f"/dags/{quote(dag_id, safe='')}/runs/{quote(dag_run_id, safe='')}/tasks/{quote(task_id, safe='')}"


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
            **_health_summary(_health(stream, roots, now)),
            "last_run": _run_summary(last_runs.get(stream.name)),
            "trend": [seen.observation.backlog.units for seen in trend[-TREND_POINTS:]],
            "links": dag_links(stream),
        })
    return entries


def _run_row(row: dict[str, Any]) -> dict[str, Any]:
    duration = None if row["started_at"] is None or row["ended_at"] is None \
        else round((row["ended_at"] - row["started_at"]).total_seconds(), 3)
    return {**{key: _plain(value) for key, value in row.items()}, "duration_seconds": duration,
            "link": run_link(row["run_id"] or "")}


def _dead_letters(stream: StreamSpec, roots: Roots) -> dict[str, Any]:
    path = stream.dead_letter_table_path(roots)
    counts = query(path, f"SELECT reason, count(*) AS rows FROM t GROUP BY reason ORDER BY rows DESC, reason "
                         f"LIMIT {_REASONS}")
    samples = query(path, f"SELECT reason, raw_record, source_file, ingested_at FROM t ORDER BY ingested_at DESC "
                          f"LIMIT {_SAMPLES}")
    return {"reasons": [] if counts is None else counts.to_pylist(), "redrivable": redrivable(stream, roots),
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
    logged = runlog.runs(roots.lake, stream.name, since=since)
    # The stream's own runs are what the charts draw; a backfill, a repair or the nightly maintenance holds the
    # stream's lock and is logged beside them, but reads nothing of its backlog: listed apart.
    runs = [row for row in logged if row["kind"] == "run"]
    operations = [row for row in logged if row["kind"] != "run"]
    ended = [row["ended_at"] for row in runs if row["ended_at"] is not None]
    current = _report(stream, roots, history[-TREND_POINTS:], now, max(ended, default=None))
    return {
        "stream": stream.name, "description": stream.description, "status": current.to_dict(),
        "backlog": [{"at": iso_utc(seen.observation.observed_at), "status": seen.status.value,
                     "files": seen.observation.backlog.files, "bytes": seen.observation.backlog.bytes,
                     "records": seen.observation.backlog.records, "units": seen.observation.backlog.units,
                     "lag_seconds": seen.observation.lag_seconds} for seen in history],
        "runs": [_run_row(row) for row in runs],
        "operations": [_run_row(row) for row in operations],
        "dead_letters": _dead_letters(stream, roots),
        "health": _health(stream, roots, now),
        "versions": _versions(stream, roots),
        "links": dag_links(stream),
    }


def _versions(stream: StreamSpec, roots: Roots, limit: int = 20) -> list[dict[str, Any]]:
    """The sink's newest commits, newest first: a Delta sink's versions (with its resets), another table format's
    commits through the seam (an Iceberg table's snapshots, each with its snapshot id); none for a Kafka sink."""
    if stream.sink.table:
        return table_history(stream.sink_path(roots), limit=limit)
    table = sink_table_format(stream, roots)
    if table is None:
        return []
    # ``snapshot`` is the id as text: an Iceberg snapshot id is past the integers JavaScript holds exactly.
    return [{"version": commit.version, "snapshot_id": commit.snapshot_id,
             "snapshot": None if commit.snapshot_id is None else str(commit.snapshot_id),
             "time": iso_utc(commit.committed_at),
             "operation": commit.operation, "stream": commit.stream, "query_id": commit.query_id,
             "batch_id": commit.batch_id, "rows": commit.rows, "reset_after_batch": None}
            for commit in reversed(table.commits(limit=limit))]
