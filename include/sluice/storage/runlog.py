"""The run log: what every run, backfill and repair did, as two Delta tables anyone can query.

Under the lake root's ``_sluice/`` folder:

- ``_sluice/runs``: one row per stream per run (:data:`RUN_COLUMNS`). Its key is (stream, run id): Airflow's retry of
  a task keeps its run id, so a run retried after a crash replaces its row instead of adding a second one.
- ``_sluice/batches``: one row per micro-batch from Spark's progress reports (:data:`BATCH_COLUMNS`), keyed by
  (stream, run id, query id, batch id).

Both are written with a MERGE on their key through delta-rs, so writing a row twice leaves one, and read back
without Spark (the Streams page, ``make status``). Runs of several streams may commit at once: a commit that loses
the race is retried on the new version.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sluice.paths import join
from sluice.summary import StreamRunSummary
from sluice.times import iso_utc

log = logging.getLogger(__name__)

RUNS_TABLE = "_sluice/runs"
BATCHES_TABLE = "_sluice/batches"
_COMMIT_ATTEMPTS = 8
# Each write adds a small file; past this many, the table is compacted (and files removed over a week ago are
# vacuumed), so the log of a stream that runs every five minutes stays a few files.
COMPACT_AFTER_FILES = 64
VACUUM_RETENTION_HOURS = 168

#: Column -> Arrow type name of ``_sluice/runs``. ``kind`` is run, backfill or repair; ``expectations`` the
#: per-rule counts as JSON; ``note`` what a backfill or a repair was asked (JSON); ``table_changes`` a merge or cdc
#: run's rows inserted, updated, deleted and versions closed (JSON); times are UTC.
RUN_COLUMNS: dict[str, str] = {
    "stream": "string", "run_id": "string", "kind": "string", "dag_id": "string", "dag_run_id": "string",
    "query_id": "string", "engine": "string", "started_at": "timestamp", "ended_at": "timestamp",
    "status": "string", "error": "string", "batches": "int64", "input_rows": "int64", "output_rows": "int64",
    "dead_letter_rows": "int64", "dropped_rows": "int64", "late_rows": "int64", "duplicate_rows": "int64",
    "state_rows": "int64", "delta_version_before": "int64", "delta_version_after": "int64",
    "dead_letter_version_before": "int64", "dead_letter_version_after": "int64", "expectations": "string",
    "note": "string", "table_changes": "string", "snapshot_id_before": "int64", "snapshot_id_after": "int64",
}
RUN_KEY = ("stream", "run_id")
RUN_KINDS = ("run", "backfill", "repair", "maintenance", "redrive")

#: Column -> Arrow type name of ``_sluice/batches``: Spark's progress report of one micro-batch. ``phases_ms`` is
#: its ``durationMs`` and ``sources`` its sources' offsets, as JSON.
BATCH_COLUMNS: dict[str, str] = {
    "stream": "string", "run_id": "string", "query_id": "string", "batch_id": "int64", "timestamp": "timestamp",
    "duration_ms": "int64", "phases_ms": "string", "input_rows": "int64", "input_rows_per_second": "float64",
    "processed_rows_per_second": "float64", "state_rows": "int64", "state_memory_bytes": "int64",
    "watermark": "string", "sources": "string",
}
BATCH_KEY = ("stream", "run_id", "query_id", "batch_id")


def _arrow_schema(columns: Mapping[str, str]) -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(),
             "timestamp": pa.timestamp("us", tz="UTC")}
    return pa.schema([pa.field(name, types[kind]) for name, kind in columns.items()])


def split_run_id(run_id: str) -> tuple[str | None, str | None]:
    """The DAG id and the DAG run id of an Airflow task's run id (``<dag_id>/<dag_run_id>/<task_id>``)."""
    parts = run_id.split("/")
    return (parts[0], "/".join(parts[1:-1])) if len(parts) >= 3 else (None, None)


