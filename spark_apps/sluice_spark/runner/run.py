"""Run catalog streams with ``trigger(availableNow=True)``: read, split, transform, write, then summarise.

Every stream of one call runs concurrently in the same Spark application. Each processes what has arrived since
its checkpoint, commits, and stops. The summary per stream reconciles the rows Spark read with the rows the sinks
committed; a mismatch fails the run, so nothing is dropped silently."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from sluice.catalog import Catalog
from sluice.constants import DeltaEngine, RunStatus
from sluice.errors import SluiceError
from sluice.kinds.credentials import run_secrets, scrub
from sluice.paths import Roots
from sluice.storage import runlog
from sluice.storage.lock import HeldLock, LockHeld
from sluice.storage.object_lock import lock_for
from sluice.summary import PhaseClock, RunSummary, StreamRunSummary
from sluice.times import iso_utc
from sluice_spark import faults
from sluice_spark.drift import csv as csv_drift
from sluice_spark.runner.prepare import PreparedStream, maps_case, prepare_stream
from sluice_spark.runner.query import (
    CANCELLED,
    LOST_LOCK,
    Stopped,
    await_query,
    await_sources,
    finish_stream,
    start_stream,
)
from sluice_spark.runner.runlog import batch_rows, write_run_log
from sluice_spark.session import activate, preload_case_mappings, require_hadoop_connector

log = logging.getLogger(__name__)


def run_streams(spark: SparkSession, catalog: Catalog, names: list[str], roots: Roots, *,
                run_id: str | None = None, engine: DeltaEngine | None = None,
                clock: PhaseClock | None = None, cancel: threading.Event | None = None) -> RunSummary:
    """Run the named streams to the end of their available input, concurrently, and summarise each. ``clock``
    (from the application's start) gets a lap per phase: lock, prepare, query, finish, run_log. Setting ``cancel``
    (the warm server does, when the run's client goes away) stops the run's queries; their streams fail, retryably.
    """
    cancel = cancel or threading.Event()
    run_id = run_id or str(uuid.uuid4())
    clock = clock or PhaseClock()
    streams = catalog.select(names)
    activate(spark)
    if any(maps_case(stream) for stream in streams):
        preload_case_mappings(spark)  # on the other core, while the locks are taken and the frames built
    with contextlib.ExitStack() as locks:
        # One writer per checkpoint: every lock is taken before anything is read or written.
        held: dict[str, HeldLock] = {}
        for stream in streams:
            checkpoint = stream.checkpoint_path(roots)
            require_hadoop_connector(spark, checkpoint, f"stream '{stream.name}': checkpoint")
            held[stream.name] = lock = lock_for(checkpoint, stream.name, run_id)
            locks.enter_context(lock)
        clock.lap("lock")
        with csv_drift.headers_checked_by_reader():
            prepared = [prepare_stream(spark, stream, roots, run_id=run_id, engine=engine) for stream in streams]
        clock.lap("prepare")
        started, started_at = time.monotonic(), time.time()
        running: list[tuple[PreparedStream, StreamingQuery]] = []
        cancelled = {item.spec.name for item in prepared}  # until it starts, or ends by itself
        try:
            for item in prepared:
                if cancel.is_set():
                    break
                running.append((item, start_stream(item)))
                cancelled.discard(item.spec.name)
                await_sources(running[-1][1], cancel)
            for index, (item, query) in enumerate(running):
                stopped = await_query(item.spec.name, query, held[item.spec.name], cancel)
                if stopped is None and not cancel.is_set() and csv_drift.plan_by_header(item.spec, roots,
                                                                                        query.exception()):
                    # A CSV file whose header is not the declared names: the stream is read by header from now on.
                    log.warning("stream %s: a CSV file's header is not the declared names; reading by header",
                                item.spec.name)
                    stream = next(stream for stream in streams if stream.name == item.spec.name)
                    with csv_drift.headers_checked_by_reader():
                        item = prepare_stream(spark, stream, roots, run_id=run_id, engine=engine)
                    running[index] = (item, start_stream(item))
                    prepared = [item if old.spec.name == item.spec.name else old for old in prepared]
                    await_sources(running[index][1], cancel)
                    stopped = await_query(item.spec.name, running[index][1], held[item.spec.name], cancel)
                if stopped is Stopped.CANCELLED:
                    cancelled.add(item.spec.name)
        finally:
            for _, query in running:
                if query.isActive:
                    query.stop()
        clock.lap("query")
        summaries = [finish_stream(item, query, started) for item, query in running]
        summaries += [item.summary for item in prepared[len(running):]]  # cancelled before they started
        for summary in summaries:
            summary.started_at = iso_utc(started_at)
            if held[summary.stream].lost:  # the cause, whatever else the stopped query reported
                summary.status, summary.retryable = RunStatus.FAILED, True
                summary.error = LOST_LOCK
            elif summary.stream in cancelled and summary.status in (RunStatus.SUCCEEDED, RunStatus.PENDING):
                # A stopped query reports no error, and the batches it ran reconcile: it did not reach the end.
                summary.status, summary.retryable = RunStatus.FAILED, True
                summary.error = CANCELLED
        notified_after(prepared, summaries, roots)
        clean_after(summaries, catalog, roots)
        clock.lap("finish")
        scrub_errors(summaries)
        write_run_log(roots, [runlog.run_row(summary) for summary in summaries],
                      [row for item, query in running for row in batch_rows(item.spec.name, run_id, query)])
        faults.reach("run_logged")
        clock.lap("run_log")
    return RunSummary(app_id=spark.sparkContext.applicationId, streams=summaries, phases_seconds=clock.seconds)


def notified_after(prepared: Iterable[PreparedStream], summaries: Iterable[StreamRunSummary], roots: Roots) -> None:
    """``source.notifications`` after each successful run: a listing run's time recorded, the journal compacted
    (:func:`sluice.storage.notified.after_run`). A failure fails nothing: the journal only grows until the next
    run compacts it."""
    from sluice.storage.notified import after_run

    succeeded = {summary.stream for summary in summaries if summary.status == RunStatus.SUCCEEDED}
    for item in prepared:
        if item.notified is None or item.spec.name not in succeeded:
            continue
        try:
            after_run(item.spec, roots, item.notified)
        except (SluiceError, OSError) as exc:
            log.warning("stream %s: cannot record its notified run (%s); the next run does", item.spec.name, exc)


def clean_after(summaries: Iterable[StreamRunSummary], catalog: Catalog, roots: Roots) -> None:
    """``source.clean`` for each stream whose run succeeded, with its lock still held (no backfill runs meanwhile).
    A failure to clean is reported in the summary and fails nothing: the run's commits stand, and the next run
    cleans again."""
    from sluice.storage.clean import clean_landing

    for summary in summaries:
        if summary.status != RunStatus.SUCCEEDED:
            continue
        try:
            report = clean_landing(catalog.get(summary.stream), roots, after_each=lambda: faults.reach("cleaning"))
        except (SluiceError, OSError) as exc:
            summary.cleaned = {"error": str(exc)}
            continue
        summary.cleaned = report.to_dict() if report is not None else None


def run_or_refuse(spark: SparkSession, catalog: Catalog, names: list[str], roots: Roots, **options: Any) -> RunSummary:
    """:func:`run_streams`, with a refusal before anything ran (a held lock, a bad root) as every stream's failed
    summary. A held lock clears when the other run ends, so a retry can succeed; other refusals need a fix."""
    try:
        return run_streams(spark, catalog, names, roots, **options)
    except SluiceError as exc:
        return RunSummary(spark.sparkContext.applicationId, [
            StreamRunSummary(stream=name, status=RunStatus.FAILED, error=str(exc), retryable=isinstance(exc, LockHeld))
            for name in names])


def scrubbed(summary: RunSummary) -> RunSummary:
    """``summary`` without the secrets this process was given (:mod:`sluice.kinds.credentials`): a Spark error may
    quote a client option or a value, and no credential may reach XCom, the task log or the run log."""
    scrub_errors(summary.streams)
    return summary


def scrub_errors(summaries: Iterable[StreamRunSummary]) -> None:
    secrets = run_secrets()
    for summary in summaries:
        if summary.error and secrets:
            summary.error = scrub(summary.error, secrets)
