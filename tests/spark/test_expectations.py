"""Expectations and a SQL transform in real Spark runs into rs Delta tables, checked against an oracle computed in
Python from the same records (independent of Spark): the counts per rule, the rows in the table, the dead-letter
rows and their reasons; and ``fail``, which commits nothing until the rule changes."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.storage.delta import read_table, table_version
from sluice_spark.runner import run_streams
from tests.helpers import EXAMPLE_RULES, RULES_SCHEMA, events_stream, roots_in, write_catalog

pytestmark = pytest.mark.spark

SCHEMA = RULES_SCHEMA
TRANSFORM = "SELECT *, lower(event_type) AS kind, amount * 100 AS cents FROM source"
RULES = EXAMPLE_RULES
PAST, FUTURE = "2026-11-22T08:00:00Z", "2099-01-01T00:00:00Z"


def record(number: int, **fields: Any) -> dict[str, Any]:
    return {"event_id": f"e{number:03d}", "event_type": "Purchase", "user_id": f"u{number}", "amount": 10.5,
            "currency": "EUR", "event_time": PAST, **fields}


def feed() -> tuple[list[dict[str, Any]], list[str]]:
    """Records breaking each rule alone, several at once, none; and lines the reader rejects before any rule."""
    records = [record(n) for n in range(20)]
    records += [record(100 + n, amount=-1 - n) for n in range(3)]  # quarantine
    records += [record(200 + n, currency="XTS") for n in range(4)]  # warn
    records += [record(210, currency=None), record(211, event_type="Click", amount=None, currency=None)]  # NULL: warn
    records += [record(300 + n, event_time=FUTURE) for n in range(2)]  # drop
    records += [record(400, amount=-5, currency="XTS", event_time=FUTURE)]  # quarantine, naming all three
    records += [record(401, currency="XTS", event_time=FUTURE)]  # drop (and warn)
    rejected = ["{not json", json.dumps(record(500, amount="ten"))]
    return records, rejected


def write_feed(landing: Path, name: str, records: list[dict[str, Any]], rejected: list[str] = ()) -> None:
    landing.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(item) for item in records] + list(rejected)
    (landing / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


def oracle(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the rules do to ``records`` (all parseable), computed in Python."""
    now = dt.datetime.now(dt.timezone.utc)

    def broke(item: dict[str, Any]) -> list[str]:
        amount, time = item["amount"], dt.datetime.fromisoformat(item["event_time"].replace("Z", "+00:00"))
        checks = {"valid_amount": amount is None or amount >= 0,
                  "known_currency": item["currency"] in ("EUR", "USD", "GBP"),  # NULL is not in the list: a violation
                  "not_from_the_future": time <= now + dt.timedelta(hours=1),
                  "has_user": item["user_id"] is not None}
        return [name for name, ok in checks.items() if not ok]

    actions = {name: rule["on_violation"] for name, rule in RULES.items()}
    kept, dropped, quarantined = [], [], {}
    for item in records:
        names = broke(item)
        if any(actions[name] in ("quarantine", "fail") for name in names):
            quarantined[item["event_id"]] = "broke expectation(s): " + ", ".join(names)
        elif any(actions[name] == "drop" for name in names):
            dropped.append(item["event_id"])
        else:
            amount = None if item["amount"] is None else Decimal(str(item["amount"])).quantize(Decimal("0.01"))
            kept.append((item["event_id"], item["event_type"].lower(), None if amount is None else amount * 100))
    violated = {name: sum(name in broke(item) for item in records) for name in RULES}
    return {"kept": sorted(kept), "dropped": len(dropped), "quarantined": quarantined, "violated": violated}


def catalog_with(tmp_path: Path, rules: dict[str, Any], **overrides: Any) -> Any:
    # ``none``: an amount that is no number is the reader's reject, before any rule (rescued, it would be judged).
    stream = events_stream(**{"source": {"type": "files", "format": "json", "path": "events", "schema": SCHEMA,
                                         "schema_evolution": "none"},
                              "transform": {"sql": TRANSFORM}, "expectations": rules,
                              "sink": {"path": "bronze/events", "engine": "rs"}, **overrides})
    return load_catalog(write_catalog(tmp_path, stream))