def _upsert(lake_root: str, table: str, columns: Mapping[str, str], key: Sequence[str],
            rows: Sequence[Mapping[str, Any]], *, name: str) -> None:
    import pyarrow as pa
    from deltalake.exceptions import CommitFailedError

    from sluice.storage.delta import commit_hooks, ensured_table

    if not rows:
        return
    path = join(lake_root, table)
    schema = _arrow_schema(columns)
    data = pa.Table.from_pylist([{column: row.get(column) for column in columns} for row in rows], schema=schema)
    # The table loaded once: merged into, then measured (a merge leaves it at its own commit).
    delta, _ = ensured_table(path, schema, (), name=name, description=f"Sluice's {name}: see sluice.storage.runlog")
    condition = " AND ".join([*(f"t.{column} = s.{column}" for column in key), *_key_bounds(data, key)])
    for attempt in range(_COMMIT_ATTEMPTS):
        try:
            (delta.merge(data, condition, source_alias="s", target_alias="t",
                         post_commithook_properties=commit_hooks(delta))
             .when_matched_update_all().when_not_matched_insert_all().execute())
            break
        except CommitFailedError:
            if attempt == _COMMIT_ATTEMPTS - 1:
                raise
            time.sleep(0.05 * 2**attempt)  # another run committed first: merge again on its version
            delta.update_incremental()
    keep_small(delta)


def _key_bounds(rows: Any, key: Sequence[str]) -> list[str]:
    """The MERGE's key columns bounded by the rows' own values, as literals: a target row that a row matches equals it
    on every key column, so it lies within these bounds and the condition selects the same rows. delta-rs reads only
    the files whose statistics fall within them: the run log adds a file per run until it is compacted, and a merge
    that read them all cost twice a fresh table's after 10,000 runs (80 ms against 40 ms)."""
    import pyarrow.compute as pc

    from sluice.model.predicates import DATAFUSION

    bounds = []
    for column in key:
        low, high = (bound.as_py() for bound in pc.min_max(rows.column(column)).values())
        if isinstance(low, str):
            low, high = DATAFUSION.string(low), DATAFUSION.string(high)
        elif not isinstance(low, int) or isinstance(low, bool):
            continue  # no row has a value (and NULL matches nothing), or a type the keys do not use
        bounds += [f"t.{column} = {low}"] if low == high else [f"t.{column} >= {low}", f"t.{column} <= {high}"]
    return bounds


def keep_small(table: Any) -> bool:
    """Compact a run log table (a path, or a delta-rs table already loaded) past :data:`COMPACT_AFTER_FILES` files
    and vacuum what was removed over a week ago (no reader keeps a version that long). True when it compacted. A run
    that loses this race to another leaves the work to the next one."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    from sluice.storage.delta import open_table

    if not isinstance(table, DeltaTable):
        table = open_table(table)
    if len(table.file_uris()) <= COMPACT_AFTER_FILES:
        return False
    try:
        table.optimize.compact()
        table.vacuum(retention_hours=VACUUM_RETENTION_HOURS, dry_run=False)
    except CommitFailedError as exc:
        log.info("the run log %s was compacted by another run: %s", table.table_uri, exc)
        return False
    return True


def record_runs(lake_root: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write run rows (:data:`RUN_COLUMNS`), replacing any with the same stream and run id."""
    _upsert(lake_root, RUNS_TABLE, RUN_COLUMNS, RUN_KEY, rows, name="sluice_runs")


