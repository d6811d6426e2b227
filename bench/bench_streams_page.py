"""Streams page benchmark: its two JSON routes' work for 20 streams with 30 days of history.

Each stream has a checkpoint of 100 retained batches (Spark's default), a landing zone with unread files, 30 days of
lag observations every 5 minutes (8,640 per stream, written through the lag history's own INSERT) and 30 days of
runs every 5 minutes in the run log (8,640 per stream, one compacted table). It times what the routes compute
(``sluice.operations.streams_view.overview`` for all streams and ``detail`` for one), no Spark, against the goal:
under 1 second each. The last line is the result as JSON.

    python bench/bench_streams_page.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import tempfile
import time
from pathlib import Path

from bench_health import build_checkpoint

from sluice.catalog import parse_catalog
from sluice.cli.demo_producer import EVENT_SCHEMA
from sluice.lag.observe import LagStatus, check
from sluice.lag.store import LagStore
from sluice.operations import streams_view
from sluice.paths import Roots
from sluice.storage import runlog

EVERY = 300  # seconds between two runs and two observations
# Both on the same five-minute cron, as the lag monitor and the ingest DAGs are: the monitor's observation comes a few
# seconds after the tick, and the run ends after it, so the page measures the lag again (streams_view).
OBSERVED_AFTER_TICK, RUN_ENDS_AFTER_TICK = 5, 40


def ticks(days: int, now: float) -> list[float]:
    """Every five-minute tick of the last ``days``, oldest first, the last at ``now``."""
    points = int(days * 86400 / EVERY)
    return [now - (points - 1 - step) * EVERY for step in range(points)]


def catalog_of(count: int) -> object:
    return parse_catalog({"version": 1, "streams": [{
        "name": f"stream_{index:02d}",
        "source": {"type": "files", "format": "json", "path": f"stream_{index:02d}", "schema": EVENT_SCHEMA},
        "sink": {"path": f"bronze/stream_{index:02d}", "engine": "rs"},
        "schedule": "*/5 * * * *",
        "alerts": {"warn_files": 5, "critical_files": 50},
    } for index in range(count)]})


def fill_history(store: LagStore, catalog: object, roots: Roots, days: int, now: float) -> None:
    """``days`` of observations per stream, one every 5 minutes, as the lag monitor records them."""
    for stream in catalog:  # type: ignore[attr-defined]
        report = check(stream, roots, now=now).to_dict()
        rows = []
        for step, tick in enumerate(ticks(days, now)):
            at = tick + OBSERVED_AFTER_TICK
            files = step % 7
            report.update(observed_at=at, status=LagStatus.WARN.value if files >= 5 else LagStatus.OK.value,
                          backlog={**report["backlog"], "files": files})
            rows.append((stream.name, at, report["status"], files, None, None, 0.0, step, json.dumps(report)))
        with store._connect() as db:  # the store's own table; one transaction per stream instead of 8,640
            db.executemany("INSERT INTO observations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)


def fill_run_log(lake: str, catalog: object, days: int, now: float) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    from sluice.paths import join
    from sluice.storage.delta import ensure_table

    rows = []
    for stream in catalog:  # type: ignore[attr-defined]
        for step, tick in enumerate(ticks(days, now)):
            started = dt.datetime.fromtimestamp(tick + 1, dt.timezone.utc)
            rows.append({"stream": stream.name, "run_id": f"ingest_{stream.name}/scheduled__{step}/run_stream",
                         "kind": "run", "status": "succeeded", "started_at": started,
                         "ended_at": dt.datetime.fromtimestamp(tick + RUN_ENDS_AFTER_TICK, dt.timezone.utc),
                         "batches": 1, "input_rows": 100 + step % 50,
                         "output_rows": 98 + step % 50, "dead_letter_rows": 2})
    schema = runlog._arrow_schema(runlog.RUN_COLUMNS)
    path = join(lake, runlog.RUNS_TABLE)
    ensure_table(path, schema, (), name="sluice_runs")
    write_deltalake(path, pa.Table.from_pylist([{c: row.get(c) for c in runlog.RUN_COLUMNS} for row in rows],
                                               schema=schema), mode="append")


def best(repeat: int, work: object) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sluice-bench-page-"))
    try:
        roots = Roots(landing=str(work / "landing"), lake=str(work / "lake"), checkpoints=str(work / "checkpoints"))
        catalog = catalog_of(args.streams)
        now = time.time() - 60  # the last cron tick: its observation and its run are recorded by now
        started = time.perf_counter()
        for stream in catalog:
            build_checkpoint(Path(stream.checkpoint_path(roots)), 100, 3)
            landing = Path(roots.landing, stream.name)
            landing.mkdir(parents=True)
            for index in range(10):
                (landing / f"new-{index}.json").write_text('{"event_id": "e"}\n')
        store = LagStore.for_roots(roots)
        fill_history(store, catalog, roots, args.days, now)
        fill_run_log(roots.lake, catalog, args.days, now)
        print(f"built {args.streams} streams with {args.days} days of history in {time.perf_counter() - started:.1f}s")

        listed = streams_view.overview(catalog, roots)
        assert len(listed) == args.streams and all(entry["last_run"] for entry in listed)
        one = catalog.get("stream_00")
        history = streams_view.detail(one, roots, days=args.days)
        assert len(history["runs"]) >= args.days * 86400 / EVERY - 1 and len(history["backlog"]) > 8000
        seconds = {"streams_list": best(args.repeat, lambda: streams_view.overview(catalog, roots)),
                   "stream_history": best(args.repeat, lambda: streams_view.detail(one, roots, days=args.days))}
        print(json.dumps({"streams": args.streams, "days": args.days,
                          "seconds": {key: round(value, 3) for key, value in seconds.items()},
                          "goals": {key: 1.0 for key in seconds}}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
