"""Run catalog streams with ``trigger(availableNow=True)``: read, route, write, then summarise.

The runner's parts: :mod:`.prepare` builds a stream's routed frame (:mod:`sluice_spark.steps.route`) and creates its
tables (:mod:`.tables`); :mod:`.query` starts, awaits and summarises its query; :mod:`.failures` says why a query
failed and whether a rerun can get past it; :mod:`.runlog` records the run; :mod:`.run` runs streams together under
their locks. The apps (``stream_runner.py``, the warm server, the backfill) import their entry points from here.
"""

from __future__ import annotations

from sluice_spark.runner.failures import error_message, explained, is_permanent, refused_by
from sluice_spark.runner.prepare import build_routed_frame, collects_on_driver, maps_case, prepare_stream
from sluice_spark.runner.query import CANCELLED, await_query
from sluice_spark.runner.run import run_or_refuse, run_streams, scrubbed
from sluice_spark.runner.runlog import batch_rows, write_run_log
from sluice_spark.runner.tables import (
    create_tables,
    feeds_changes,
    sink_targets,
    tables_to_create,
    with_added_columns,
)

__all__ = [
    "CANCELLED", "await_query", "batch_rows", "build_routed_frame", "collects_on_driver", "create_tables",
    "error_message", "explained", "feeds_changes", "is_permanent", "maps_case", "prepare_stream", "refused_by",
    "run_or_refuse", "run_streams", "scrubbed", "sink_targets", "tables_to_create", "with_added_columns",
    "write_run_log",
]