def record_batches(lake_root: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write batch rows (:data:`BATCH_COLUMNS`), replacing any with the same key."""
    _upsert(lake_root, BATCHES_TABLE, BATCH_COLUMNS, BATCH_KEY, rows, name="sluice_batches")


def _read(lake_root: str, table: str, where: Mapping[str, str], order: str, *,
          since: tuple[str, float] | None = None) -> list[dict[str, Any]]:
    """Rows whose columns equal ``where`` (and whose time column ``since[0]`` is at or after ``since[1]``, seconds
    since the epoch), in ``order``."""
    from sluice.storage.delta import query

    conditions = [f"{column} = '{value.replace(chr(39), chr(39) * 2)}'" for column, value in where.items()]
    if since is not None:
        conditions.append(f"{since[0]} >= to_timestamp_micros({int(since[1] * 1_000_000)})")
    clause = f"WHERE {' AND '.join(conditions)} " if conditions else ""
    rows = query(join(lake_root, table), f"SELECT * FROM t {clause}ORDER BY {order}")
    return [] if rows is None else rows.to_pylist()


def runs(lake_root: str, stream: str | None = None, *, since: float | None = None) -> list[dict[str, Any]]:
    """The run log's rows (of one stream, or all; started at or after ``since``), oldest first; empty before the
    first run."""
    return _read(lake_root, RUNS_TABLE, {"stream": stream} if stream else {}, "started_at, stream, run_id",
                 since=None if since is None else ("started_at", since))


def latest_runs(lake_root: str, kind: str = "run") -> dict[str, dict[str, Any]]:
    """Each stream's latest run of ``kind``, by stream."""
    from sluice.storage.delta import query

    if kind not in RUN_KINDS:
        raise ValueError(f"unknown run kind {kind!r}; one of {', '.join(RUN_KINDS)}")
    rows = query(join(lake_root, RUNS_TABLE),
                 "SELECT t.* FROM t JOIN (SELECT stream, max(started_at) AS started_at FROM t "
                 f"WHERE kind = '{kind}' GROUP BY stream) latest ON t.stream = latest.stream "
                 f"AND t.started_at = latest.started_at WHERE t.kind = '{kind}'")
    return {} if rows is None else {row["stream"]: row for row in rows.to_pylist()}


def batches(lake_root: str, stream: str, run_id: str | None = None) -> list[dict[str, Any]]:
    """The batch rows of a stream (of one run, or all), oldest first."""
    where = {"stream": stream, **({"run_id": run_id} if run_id else {})}
    return _read(lake_root, BATCHES_TABLE, where, "timestamp, batch_id")


def run_row(summary: StreamRunSummary | Any, *, kind: str = "run", **overrides: Any) -> dict[str, Any]:
    """The run log's row of a run's summary (a :class:`StreamRunSummary`, or any summary with those attributes,
    such as a backfill's, with ``overrides`` for what it names otherwise)."""
    values = {column: getattr(summary, column, None) for column in RUN_COLUMNS}
    values.update(overrides)
    values.setdefault("expectations", None)
    dag_id, dag_run_id = split_run_id(values["run_id"] or "")
    values.update(kind=kind, dag_id=values.get("dag_id") or dag_id, dag_run_id=values.get("dag_run_id") or dag_run_id,
                  started_at=_time(values["started_at"]), ended_at=_time(values["ended_at"]),
                  expectations=json.dumps(values["expectations"]) if values["expectations"] else None,
                  table_changes=json.dumps(values["table_changes"]) if values.get("table_changes") else None)
    return values


def log_operation(lake_root: str, *, stream: str, run_id: str, kind: str, started: float, status: str,
                  error: str | None, note: Mapping[str, Any]) -> None:
    """The run log's row of an operation that is not a run (a repair, a maintenance): what was asked and done, or
    why it was refused. The operation is over either way: a run log that cannot be written is an error in the task's
    log only."""
    row = run_row(None, kind=kind, stream=stream, run_id=run_id, status=str(status), error=error,
                  started_at=iso_utc(started), ended_at=iso_utc(time.time()), note=json_text(note))
    try:
        record_runs(lake_root, [row])
    except Exception as exc:
        log.error("could not write the run log under %s: %s", lake_root, exc)


def _time(value: str | None) -> Any:
    import datetime as dt

    return None if value is None else dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def json_text(value: Any) -> str | None:
    """A report's nested value as the JSON text the run log keeps."""
    return None if value is None else json.dumps(value, sort_keys=True, default=str)


def total(values: Iterable[Any]) -> int:
    return sum(int(value or 0) for value in values)
