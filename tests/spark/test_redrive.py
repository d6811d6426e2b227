"""Redrive with real Spark: dead letters of a real run, sent again after each kind of fix, exactly once.

The oracle is the json module over the landing file (:func:`oracle`), never the code under test: after each fix, the
stream's table must hold exactly the records that the fixed definition accepts, each once, and the dead-letter table
the others, unmarked, with the reason the fixed definition gives.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import Catalog, load_catalog
from sluice.constants import REDRIVEN_BY_COLUMN, CommitInfo
from sluice.operations.redrive import RedriveError, parse_request, plan_redrive, redrivable
from sluice.paths import Roots
from sluice.storage import runlog
from sluice.storage.delta import commit_properties, open_table, read_table, table_version
from sluice_spark.redrive import run_redrive
from sluice_spark.runner import run_streams
from tests.helpers import roots_in, spark_submit, submit_options_env, write_catalog

pytestmark = pytest.mark.spark

PROJECT = Path(__file__).resolve().parents[2]
RUNNER = PROJECT / "spark_apps" / "redrive_runner.py"
SCHEMA = {"event_id": "string not null", "code": "string not null", "amount": "int"}
FIXED_SCHEMA = {**SCHEMA, "code": "string"}
TRANSFORM = "SELECT event_id, amount, upper(code) AS code_norm FROM source"
FIXED_TRANSFORM = "SELECT event_id, amount, upper(trim(code)) AS code_norm FROM source"
RULES = {"small_amount": {"check": "amount IS NULL OR amount < 100", "on_violation": "quarantine"},
         "known_code": {"check": "code_norm IS NULL OR code_norm IN ('A', 'B')", "on_violation": "quarantine"}}
RELAXED = {**RULES, "small_amount": {"check": "amount IS NULL OR amount < 1000", "on_violation": "quarantine"}}


def event_id(raw: str) -> str | None:
    try:
        return json.loads(raw)["event_id"]
    except json.JSONDecodeError:
        return None


def records() -> list[str]:
    """Lines of five families: good ones; without a code (the first schema requires one); amounts of 100 to 999 (the
    first rule quarantines them) and over 1000 (always); codes with spaces (the first transform keeps them); and
    lines that are no JSON at all."""
    lines = []
    for n in range(40):
        record: dict[str, Any] = {"event_id": f"e{n:03d}", "code": "AB"[n % 2], "amount": n}
        if n % 8 == 1:
            del record["code"]
        elif n % 8 == 2:
            record["amount"] = 100 + n * 10
        elif n % 8 == 3:
            record["amount"] = 1000 + n
        elif n % 8 == 4:
            record["code"] = " a "
        lines.append(json.dumps(record))
    lines += ['{"event_id": "broken", "code": ', "not json at all"]
    return lines


def oracle(lines: list[str], *, schema_fixed: bool, rule_relaxed: bool, transform_fixed: bool) -> list[tuple]:
    """The (event_id, code_norm, amount) rows a definition accepts, from the json module alone."""
    accepted = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "code" not in record and not schema_fixed:
            continue
        code = record.get("code")
        code = None if code is None else (code.strip() if transform_fixed else code).upper()
        if not record["amount"] < (1000 if rule_relaxed else 100) or code not in ("A", "B", None):
            continue
        accepted.append((record["event_id"], code, record["amount"]))
    return sorted(accepted)


def stream(schema: dict[str, str], transform: str, rules: dict[str, Any]) -> dict[str, Any]:
    return {"name": "events", "schedule": "*/5 * * * *", "checkpoint": "bronze/events",
            "source": {"type": "files", "format": "json", "path": "events", "schema": schema,
                       "schema_evolution": "none"},
            "transform": {"sql": transform}, "expectations": rules,
            "sink": {"path": "bronze/events", "engine": "rs"}}


def define(folder: Path, **changes: Any) -> Catalog:
    parts = {"schema": SCHEMA, "transform": TRANSFORM, "rules": RULES, **changes}
    return load_catalog(write_catalog(folder, stream(**parts)))


def bronze(roots: Roots) -> list[tuple]:
    rows = read_table(f"{roots.lake}/bronze/events", ["event_id", "code_norm", "amount"]).to_pylist()
    return sorted((row["event_id"], row["code_norm"], row["amount"]) for row in rows)


def dead_letters(roots: Roots) -> list[dict[str, Any]]:
    return read_table(f"{roots.lake}/bronze/events_dead_letter").to_pylist()


@pytest.fixture
def world(spark: Any, tmp_path: Path) -> tuple[Path, Roots, list[str]]:
    """A stream run over one file under the first definition: good rows and dead letters of every family."""
    lines = records()
    landing = tmp_path / "landing" / "events"
    landing.mkdir(parents=True)
    (landing / "part-1.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    roots = roots_in(tmp_path)
    assert run_streams(spark, define(tmp_path), ["events"], roots).ok
    assert bronze(roots) == oracle(lines, schema_fixed=False, rule_relaxed=False, transform_fixed=False)
    return tmp_path, roots, lines


def redrive(spark: Any, catalog: Catalog, roots: Roots, run_id: str, **params: Any) -> Any:
    request = parse_request({"stream": "events", "dry_run": False, **params}, catalog, run_id=run_id)
    summary = run_redrive(spark, catalog, request, roots)
    assert summary.ok, summary.error
    return summary


def test_each_kind_of_fix_lands_what_it_fixed_once(spark: Any, world: tuple[Path, Roots, list[str]]) -> None:
    folder, roots, lines = world
    dead_before = dead_letters(roots)
    assert len(dead_before) == 5 * 4 + 2
    ingested = {event_id(row["raw_record"]): row["ingested_at"] for row in dead_before
                if event_id(row["raw_record"]) is not None}
    assert len(ingested) == 20

    # A declared field: the records without a code pass once the schema declares it optional.
    catalog = define(folder, schema=FIXED_SCHEMA)
    dry = run_redrive(spark, catalog, parse_request({"stream": "events", "reason": "missing required"}, catalog,
                                                    run_id="dry"), roots)
    assert (dry.dry_run, dry.selected, dry.landed) == (True, 5, 5)
    assert table_version(f"{roots.lake}/bronze/events") == dry.delta_version_before  # a dry run commits nothing
    first = redrive(spark, catalog, roots, "fix-schema", reason="missing required")
    assert (first.selected, first.landed, first.still_dead) == (5, 5, 0)
    assert bronze(roots) == oracle(lines, schema_fixed=True, rule_relaxed=False, transform_fixed=False)

    # A relaxed rule: amounts under 1000 pass; those over it stay, as do the codes with spaces (same reason).
    catalog = define(folder, schema=FIXED_SCHEMA, rules=RELAXED)
    second = redrive(spark, catalog, roots, "relax-rule", reason="broke expectation(s)")
    assert (second.selected, second.landed, second.still_dead, second.reasons_changed) == (15, 5, 10, 0)
    assert bronze(roots) == oracle(lines, schema_fixed=True, rule_relaxed=True, transform_fixed=False)

    # A corrected transform: the record as it arrived goes through the new transform.
    catalog = define(folder, schema=FIXED_SCHEMA, rules=RELAXED, transform=FIXED_TRANSFORM)
    third = redrive(spark, catalog, roots, "fix-transform")
    assert (third.selected, third.landed, third.still_dead) == (12, 5, 7)
    expected = oracle(lines, schema_fixed=True, rule_relaxed=True, transform_fixed=True)
    assert bronze(roots) == expected

    # Lineage: the original file and ingestion time, and the redrive's run id in the commit info.
    landed = read_table(f"{roots.lake}/bronze/events", ["event_id", "_source_file", "_ingested_at"]).to_pylist()
    redriven = {row["event_id"]: row for row in landed if row["event_id"] in ingested}
    assert len(redriven) == 15
    assert {row["_ingested_at"] for row in redriven.values()} == {ingested[key] for key in redriven}
    assert all(row["_source_file"].endswith("part-1.json") for row in redriven.values())
    history = open_table(f"{roots.lake}/bronze/events").history()
    assert [commit_properties(info).get(CommitInfo.REDRIVE_RUN) for info in history
            if CommitInfo.REDRIVE_RUN in commit_properties(info)] == ["fix-transform", "relax-rule", "fix-schema"]

    # The dead letters: 15 landed and are marked; the others stay unmarked with the current reason.
    dead = dead_letters(roots)
    assert len(dead) == len(dead_before)
    marked = sorted(event_id(row["raw_record"]) for row in dead if row[REDRIVEN_BY_COLUMN])
    assert marked == sorted(key for key, *_ in expected if key in ingested)
    left = [row for row in dead if row[REDRIVEN_BY_COLUMN] is None]
    assert sorted(row["reason"] for row in left) == sorted(["broke expectation(s): small_amount"] * 5
                                                          + ["malformed JSON record"] * 2)
    assert redrivable(catalog.get("events"), roots) == [{"reason": "broke expectation(s): small_amount", "rows": 5},
                                                        {"reason": "malformed JSON record", "rows": 2}]

    # A second redrive of the same selection changes nothing, in either table.
    versions = (table_version(f"{roots.lake}/bronze/events"), table_version(f"{roots.lake}/bronze/events_dead_letter"))
    again = redrive(spark, catalog, roots, "again")
    assert (again.selected, again.landed, again.still_dead, again.reasons_changed) == (7, 0, 7, 0)
    assert versions == (table_version(f"{roots.lake}/bronze/events"),
                        table_version(f"{roots.lake}/bronze/events_dead_letter"))
    assert bronze(roots) == expected

    # The run log holds each redrive with its counts; the live stream still runs over the marked table.
    logged = {row["run_id"]: row for row in runlog.runs(roots.lake, "events") if row["kind"] == "redrive"}
    assert (logged["redrive/fix-transform"]["input_rows"], logged["redrive/fix-transform"]["output_rows"]) == (12, 5)
    assert run_streams(spark, catalog, ["events"], roots).ok


def test_a_rerun_of_a_redrive_commits_nothing_twice(spark: Any, world: tuple[Path, Roots, list[str]]) -> None:
    """The same run id again (an Airflow retry) finds both commits and skips them."""
    folder, roots, lines = world
    catalog = define(folder, schema=FIXED_SCHEMA, rules=RELAXED, transform=FIXED_TRANSFORM)
    first = redrive(spark, catalog, roots, "retry")
    assert first.landed == 15
    versions = table_version(f"{roots.lake}/bronze/events"), table_version(f"{roots.lake}/bronze/events_dead_letter")
    rerun = redrive(spark, catalog, roots, "retry")
    assert rerun.replayed == ["sink", "dead_letter"]
    assert versions == (table_version(f"{roots.lake}/bronze/events"),
                        table_version(f"{roots.lake}/bronze/events_dead_letter"))
    assert bronze(roots) == oracle(lines, schema_fixed=True, rule_relaxed=True, transform_fixed=True)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["before_commit", "between_commits", "after_commit"])
def test_sigkill_mid_redrive_then_rerun_lands_each_row_once(spark: Any, world: tuple[Path, Roots, list[str]],
                                                            fault: str) -> None:
    folder, roots, lines = world
    catalog = define(folder, schema=FIXED_SCHEMA, rules=RELAXED, transform=FIXED_TRANSFORM)
    catalog_path = folder / "catalog.yaml"
    faults = folder / "faults"
    faults.mkdir()
    env = {**os.environ, **submit_options_env(), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "SLUICE_FAULT_POINT": fault, "SLUICE_FAULT_DIR": str(faults)}
    command = spark_submit(str(RUNNER), "--catalog", str(catalog_path), "--stream", "events", "--run-id", "killed",
                           *roots.as_args())
    log = folder / "killed.log"
    with log.open("w", encoding="utf-8") as output:
        crashed = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        marker = faults / f"{fault}.reached"
        try:
            while not marker.exists():
                assert crashed.poll() is None, log.read_text(encoding="utf-8")[-3000:]
                time.sleep(0.1)
        finally:
            os.killpg(crashed.pid, signal.SIGKILL)
            crashed.wait(timeout=60)
    assert crashed.returncode == -signal.SIGKILL
    # A new redrive is refused while the killed one is unfinished: both would select its rows.
    with pytest.raises(RedriveError, match=r"^run_id: redrive 'killed' of stream 'events' did not finish"):
        run_redrive(spark, catalog, parse_request({"stream": "events", "dry_run": False}, catalog, run_id="other"),
                    roots)
    # The rerun of the killed redrive (its run id) on the session, through the runner's own code: only the killed
    # run needs an application of its own.
    rerun = run_redrive(spark, catalog, parse_request({"stream": "events", "dry_run": False}, catalog,
                                                      run_id="killed"), roots)
    assert rerun.status == "succeeded", rerun.error
    assert rerun.landed == 15
    assert bronze(roots) == oracle(lines, schema_fixed=True, rule_relaxed=True, transform_fixed=True)
    dead = dead_letters(roots)
    assert sum(1 for row in dead if row[REDRIVEN_BY_COLUMN] == "killed") == 15
    assert plan_redrive(parse_request({"stream": "events"}, catalog, run_id="x"), catalog.get("events"),
                        roots).rows == 7