def preloads(monkeypatch: pytest.MonkeyPatch, module: str) -> list[object]:
    """The sessions ``module`` asks to load Spark's case mappings ahead for (each call goes through)."""
    import importlib

    target, calls = importlib.import_module(module), []
    real = target.preload_case_mappings  # type: ignore[attr-defined]
    monkeypatch.setattr(target, "preload_case_mappings", lambda session: calls.append(session) or real(session))
    return calls


# Each way a batch is written: each takes a batch's good rows and its dead letters, and nothing else.
WRITE_PATHS = pytest.mark.parametrize(("sink", "driver_bytes"), [
    pytest.param({"path": "bronze/events", "engine": "rs"}, "0", id="append-through-the-rs-data-source"),
    pytest.param({"path": "bronze/events", "engine": "rs"}, str(1 << 20), id="append-collected-on-the-driver"),
    pytest.param({"path": "bronze/events", "engine": "rs", "mode": "merge", "keys": ["event_id"],
                  "sequence_by": "event_time"}, "0", id="merge-through-foreachBatch"),
])


@WRITE_PATHS
def test_each_action_matches_a_python_oracle(spark: Any, tmp_path: Path, sink: dict[str, Any], driver_bytes: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_DRIVER_WRITE_MAX_BYTES", driver_bytes)
    records, rejected = feed()
    write_feed(tmp_path / "landing" / "events", "a.json", records, rejected)
    catalog, roots = catalog_with(tmp_path, RULES, sink=sink), roots_in(tmp_path)
    asked = preloads(monkeypatch, "sluice_spark.runner.run")
    [run] = run_streams(spark, catalog, ["events"], roots).streams
    assert asked == [spark]  # the transform lowers event_type
    assert run.status == "succeeded", run.error
    assert run.write_path == ("driver" if driver_bytes != "0" else None)
    expected = oracle(records)
    stream = catalog.get("events")

    table = read_table(stream.sink_path(roots), ["event_id", "kind", "cents"]).to_pylist()
    assert sorted((row["event_id"], row["kind"], row["cents"]) for row in table) == expected["kept"]
    dead = read_table(stream.dead_letter_table_path(roots), ["reason", "raw_record"]).to_pylist()
    quarantined = {json.loads(row["raw_record"])["event_id"]: row["reason"] for row in dead
                   if row["reason"].startswith("broke expectation(s): ")}
    assert quarantined == expected["quarantined"]
    assert quarantined["e400"] == "broke expectation(s): valid_amount, known_currency, not_from_the_future"
    assert len(dead) == len(quarantined) + len(rejected)  # the reader's rejects are not judged again

    assert run.input_rows == len(records) + len(rejected)
    assert run.input_rows == run.output_rows + run.dropped_rows + run.dead_letter_rows
    assert (run.output_rows, run.dropped_rows) == (len(expected["kept"]), expected["dropped"])
    assert {rule["rule"]: (rule["on_violation"], rule["checked"], rule["violated"]) for rule in run.expectations} == {
        name: (RULES[name]["on_violation"], len(records), expected["violated"][name]) for name in RULES}


@WRITE_PATHS
def test_fail_commits_nothing_and_the_batch_runs_once_after_the_rule_changes(
        spark: Any, tmp_path: Path, sink: dict[str, Any], driver_bytes: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_DRIVER_WRITE_MAX_BYTES", driver_bytes)
    landing = tmp_path / "landing" / "events"
    first = [record(n) for n in range(5)]
    second = [record(10 + n) for n in range(4)] + [record(20, user_id=None), record(21, user_id=None)]
    write_feed(landing, "1.json", first)
    write_feed(landing, "2.json", second)
    trigger = {"max_files_per_trigger": 1}
    catalog, roots = catalog_with(tmp_path, RULES, sink=sink, trigger=trigger), roots_in(tmp_path)
    stream = catalog.get("events")

    [failed] = run_streams(spark, catalog, ["events"], roots).streams
    assert failed.write_path == ("driver" if driver_bytes != "0" else None)
    assert failed.status == "failed" and not failed.retryable
    assert "expectation(s) failed in batch 1: 'has_user' (2 rows); nothing of this batch was committed" in failed.error
    assert '"event_id":"e020"' in failed.error
    after_first = {"sink": table_version(stream.sink_path(roots)),
                   "dead": table_version(stream.dead_letter_table_path(roots))}
    assert after_first["sink"] == failed.delta_version_before + 1  # batch 0 only
    assert after_first["dead"] == failed.dead_letter_version_before  # no dead letters in batch 0, no empty commit

    [again] = run_streams(spark, catalog, ["events"], roots).streams  # the same rule stops at the same batch
    assert again.status == "failed" and "'has_user' (2 rows)" in again.error
    assert table_version(stream.sink_path(roots)) == after_first["sink"]

    quarantine = {**RULES, "has_user": {**RULES["has_user"], "on_violation": "quarantine"}}
    catalog = catalog_with(tmp_path, quarantine, sink=sink, trigger=trigger)
    [fixed] = run_streams(spark, catalog, ["events"], roots).streams
    assert fixed.status == "succeeded", fixed.error
    assert (fixed.input_rows, fixed.output_rows, fixed.dead_letter_rows) == (6, 4, 2)
    table = read_table(stream.sink_path(roots), ["event_id"]).to_pylist()
    assert sorted(row["event_id"] for row in table) == sorted(item["event_id"] for item in first + second[:4])
    dead = read_table(stream.dead_letter_table_path(roots), ["reason"]).to_pylist()
    assert [row["reason"] for row in dead] == ["broke expectation(s): has_user"] * 2


def test_rules_run_before_the_stateful_steps(spark: Any, tmp_path: Path) -> None:
    landing = tmp_path / "landing" / "events"
    records = [record(n) for n in range(6)] + [record(1), record(2)]  # two duplicates
    records += [record(100, amount=-3), record(100, amount=-3)]  # quarantined twice: before the dedupe sees them
    records += [record(200, event_time=FUTURE), record(201, event_time=FUTURE)]  # dropped: nor do they move the mark
    write_feed(landing, "a.json", records)
    rules = {"valid_amount": RULES["valid_amount"], "not_from_the_future": RULES["not_from_the_future"]}
    catalog = catalog_with(tmp_path, rules, watermark={"column": "event_time", "delay": "10 minutes"},
                           dedupe={"keys": ["event_id"]})
    roots = roots_in(tmp_path)
    [run] = run_streams(spark, catalog, ["events"], roots).streams
    assert run.status == "succeeded", run.error
    stream = catalog.get("events")
    assert sorted(row["event_id"] for row in read_table(stream.sink_path(roots), ["event_id"]).to_pylist()) == [
        f"e{n:03d}" for n in range(6)]
    assert read_table(stream.dead_letter_table_path(roots)).num_rows == 2
    assert run.expectations == [
        {"rule": "valid_amount", "on_violation": "quarantine", "checked": 12, "violated": 2},
        {"rule": "not_from_the_future", "on_violation": "drop", "checked": 12, "violated": 2}]
    assert run.dropped_rows == 2


def test_a_fan_out_where_never_meets_a_row_a_rule_took_out(spark: Any, tmp_path: Path) -> None:
    """Under ANSI, a fan-out's ``where`` that divides by a column would fail on the row a ``quarantine`` rule is
    there to take out: it is evaluated on good rows only (a dropped row is gone before it)."""
    landing = tmp_path / "landing" / "events"
    write_feed(landing, "a.json", [record(1, amount=10), record(2, amount=200), record(3, amount=0),
                                   record(4, amount=-5)])
    rules = {"nonzero": {"check": "amount <> 0", "on_violation": "quarantine"},
             "valid_amount": {**RULES["valid_amount"], "on_violation": "drop"}}
    catalog = catalog_with(tmp_path, rules, fan_out=[{"path": "silver/small_share", "where": "100 / amount > 1"}])
    roots = roots_in(tmp_path)
    [run] = run_streams(spark, catalog, ["events"], roots).streams
    assert run.status == "succeeded", run.error
    assert (run.input_rows, run.output_rows, run.dropped_rows, run.dead_letter_rows) == (4, 2, 1, 1)
    stream = catalog.get("events")
    [fan_out] = [table.path for table in stream.tables(roots) if table.role.value == "fan_out"]
    assert [row["event_id"] for row in read_table(fan_out, ["event_id"]).to_pylist()] == ["e001"]


def test_many_rules_are_judged_and_counted_each(spark: Any, tmp_path: Path) -> None:
    """65 rules on one stream (more than a 64-bit word's bits): each is judged and counted on its own, and a dead
    letter names every rule it broke, in the catalog's order."""
    landing = tmp_path / "landing" / "events"
    write_feed(landing, "a.json", [record(1), record(2, amount=-3), record(3, event_time=FUTURE), record(4)])
    rules = {f"known_{index}": {"check": "currency IS NOT NULL", "on_violation": "warn"} for index in range(62)}
    rules["valid_amount"] = RULES["valid_amount"]
    rules["not_from_the_future"] = RULES["not_from_the_future"]
    rules["positive_when_known"] = {"check": "amount > 0", "on_violation": "warn"}
    catalog, roots = catalog_with(tmp_path, rules), roots_in(tmp_path)
    [run] = run_streams(spark, catalog, ["events"], roots).streams
    assert run.status == "succeeded", run.error
    assert (run.input_rows, run.output_rows, run.dropped_rows, run.dead_letter_rows) == (4, 2, 1, 1)
    violated = {rule["rule"]: (rule["checked"], rule["violated"]) for rule in run.expectations}
    assert violated == {**{f"known_{index}": (4, 0) for index in range(62)}, "valid_amount": (4, 1),
                        "not_from_the_future": (4, 1), "positive_when_known": (4, 1)}
    [dead] = read_table(catalog.get("events").dead_letter_table_path(roots), ["reason"]).to_pylist()
    assert dead["reason"] == "broke expectation(s): valid_amount, positive_when_known"


def test_a_backfill_judges_its_range_by_the_current_rules(spark: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows ingested before a rule existed are judged by it when their range is backfilled: replaced in the table,
    quarantined or dropped as the rule says, and counted in the backfill's summary."""
    from sluice.operations.backfill import parse_request
    from sluice_spark.backfill import run_backfill

    records = [record(n, amount=n * 10, currency=None if n % 4 == 0 else "EUR") for n in range(12)]
    write_feed(tmp_path / "landing" / "events", "a.json", records)
    settings = {"backfill": {"event_time_column": "event_time"}}
    roots = roots_in(tmp_path)
    assert run_streams(spark, catalog_with(tmp_path, {}, **settings), ["events"], roots).ok
    rules = {"small_amount": {"check": "amount < 80", "on_violation": "quarantine"},
             "has_currency": {"check": "currency IS NOT NULL", "on_violation": "drop"}}
    catalog = catalog_with(tmp_path, rules, **settings)
    ask = parse_request({"stream": "events", "start": "2026-11-22T07:00:00Z", "end": "2026-11-22T09:00:00Z",
                         "mode": "replace"}, catalog, run_id="rejudge")

    asked = preloads(monkeypatch, "sluice_spark.backfill")
    summary = run_backfill(spark, catalog, ask, roots)

    assert summary.ok, summary.error
    assert asked == [spark]  # the transform lowers event_type
    quarantined = [item for item in records if item["amount"] >= 80]
    dropped = [item for item in records if item["amount"] < 80 and item["currency"] is None]
    kept = sorted(item["event_id"] for item in records if item not in quarantined + dropped)
    stream = catalog.get("events")
    assert sorted(row["event_id"] for row in read_table(stream.sink_path(roots), ["event_id"]).to_pylist()) == kept
    dead = read_table(stream.dead_letter_table_path(roots), ["reason"]).to_pylist()
    assert len(dead) == len(quarantined) and all(row["reason"].startswith("broke expectation(s): small_amount")
                                                 for row in dead)
    assert (summary.input_rows, summary.rows_written, summary.rows_dropped, summary.dead_letter_rows) == (
        len(records), len(kept), len(dropped), len(quarantined))
    assert {rule["rule"]: rule["violated"] for rule in summary.expectations} == {
        "small_amount": len(quarantined), "has_currency": sum(item["currency"] is None for item in records)}
    from sluice.storage import runlog

    logged = {row["kind"]: row for row in runlog.runs(roots.lake, "events")}
    assert logged["backfill"]["run_id"] == "backfill/rejudge"
    assert (logged["backfill"]["output_rows"], logged["backfill"]["dropped_rows"],
            logged["backfill"]["dead_letter_rows"]) == (len(kept), len(dropped), len(quarantined))
    assert json.loads(logged["backfill"]["expectations"]) == summary.expectations


def test_rules_and_a_sql_transform_on_a_delta_source(spark: Any, tmp_path: Path) -> None:
    """A silver stream reading a Delta table: the rules judge its rows as they judge a file's."""
    import pyarrow as pa
    from deltalake import write_deltalake

    roots = roots_in(tmp_path)
    upstream = Path(roots.lake, "bronze", "payments")
    amounts = [5.0, -1.0, 12.5, None, -3.0, 40.0]
    write_deltalake(str(upstream), pa.table({"id": pa.array(range(len(amounts)), pa.int64()),
                                             "amount": pa.array(amounts, pa.float64())}))
    stream = {"name": "payments", "source": {"type": "delta", "path": "bronze/payments",
                                             "schema": {"id": "bigint not null", "amount": "double"}},
              "transform": {"sql": "SELECT *, amount * 100 AS cents FROM source"},
              "expectations": {"not_negative": {"check": "amount >= 0", "on_violation": "quarantine",
                                                "on_null": "passes"}},
              "sink": {"path": "silver/payments", "engine": "rs"}, "schedule": "*/5 * * * *"}
    catalog = load_catalog(write_catalog(tmp_path, stream))
    [run] = run_streams(spark, catalog, ["payments"], roots).streams
    assert run.status == "succeeded", run.error
    spec = catalog.get("payments")
    kept = read_table(spec.sink_path(roots), ["id", "cents"]).to_pylist()
    assert sorted((row["id"], row["cents"]) for row in kept) == [(0, 500.0), (2, 1250.0), (3, None), (5, 4000.0)]
    dead = read_table(spec.dead_letter_table_path(roots), ["reason", "raw_record"]).to_pylist()
    assert sorted(json.loads(row["raw_record"])["id"] for row in dead) == [1, 4]
    assert run.expectations == [{"rule": "not_negative", "on_violation": "quarantine", "checked": 6, "violated": 2}]


def test_a_check_that_spark_types_as_no_boolean_is_refused_before_the_query(spark: Any, tmp_path: Path) -> None:
    """sqlglot cannot type every function; Spark's analysis (one for all the rules) catches what it let through, and
    the refusal names the rule that is not a boolean, not its neighbour."""
    from sluice.errors import CatalogError

    write_feed(tmp_path / "landing" / "events", "a.json", [record(1)])
    rules = {"valid_amount": RULES["valid_amount"], "bits": {"check": "bit_count(5)"}}
    catalog, roots = catalog_with(tmp_path, rules), roots_in(tmp_path)
    with pytest.raises(CatalogError, match=r"expectations\.bits\.check: the check 'bit_count\(5\)' gives int, not a "
                                           r"boolean"):
        run_streams(spark, catalog, ["events"], roots)
    assert table_version(catalog.get("events").sink_path(roots)) is None


def test_a_value_that_breaks_an_expression_under_ansi_fails_for_good_and_says_what_to_do(spark: Any,
                                                                                         tmp_path: Path) -> None:
    write_feed(tmp_path / "landing" / "events", "a.json", [record(1), record(2, user_id="not-a-number")])
    rules = {"numeric_user": {"check": "CAST(substr(user_id, 2) AS INT) > 0", "on_violation": "warn"}}
    catalog, roots = catalog_with(tmp_path, rules), roots_in(tmp_path)

    [run] = run_streams(spark, catalog, ["events"], roots).streams

    assert run.status == "failed" and not run.retryable, "the same row fails the same way on every rerun"
    assert "CAST_INVALID_INPUT" in (run.error or "") and "ot-a-number" in (run.error or "")
    assert "try_* functions" in (run.error or "")
    assert table_version(catalog.get("events").sink_path(roots)) in (None, 0), "nothing of the batch is committed"
