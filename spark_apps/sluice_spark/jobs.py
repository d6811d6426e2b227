"""What the spark-submit entry points of a bounded job share (``backfill_runner.py``, ``redrive_runner.py``): the
arguments every one takes, the summary line it prints and writes, and its exit codes: 0 done, 1 failed, 2 refused
(the params, checked again here with the rules of the DAG, before any Spark starts)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from sluice.catalog import Catalog, load_catalog
from sluice.constants import DeltaEngine, RunStatus
from sluice.errors import BackfillError, SluiceError, printable
from sluice.paths import Roots
from sluice.storage.lock import LockHeld


class JobSummary(Protocol):
    @property
    def ok(self) -> bool: ...

    def to_json(self) -> str: ...


def job_arguments(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser with the arguments every job takes; the job adds its own params."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--catalog", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--timezone")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--landing-root", required=True)
    parser.add_argument("--lake-root", required=True)
    parser.add_argument("--checkpoint-root", required=True)
    parser.add_argument("--engine", choices=[engine.value for engine in DeltaEngine])
    parser.add_argument("--lock-wait-seconds", type=float, default=600)
    parser.add_argument("--summary-file")
    return parser


def emit(marker: str, line_json: str, summary_file: str | None) -> None:
    """The summary, without any secret this process was given (an error may quote a credential; the line reaches
    XCom and the task log): to ``summary_file``, and on stdout after ``marker``."""
    from sluice.kinds.credentials import scrub_secrets

    line_json = scrub_secrets(line_json)
    if summary_file:
        path = Path(summary_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line_json + "\n", encoding="utf-8")
    sys.stdout.flush()  # alone on a fresh buffer, the line reaches the pipe in one write
    print(marker + line_json, flush=True)


def run_job(args: argparse.Namespace, params: Mapping[str, Any], *, name: str, marker: str,
            parse_request: Callable[..., Any], run: Callable[..., JobSummary]) -> int:
    """Check the params, then run the job in a Spark application of its own; the exit code."""
    from pyspark.sql import SparkSession

    from sluice_spark.session import configure_sluice

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a line per connection, a preload's among them
    roots = Roots(landing=args.landing_root, lake=args.lake_root, checkpoints=args.checkpoint_root)
    try:
        catalog: Catalog = load_catalog(args.catalog)
        request = parse_request(params, catalog, run_id=args.run_id)
        catalog.check_roots(roots)
    except SluiceError as exc:
        return _refused(marker, args.stream, exc, args.summary_file)
    spark = configure_sluice(SparkSession.builder.appName(f"sluice-{name}:{request.stream}")).getOrCreate()
    try:
        engine = DeltaEngine(args.engine) if args.engine else None
        try:
            summary = run(spark, catalog, request, roots, engine=engine, lock_wait_seconds=args.lock_wait_seconds)
        except BackfillError as exc:  # a param only the plan could check (a broker's offsets, a table's versions)
            return _refused(marker, request.stream, exc, args.summary_file)
        except SluiceError as exc:
            emit(marker, json.dumps({"stream": request.stream, "status": RunStatus.FAILED, "error": str(exc),
                                     "retryable": isinstance(exc, LockHeld)}), args.summary_file)
            return 1
        emit(marker, summary.to_json(), args.summary_file)
        return 0 if summary.ok else 1
    finally:
        spark.stop()


def _refused(marker: str, stream: str, exc: SluiceError, summary_file: str | None) -> int:
    """A request refused before anything was read or written: its summary line, its reason on stderr, exit code 2."""
    emit(marker, json.dumps({"stream": stream, "status": RunStatus.REFUSED, "error": str(exc), "retryable": False}),
         summary_file)
    print(f"sluice: {printable(str(exc))}", file=sys.stderr)
    return 2
