"""``python -m sluice status`` (``make status``): one line per stream with its lag status, backlog, last commit,
checkpoint health and backlog trend. Read-only unless ``--record`` adds the observations to the lag history."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from sluice.catalog import load_catalog
from sluice.errors import SluiceError, printable
from sluice.lag.observe import LagReport, check, error_report
from sluice.lag.store import LagStore, recorded_history
from sluice.operations.health import check_stream
from sluice.paths import Roots

# What ``--reasons`` prints when no stream's lag has one: the HEALTH column's findings are ``sluice health``'s.
NO_REASONS = "no lag reasons: every stream's STATUS is OK"
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
    rows, reasons = [], []
    for stream in streams:
        history = recorded_history(roots, stream.name, limit=max(stream.alerts.stall_observations, 5))
        try:
            report = check(stream, roots, history=[seen.observation for seen in history], now=now)
            health = check_stream(stream, roots, now=now).status.value
        except Exception as exc:  # show the others; the broken stream's row says what went wrong
            report, health = error_report(stream, exc, now=now), "?"
        if store is not None:
            store.record(report)
        if args.json:
            print(json.dumps({**report.to_dict(), "health": health}, default=str))
        else:
            rows.append(row(report, health, history))
            reasons += [printable(f"{stream.name}: {reason}") for reason in report.reasons]
    if not args.json:
        print(table(rows))
        if args.reasons:
            print("\n" + ("\n".join(reasons) or NO_REASONS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
