"""``make demo``: the whole path once, headless.

It writes a round of demo events into the landing zone, runs the ``ingest_events_bronze`` DAG with
``airflow dags test`` (real Airflow, real spark-submit), reads the Delta tables back with delta-rs, and prints a
summary. The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from sluice.catalog import load_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.paths import Roots
from sluice.summary import RunSummary

STREAM = "events_bronze"


def last_run_summary(dag_id: str) -> RunSummary | None:
    """The run summary that the DAG's newest run pushed to XCom, from the metadata database. (The summary line of
    the driver reaches ``airflow dags test``'s output only inside a log line, which is no longer trusted.)"""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        row = session.scalars(
            select(XComModel).where(XComModel.dag_id == dag_id, XComModel.task_id == "run_stream",
                                    XComModel.key == "return_value").order_by(XComModel.timestamp.desc()).limit(1)
        ).first()
        value = XComModel.deserialize_value(row) if row is not None else None
    return RunSummary.from_dict(value) if isinstance(value, dict) else None


def main(argv: list[str] | None = None) -> int:
    # No options, but --help answers (and runs nothing): the docs site prints every command's help.
    argparse.ArgumentParser(prog="python -m sluice demo", description=__doc__.split("\n\n")[0]).parse_args(argv)
    roots = Roots.from_env()
    stream = load_catalog().get(STREAM)
    produced = DemoProducer(roots.landing, seed=int(time.time())).produce(files=3, lines=200)
    print(f"Produced {produced.event_lines} event lines ({produced.malformed} malformed, {produced.duplicates} "
          f"duplicated, {produced.late} late) in {len(produced.files) - 1} files under {roots.landing}/events")

    command = [str(Path(sys.executable).parent / "airflow"), "dags", "test", f"ingest_{STREAM}"]
    print("Running:", " ".join(command[1:]), flush=True)
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
    elapsed = time.monotonic() - started
    log = result.stdout + result.stderr
    summary = last_run_summary(f"ingest_{STREAM}") if result.returncode == 0 else None
    if result.returncode != 0 or summary is None or not summary.ok:
        print(log[-6000:])
        print(json.dumps({"ok": False, "dag": f"ingest_{STREAM}", "exit_code": result.returncode}))
        return 1

    from sluice.storage.delta import read_table, table_version

    bronze_rows = read_table(stream.sink_path(roots), ["event_id"]).num_rows
    dead_letter = read_table(stream.dead_letter_table_path(roots), ["reason"])
    reasons = Counter(dead_letter.column("reason").to_pylist())
    run = summary.streams[0]
    print(f"DAG run finished in {elapsed:.0f}s: {run.batches} batch(es), {run.input_rows} rows in, {run.output_rows} "
          f"to bronze, {run.dead_letter_rows} to the dead-letter table; Delta v{run.delta_version_before} -> "
          f"v{run.delta_version_after}")
    version = table_version(stream.sink_path(roots))
    print(f"bronze table {stream.sink_path(roots)}: {bronze_rows} rows at version {version}")
    for reason, count in reasons.most_common():
        print(f"  dead letter: {count} x {reason}")
    print(json.dumps({
        "ok": True,
        "dag": f"ingest_{STREAM}",
        "seconds": round(elapsed, 1),
        "run": json.loads(summary.to_json())["streams"][0],
        "bronze_rows": bronze_rows,
        "dead_letter_rows": dead_letter.num_rows,
    }, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
