"""The run log's rows of a run: its streams' summaries and their executed batches (:mod:`sluice.storage.runlog`)."""

from __future__ import annotations

import datetime as dt
import logging
import math
from typing import Any

from pyspark.sql.streaming import StreamingQuery

from sluice.kinds.credentials import scrub_secrets
from sluice.paths import Roots
from sluice.storage import runlog

log = logging.getLogger(__name__)


def write_run_log(roots: Roots, runs: list[dict[str, Any]], batches: list[dict[str, Any]]) -> None:
    """Record runs and their batches in the run log (:mod:`sluice.storage.runlog`) while the streams' locks are
    held. The tables are committed already: a run log that cannot be written is logged, not a failed run."""
    try:
        runlog.record_batches(roots.lake, batches)
        runlog.record_runs(roots.lake, runs)
    except Exception as exc:
        log.error("could not write the run log under %s: %s", roots.lake, scrub_secrets(str(exc)))


def batch_rows(stream: str, run_id: str, query: StreamingQuery) -> list[dict[str, Any]]:
    """The run log's rows of a query's executed batches, from Spark's progress reports."""
    rows = []
    for progress in query.recentProgress:
        if "addBatch" not in progress.durationMs:
            continue  # an idle trigger: no batch ran
        operators = progress.stateOperators
        rows.append({
            "stream": stream, "run_id": run_id, "query_id": str(progress.id), "batch_id": int(progress.batchId),
            "timestamp": dt.datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")),
            "duration_ms": int(progress.batchDuration), "phases_ms": runlog.json_text(dict(progress.durationMs)),
            "input_rows": int(progress.numInputRows),
            "input_rows_per_second": _finite(progress.inputRowsPerSecond),
            "processed_rows_per_second": _finite(progress.processedRowsPerSecond),
            "state_rows": runlog.total(op.numRowsTotal for op in operators),
            "state_memory_bytes": runlog.total(op.memoryUsedBytes for op in operators),
            "watermark": progress.eventTime.get("watermark"),
            "sources": runlog.json_text([{"description": source.description, "start": source.startOffset,
                                          "end": source.endOffset, "input_rows": source.numInputRows}
                                         for source in progress.sources]),
        })
    return rows


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) or math.isinf(value) else float(value)
