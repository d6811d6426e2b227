"""The health gate of a run: each stream's checkpoint checked before Spark starts, and the wait for another run's
lock. Reads plain files and Delta metadata only; no JVM, no Airflow, so it is tested on its own and the operators,
the CLI and any other scheduler share it.

A stream whose only FAIL is a live run's lock (a backfill, the nightly maintenance) is checked again every
:data:`LOCK_POLL_SECONDS` until a deadline: the lock clears when that run ends. What a gate's refusal means for a
retry is :attr:`GateResult.retry`: another run's lock, still held after the wait, or a check that raised, may clear
by itself; a checkpoint that needs a repair does not.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.paths import Roots

if TYPE_CHECKING:
    from sluice.model.stream import StreamSpec
    from sluice.operations.health import HealthReport

#: How long a health gate waits for another run (a backfill, the maintenance) to release the stream's lock.
DEFAULT_LOCK_WAIT_SECONDS = 600
LOCK_POLL_SECONDS = 5.0

_log = logging.getLogger(__name__)


def checked_health(stream: StreamSpec, roots: Roots, *, fail_on_warn: bool = False, lock_deadline: float = 0.0,
                   log: Any = _log) -> tuple[HealthReport, bool]:
    """Check a stream's checkpoint, logging every finding and the checkpoint's facts: the report, and whether it
    stops the stream's run (FAIL, or WARN with ``fail_on_warn``).

    While the only FAIL is a live run's lock, the check is made again every few seconds until ``lock_deadline``
    (``time.monotonic()``)."""
    from sluice.operations.health import Health, check_stream

    report = check_stream(stream, roots)
    if report.waits_for_a_run and time.monotonic() < lock_deadline:
        log.info("%s: another run holds the stream's lock; checking again until it ends, for up to %.0f s",
                 stream.name, lock_deadline - time.monotonic())
    while report.waits_for_a_run and time.monotonic() < lock_deadline:
        time.sleep(min(LOCK_POLL_SECONDS, max(lock_deadline - time.monotonic(), 0.0)))
        report = check_stream(stream, roots)
    for finding in report.findings:
        say = log.warning if finding.severity is not Health.OK else log.info
        say("%s: [%s] %s: %s %s", stream.name, finding.severity.value, finding.code.value, finding.message,
            finding.evidence or "")
    log.info("Checkpoint facts of %s: %s", stream.name, json.dumps(report.facts, default=str))
    return report, report.status is Health.FAIL or (fail_on_warn and report.status is Health.WARN)


@dataclass
class GateResult:
    """The gate of a group of streams: each stream's report (as a dict), the streams it leaves out and why, and
    whether a stream left out may run at the next try."""

    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    retry: bool = False

    def refused(self, name: str, why: str, *, retry: bool) -> None:
        self.stopped.append(name)
        self.refusals.append(why)
        self.retry = self.retry or retry


def check_streams(streams: Sequence[StreamSpec], roots: Roots, *, fail_on_warn: bool = False,
                  lock_wait_seconds: float = DEFAULT_LOCK_WAIT_SECONDS,
                  log: Any = _log) -> GateResult:
    """Each stream's gate, one lock wait for all of them. A stream whose check raised is left out alone (a group's
    other streams run), as is one whose only FAIL is another run's lock, still held after the wait: both may clear
    by the next try."""
    lock_deadline = time.monotonic() + lock_wait_seconds
    result = GateResult()
    for stream in streams:
        try:
            report, stops = checked_health(stream, roots, fail_on_warn=fail_on_warn, lock_deadline=lock_deadline,
                                           log=log)
        except Exception as exc:  # a store that cannot be read now; the next try reads it again
            log.exception("The checkpoint health check of stream %s raised", stream.name)
            error = f"{type(exc).__name__}: {exc}"
            result.reports[stream.name] = {"stream": stream.name, "status": "ERROR", "error": error}
            result.refused(stream.name, f"checkpoint health of stream '{stream.name}': the check raised {error}",
                           retry=True)
            continue
        result.reports[stream.name] = report.to_dict()
        if stops:
            log.warning("Stream %s is left out of this run: its checkpoint health check failed", stream.name)
            result.refused(stream.name, report.describe(), retry=report.waits_for_a_run)
    return result


def resolve_roots(landing: str | None, lake: str | None, checkpoints: str | None) -> Roots:
    """Roots given to a task, each falling back to the ``SLUICE_*`` environment."""
    defaults = Roots.from_env()
    return Roots(landing=landing or defaults.landing, lake=lake or defaults.lake,
                 checkpoints=checkpoints or defaults.checkpoints)


def places(roots: Roots, catalog: str | None, streams: Sequence[str] | None = None) -> list[str]:
    """The roots, and every place the catalog's streams (or ``streams`` of them) read or write under them; the roots
    alone when the catalog does not load (the task's own check of it says why). What decides whether a task needs
    the object store's credentials."""
    from sluice.catalog import load_catalog
    from sluice.errors import SluiceError

    found = [roots.landing, roots.lake, roots.checkpoints]
    try:
        loaded = load_catalog(catalog)
        selected = loaded.select(list(streams)) if streams else list(loaded)
    except (SluiceError, OSError):
        return found
    return found + [place for stream in selected for place in stream.locations(roots)]
