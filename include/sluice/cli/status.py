"""``python -m sluice status`` (``make status``): one line per stream with its lag status, backlog, last commit,
checkpoint health and backlog trend. Read-only unless ``--record`` adds the observations to the lag history.

HEALTH is the checkpoint check's status with the codes of its findings that are not OK (``WARN STALE``), or RUNNING
while a live run holds the stream's lock and nothing else fails; a line under the table names that run and since
when. ``--reasons`` says
why for both columns: the lag status's reasons and every health code's finding.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from datetime import datetime

from sluice.catalog import load_catalog
from sluice.errors import SluiceError, printable
from sluice.lag.observe import LagReport, check, error_report
from sluice.lag.store import LagStore, recorded_history
from sluice.operations.health import HealthReport, check_stream
from sluice.paths import Roots

# What ``--reasons`` prints when no stream has a lag reason or a health finding that is not OK.
NO_REASONS = "no reasons: every stream's STATUS and HEALTH are OK"
COLUMNS = ("STREAM", "STATUS", "FILES", "BYTES", "RECORDS", "LAG", "LAST COMMIT", "HEALTH", "TREND")


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024  # type: ignore[assignment]
    return str(value)


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _trend(history: Sequence[LagReport], report: LagReport) -> str:
    units = [seen.observation.backlog.units for seen in [*history, report]]
    return "→".join("-" if value is None else str(value) for value in units[-6:])


def row(report: LagReport, health: str, history: Sequence[LagReport]) -> tuple[str, ...]:
    observation = report.observation
    backlog = observation.backlog
    last = "never" if observation.last_batch_id is None else \
        f"#{observation.last_batch_id} {_ago(observation.seconds_since_last_commit)} ago"
    cells = (report.stream, report.status.value, "-" if backlog.files is None else str(backlog.files),
             _size(backlog.bytes), "-" if backlog.records is None else str(backlog.records),
             _ago(observation.lag_seconds), last, health, _trend(history, report))
    return tuple(map(printable, cells))


def health_cell(report: HealthReport) -> str:
    """The HEALTH column: RUNNING, or the status followed by the codes of the findings that are not OK."""
    return " ".join([report.shown_status, *report.shown_codes()])


def running_line(stream: str, running: dict[str, object], now: float) -> str:
    since = str(running["since"])
    try:
        age = f" ({_ago(now - datetime.fromisoformat(since).timestamp())})"
    except ValueError:
        age = ""
    return printable(f"{stream}: RUNNING run {running['run_id']!r} since {since}{age} on {running['host']} "
                     f"(pid {running['pid']})")


def health_reasons(report: HealthReport) -> list[str]:
    """One line per finding that is not OK: its code, its severity as shown and its message."""
    return [printable(f"{report.stream}: health {finding['code']} [{finding['severity']}]: {finding['message']}")
            for finding in report.shown_findings() if finding["severity"] != "OK"]


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(line[i])) for line in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
                     for line in [COLUMNS, *rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice status", description="Lag and health of every stream.")
    parser.add_argument("--stream", action="append", help="default: every stream of the catalog")
    parser.add_argument("--catalog", help="default: SLUICE_CATALOG or the bundled catalog")
    parser.add_argument("--json", action="store_true", help="print one JSON report per line")
    parser.add_argument("--record", action="store_true", help="add the observations to the lag history")
    parser.add_argument("--reasons", action="store_true", help="print why each stream has its status")
    args = parser.parse_args(argv)
    try:
        catalog = load_catalog(args.catalog)
        streams = [catalog.get(name) for name in args.stream] if args.stream else list(catalog)
        roots = Roots.from_env()
        store = LagStore.for_roots(roots) if args.record else None
    except SluiceError as exc:
        print(f"error: {printable(str(exc))}", file=sys.stderr)
        return 2
    now = time.time()
    rows, reasons, running = [], [], []
    for stream in streams:
        history = recorded_history(roots, stream.name, limit=max(stream.alerts.stall_observations, 5))
        health_report: HealthReport | None = None
        try:
            report = check(stream, roots, history=[seen.observation for seen in history], now=now)
            health_report = check_stream(stream, roots, now=now)
        except Exception as exc:  # show the others; the broken stream's row says what went wrong
            report = error_report(stream, exc, now=now)
        if store is not None:
            store.record(report)
        health = "?" if health_report is None else health_report.shown_status
        if args.json:
            extra = {} if health_report is None else {
                "health_codes": health_report.shown_codes(),
                "running": health_report.running}
            print(json.dumps({**report.to_dict(), "health": health, **extra}, default=str))
            continue
        rows.append(row(report, "?" if health_report is None else health_cell(health_report), history))
        reasons += [printable(f"{stream.name}: {reason}") for reason in report.reasons]
        if health_report is not None:
            reasons += health_reasons(health_report)
            if health_report.running is not None:
                running.append(running_line(stream.name, health_report.running, now))
    if not args.json:
        print(table(rows))
        if running:
            print("\n" + "\n".join(running))
        if args.reasons:
            print("\n" + ("\n".join(reasons) or NO_REASONS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
