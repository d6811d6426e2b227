"""Schema drift under each policy (``source.schema_evolution``), end to end with real Spark and Delta tables.

A stream runs, then files arrive with a new top-level field, a new nested field (in a struct, in an array's
element), values of the wrong type (top-level, nested, in a map) and malformed records. The oracles are Python's
json module: under ``rescue`` every value of every input record is either in a typed column or in
``_rescued_data``, or its record is in the dead-letter table; under ``fail_on_new_columns`` the batch commits
nowhere until the catalog changes; under ``none`` the undeclared fields are not read, on purpose.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from sluice.catalog import load_catalog
from sluice.constants import RESCUED_COLUMN
from sluice.storage.delta import read_table
from sluice_spark.runner import run_streams
from tests.helpers import events_stream, roots_in, write_catalog
from tests.spark.test_nested import normalized

pytestmark = pytest.mark.spark

SCHEMA = {
    "id": "string not null",
    "type": "string",
    "actor": "struct<id: bigint, login: string>",
    "payload": "struct<size: int, commits: array<struct<sha: string, message: string>>, labels: map<string, bigint>>",
    "amount": "decimal(12,2)",
    "created_at": "timestamp",
}
COLUMNS = list(SCHEMA)


def record(number: int, **changes: Any) -> dict[str, Any]:
    """A record that fits the schema, with ``changes`` on top."""
    return {"id": f"e{number}", "type": "PushEvent", "actor": {"id": number, "login": f"user{number}"},
            "payload": {"size": 1, "commits": [{"sha": f"{number:04x}", "message": "fix ünïcode ✓"}],
                        "labels": {"bug": number}},
            "amount": 1.5, "created_at": "2026-11-22T08:00:00Z", **changes}


FIRST = [record(number) for number in range(5)]
DRIFTED = [
    record(10, coupon="X1"),  # a new top-level field
    record(11, actor={"id": 11, "login": "user11", "site_admin": True}),  # a new field in a struct
    record(12, payload={"size": "big", "commits": [{"sha": "a1", "verified": False}, {"sha": "b2"}],
                        "labels": {"bug": "high"}}),  # wrong types, nested and in a map; a new field in an array
    record(13, amount="twelve", created_at="yesterday"),  # wrong types at the top level
    record(14, **{"user.agent": "curl/8.5"}),  # a new key that is no identifier
    record(15),  # nothing new
    record(17, payload={"size": 1, "commits": [{"sha": "c3", "message": "m", "signed": True}],
                        "labels": {"bug": 1}}),  # a new field in an array's element, and nothing else
]
BROKEN = ('{"id": "e16", "type": "Push', "[1, 2]")


def stream_spec(policy: str | None = None, schema: dict[str, str] | None = None, **source: Any) -> dict[str, Any]:
    spec = {"type": "files", "format": "json", "path": "github", "schema": schema or SCHEMA, **source}
    if policy is not None:
        spec["schema_evolution"] = policy
    return events_stream("github", source=spec, transform="identity", sink={"path": "bronze/github", "engine": "rs"})


def land(tmp_path: Path, name: str, records: list[dict[str, Any]], broken: tuple[str, ...] = ()) -> Path:
    folder = tmp_path / "landing" / "github"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    lines = [json.dumps(item, ensure_ascii=False) for item in records] + list(broken)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def rendered(path: tuple[str | int, ...]) -> str:
    """How ``_rescued_data`` names a field: ``actor.site_admin``, ``payload.commits[0].verified``, ```user.agent```."""
    text = ""
    for step in path:
        if isinstance(step, int):
            text += f"[{step}]"
            continue
        name = step if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", step) else "`" + step.replace("`", "``") + "`"
        text += f".{name}" if text else name
    return text


def leaves(value: Any, path: tuple[str | int, ...] = ()) -> list[tuple[tuple[str | int, ...], Any]]:
    """Every non-null scalar of a JSON value, with its path."""
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in leaves(item, (*path, key))]
    if isinstance(value, list):
        return [leaf for index, item in enumerate(value) for leaf in leaves(item, (*path, index))]
    return [] if value is None else [(path, value)]


def same(typed: Any, raw: Any) -> bool:
    """A typed value read from Delta equals the JSON value it was parsed from."""
    if isinstance(typed, dt.datetime):
        try:
            parsed = dt.datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
        except ValueError:
            return False
        return typed.replace(tzinfo=None) == parsed.replace(tzinfo=None)
    if isinstance(typed, Decimal):
        return not isinstance(raw, bool) and isinstance(raw, int | float) and typed == Decimal(str(raw))
    if isinstance(typed, bool) or isinstance(raw, bool):
        return typed is raw
    if isinstance(typed, float) and isinstance(raw, int | float):
        return typed == float(raw)
    return typed == raw


def at(value: Any, path: tuple[str | int, ...]) -> tuple[bool, Any]:
    """The value at ``path``, and whether it is there."""
    for step in path:
        if isinstance(step, int):
            if not isinstance(value, list) or step >= len(value):
                return False, None
        elif not isinstance(value, dict) or step not in value:
            return False, None
        value = value[step]
    return True, value


def lost_values(original: dict[str, Any], row: dict[str, Any], columns: list[str] = COLUMNS) -> list[str]:
    """The leaves of ``original`` that are neither in the row's typed columns nor in its rescued data."""
    typed = {name: normalized(row[name]) for name in columns}
    for name, value in typed.items():  # an added column keeps an object or an array as its JSON text
        if isinstance(value, str) and isinstance(original.get(name), dict | list):
            typed[name] = json.loads(value)
    rescued = json.loads(row[RESCUED_COLUMN]) if row[RESCUED_COLUMN] else {}
    lost = []
    for path, value in leaves(original):
        found, kept = at(typed, path)
        if found and kept is not None and same(kept, value):
            continue
        # Rescued at this path or at one of its parents, as it arrived.
        if any(rendered(path[:size]) in rescued and at(rescued[rendered(path[:size])], path[size:]) == (True, value)
               for size in range(1, len(path) + 1)):
            continue
        lost.append(rendered(path))
    return lost


def rows_by_id(path: str) -> dict[str, dict[str, Any]]:
    return {row["id"]: row for row in read_table(path).to_pylist()}


def test_rescue_keeps_every_value_that_the_schema_does_not_read(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, stream_spec()))  # rescue is the default
    stream, roots = catalog.get("github"), roots_in(tmp_path)
    assert stream.source.schema_evolution.value == "rescue"
    land(tmp_path, "first.json", FIRST)
    [first] = run_streams(spark, catalog, ["github"], roots).streams
    assert first.status == "succeeded", first.error
    assert (first.output_rows, first.rescued_rows) == (len(FIRST), 0)

    land(tmp_path, "drifted.json", DRIFTED, BROKEN)
    [run] = run_streams(spark, catalog, ["github"], roots).streams

    assert run.status == "succeeded", run.error
    assert (run.input_rows, run.output_rows, run.dead_letter_rows) == (len(DRIFTED) + 2, len(DRIFTED), 2)
    assert run.rescued_rows == 6
    table = DeltaTable(stream.sink_path(roots))
    assert {field.name: field.type.type for field in table.schema().fields}[RESCUED_COLUMN] == "string"
    rows = rows_by_id(stream.sink_path(roots))
    assert all(rows[item["id"]][RESCUED_COLUMN] is None for item in FIRST)
    rescued = {key: json.loads(rows[key][RESCUED_COLUMN]) for key in ("e10", "e11", "e12", "e13", "e14", "e17")}
    assert rescued == {
        "e10": {"coupon": "X1"},
        "e11": {"actor.site_admin": True},
        "e12": {"payload.size": "big", "payload.commits[0].verified": False, "payload.labels": {"bug": "high"}},
        "e13": {"amount": "twelve", "created_at": "yesterday"},
        "e14": {"`user.agent`": "curl/8.5"},
        "e17": {"payload.commits[0].signed": True},
    }
    assert rows["e15"][RESCUED_COLUMN] is None
    # The typed columns keep what fits: e12's commits are read, its size is not.
    assert normalized(rows["e12"]["payload"]) == {"size": None, "commits": [{"sha": "a1", "message": None},
                                                                            {"sha": "b2", "message": None}],
                                                  "labels": None}
    assert normalized(rows["e11"]["actor"]) == {"id": 11, "login": "user11"}
    # Nothing lost: every input value is typed, rescued, or its record is a dead letter.
    for item in FIRST + DRIFTED:
        assert lost_values(item, rows[item["id"]]) == [], item["id"]
    dead = read_table(stream.dead_letter_table_path(roots)).to_pylist()
    assert sorted(row["raw_record"] for row in dead) == sorted(BROKEN)
    assert {row["reason"] for row in dead} == {"malformed JSON record"}


def test_multi_line_files_are_rescued_record_by_record(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, stream_spec(options={"multiLine": True})))
    stream, roots = catalog.get("github"), roots_in(tmp_path)
    folder = tmp_path / "landing" / "github"
    folder.mkdir(parents=True)
    (folder / "array.json").write_text(json.dumps([record(1), record(2, coupon="X2")], indent=2), encoding="utf-8")
    (folder / "object.json").write_text(json.dumps(record(3, amount="n/a"), indent=2), encoding="utf-8")
    (folder / "broken.json").write_text('{\n  "id": "e4",\n', encoding="utf-8")

    [run] = run_streams(spark, catalog, ["github"], roots).streams

    assert run.status == "succeeded", run.error
    assert (run.input_rows, run.output_rows, run.dead_letter_rows, run.rescued_rows) == (4, 3, 1, 2)
    rows = rows_by_id(stream.sink_path(roots))
    assert {key: row[RESCUED_COLUMN] and json.loads(row[RESCUED_COLUMN]) for key, row in rows.items()} == {
        "e1": None, "e2": {"coupon": "X2"}, "e3": {"amount": "n/a"}}
    assert rows["e1"]["created_at"] == dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)
    [dead] = read_table(stream.dead_letter_table_path(roots)).to_pylist()
    assert dead["raw_record"] == '{\n  "id": "e4",\n'


MERGE = {"mode": "merge", "keys": ["id"], "sequence_by": "created_at"}


@pytest.mark.parametrize(("driver_bytes", "sink"), [("0", {}), (str(64 << 20), {}), ("0", MERGE)],
                         ids=["executors", "driver", "merge"])
def test_fail_on_new_columns_commits_nothing_until_the_catalog_changes(spark: Any, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      driver_bytes: str, sink: dict[str, Any]) -> None:
    monkeypatch.setenv("SLUICE_DRIVER_WRITE_MAX_BYTES", driver_bytes)
    # A merge orders the versions of a key by a column that every row has.
    schema = {**SCHEMA, "created_at": "timestamp not null"} if sink else SCHEMA
    spec = stream_spec("fail_on_new_columns", schema=schema)
    spec["sink"].update(sink)
    catalog = load_catalog(write_catalog(tmp_path, spec))
    stream, roots = catalog.get("github"), roots_in(tmp_path)
    land(tmp_path, "first.json", FIRST)
    [first] = run_streams(spark, catalog, ["github"], roots).streams
    assert first.status == "succeeded", first.error
    tables = (DeltaTable(stream.sink_path(roots)), DeltaTable(stream.dead_letter_table_path(roots)))
    versions = tuple(table.version() for table in tables)

    land(tmp_path, "drifted.json", [DRIFTED[0], DRIFTED[1], DRIFTED[5]])
    for _ in range(2):  # every run stops at the batch
        [run] = run_streams(spark, catalog, ["github"], roots).streams
        assert run.status == "failed" and not run.retryable
        assert "new field(s) not in the declared schema in batch 1: 'actor.site_admin' (1 row), 'coupon' (1 row)" \
            in (run.error or "")
        assert "drifted.json" in (run.error or "") and "nothing of this batch was committed" in (run.error or "")
        assert tuple(DeltaTable(table.table_uri).version() for table in tables) == versions

    # The user declares the top-level field and rescues the nested one: the batch is processed, once.
    spec = stream_spec("rescue", schema={**schema, "coupon": "string"})
    spec["sink"].update(sink)
    catalog = load_catalog(write_catalog(tmp_path, spec))
    [run] = run_streams(spark, catalog, ["github"], roots).streams
    assert run.status == "succeeded", run.error
    assert (run.input_rows, run.output_rows) == (3, 3)
    rows = rows_by_id(stream.sink_path(roots))
    assert len(rows) == len(FIRST) + 3 and rows["e10"]["coupon"] == "X1" and rows["e0"]["coupon"] is None
    assert json.loads(rows["e11"][RESCUED_COLUMN]) == {"actor.site_admin": True}


def test_none_reads_the_declared_columns_and_dead_letters_what_does_not_fit(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, stream_spec("none")))
    stream, roots = catalog.get("github"), roots_in(tmp_path)
    land(tmp_path, "drifted.json", DRIFTED, BROKEN)

    [run] = run_streams(spark, catalog, ["github"], roots).streams

    assert run.status == "succeeded", run.error
    assert run.rescued_rows is None
    assert RESCUED_COLUMN not in [field.name for field in DeltaTable(stream.sink_path(roots)).schema().fields]
    rows = rows_by_id(stream.sink_path(roots))
    assert sorted(rows) == ["e10", "e11", "e14", "e15", "e17"], "the undeclared fields are not read, on purpose"
    dead = read_table(stream.dead_letter_table_path(roots)).to_pylist()
    assert sorted(row["reason"] for row in dead) == [
        "field 'amount': cannot parse 'twelve' as DECIMAL(12,2)", "malformed JSON record", "malformed JSON record",
        "malformed JSON record"]


def test_a_table_written_under_none_gains_the_rescued_column(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, stream_spec("none")))
    stream, roots = catalog.get("github"), roots_in(tmp_path)
    land(tmp_path, "first.json", FIRST)
    assert run_streams(spark, catalog, ["github"], roots).ok

    catalog = load_catalog(write_catalog(tmp_path, stream_spec()))
    land(tmp_path, "drifted.json", [DRIFTED[0]])
    [run] = run_streams(spark, catalog, ["github"], roots).streams

    assert run.status == "succeeded", run.error
    rows = rows_by_id(stream.sink_path(roots))
    assert [rows[f"e{n}"][RESCUED_COLUMN] for n in range(5)] == [None] * 5
    assert json.loads(rows["e10"][RESCUED_COLUMN]) == {"coupon": "X1"}


def test_a_csv_value_that_does_not_fit_is_rescued_as_its_text(spark: Any, tmp_path: Path) -> None:
    spec = events_stream("orders", source={"type": "files", "format": "csv", "path": "orders",
                                           "options": {"header": True},
                                           "schema": {"order_id": "string not null", "amount": "decimal(12,2)",
                                                      "ordered_at": "timestamp"}},
                         transform="identity", sink={"path": "bronze/orders", "engine": "rs"})
    catalog = load_catalog(write_catalog(tmp_path, spec))
    stream, roots = catalog.get("orders"), roots_in(tmp_path)
    folder = tmp_path / "landing" / "orders"
    folder.mkdir(parents=True)
    (folder / "export.csv").write_text("order_id,amount,ordered_at\no1,9.50,2026-11-22T10:00:00Z\n"
                                       "o2,n/a,2026-11-22T10:00:00Z\no3,1.00,soon\n,2.00,2026-11-22T10:00:00Z\n")

    [run] = run_streams(spark, catalog, ["orders"], roots).streams

    assert run.status == "succeeded", run.error
    assert (run.output_rows, run.dead_letter_rows, run.rescued_rows) == (3, 1, 2)
    rows = {row["order_id"]: row for row in read_table(stream.sink_path(roots)).to_pylist()}
    assert rows["o1"]["amount"] == Decimal("9.50") and rows["o1"][RESCUED_COLUMN] is None
    assert rows["o2"]["amount"] is None and json.loads(rows["o2"][RESCUED_COLUMN]) == {"amount": "n/a"}
    assert rows["o3"]["ordered_at"] is None and json.loads(rows["o3"][RESCUED_COLUMN]) == {"ordered_at": "soon"}
    [dead] = read_table(stream.dead_letter_table_path(roots)).to_pylist()
    assert dead["reason"] == "missing required field 'order_id'"


ORDER_SCHEMA = {"order_id": "string not null", "amount": "decimal(12,2)", "currency": "string"}
# CSV exports whose header changes: reordered, widened, narrowed, renamed in case, a quoted name with a comma, a
# repeated name.
CSV_EXPORTS = {
    "a.csv": "order_id,amount,currency\no1,9.50,EUR\no2,n/a,USD\n,1.00,EUR\n",
    "b.csv": "currency,coupon,order_id,amount\nGBP,X1,o3,1.00\nEUR,,o4,2.00\nEUR,X2,o9\n",
    "c.csv": 'ORDER_ID,Amount,"note, free"\no5,3.00,"hello, world"\no6,4.00\n',
    "d.csv": "order_id,amount,amount\no7,1.00,2.00\n",
}


def csv_stream(name: str, path: str, policy: str | None = None, **options: Any) -> dict[str, Any]:
    source: dict[str, Any] = {"type": "files", "format": "csv", "path": path, "options": {"header": True, **options},
                              "schema": ORDER_SCHEMA}
    if policy is not None:
        source["schema_evolution"] = policy
    return events_stream(name, source=source, transform="identity", sink={"path": f"bronze/{name}", "engine": "rs"})


def csv_oracle(files: dict[str, str]) -> tuple[dict[str, tuple[Any, ...]], list[str]]:
    """Python's csv module over the exports, matched by header name without case: the good rows as (amount,
    currency, rescued), and the text of the records that are dead letters."""
    import csv
    import io

    good, dead = {}, []
    for text in files.values():
        header, *records = list(csv.reader(io.StringIO(text)))
        folded = [name.lower() for name in header]
        lines = text.splitlines()[1:]
        for line, fields in zip(lines, records, strict=True):
            by_name = dict(zip(folded, fields, strict=False))
            if len(fields) != len(header) or len(set(folded)) != len(folded):
                # Spark's reader keeps the text of a record it did not split into the declared number of fields;
                # one it did keeps its fields, re-quoted.
                split = len(fields) == len(ORDER_SCHEMA)
                dead.append(",".join(f'"{value}"' for value in fields) if split else line)
                continue
            if not by_name.get("order_id"):  # a record that lacks a required value: its fields, as JSON
                dead.append(json.dumps({"amount": float(by_name["amount"]), "currency": by_name.get("currency")}))
                continue
            rescued = {(name if name.isidentifier() else f"`{name}`"): value
                       for name, value in zip(header, fields, strict=True)
                       if name.lower() not in ORDER_SCHEMA and value}
            try:
                amount = Decimal(by_name["amount"]) if by_name.get("amount") else None
            except ArithmeticError:
                amount, rescued["amount"] = None, by_name["amount"]
            good[by_name["order_id"]] = (amount, by_name.get("currency") or None, rescued or None)
    return good, dead


def test_csv_files_whose_header_changes_are_read_by_name_and_rescue_the_rest(spark: Any, tmp_path: Path) -> None:
    """Under rescue, each CSV file's columns are found by its header: a reordered file lands each value under its
    name, a new column is rescued, a missing one is NULL, and a record with another number of fields than its
    header, or under a header that repeats a name, is a dead letter with its text. Oracle: Python's csv module."""
    catalog = load_catalog(write_catalog(tmp_path, csv_stream("orders", "orders")))
    stream, roots = catalog.get("orders"), roots_in(tmp_path)
    folder = tmp_path / "landing" / "orders"
    folder.mkdir(parents=True)
    for name, text in CSV_EXPORTS.items():
        (folder / name).write_text(text, encoding="utf-8")

    [run] = run_streams(spark, catalog, ["orders"], roots).streams

    assert run.status == "succeeded", run.error
    expected, dead = csv_oracle(CSV_EXPORTS)
    rows = {row["order_id"]: (row["amount"], row["currency"],
                              json.loads(row[RESCUED_COLUMN]) if row[RESCUED_COLUMN] else None)
            for row in read_table(stream.sink_path(roots)).to_pylist()}
    assert rows == expected
    assert rows["o3"] == (Decimal("1.00"), "GBP", {"coupon": "X1"}) and rows["o5"][2] == {
        "`note, free`": "hello, world"}
    letters = read_table(stream.dead_letter_table_path(roots)).to_pylist()
    as_json = {row["raw_record"]: json.loads(row["raw_record"]) for row in letters
               if row["raw_record"].startswith("{")}
    assert sorted(json.dumps({key: value for key, value in as_json.get(row["raw_record"], {}).items()
                              if key in ORDER_SCHEMA}) if row["raw_record"] in as_json else row["raw_record"]
                  for row in letters) == sorted(dead)
    reasons = {row["raw_record"]: row["reason"] for row in letters}
    assert reasons["o6,4.00"] == reasons['"o7","1.00","2.00"'] == reasons['"EUR","X2","o9"'] == "malformed CSV record"
    assert [reasons[raw] for raw in as_json] == ["missing required field 'order_id'"]
    assert (run.input_rows, run.output_rows, run.dead_letter_rows, run.rescued_rows) == (9, 5, 4, 3)


def test_csv_read_by_header_reads_what_sparks_reader_reads(spark: Any, tmp_path: Path) -> None:
    """Spark's own reader (schema_evolution: none) over an export, and the by-header reader over the same records
    with their columns reordered and a column added: the same values, with the stream's quoting, escapes, comments,
    multi-line values, whitespace and nullValue. Every field is split by Spark's parser on both sides."""
    options = {"sep": ";", "quote": "'", "escape": "\\", "comment": "#", "multiLine": True, "nullValue": "NA",
               "ignoreLeadingWhiteSpace": True, "timestampFormat": "yyyy-MM-dd HH:mm"}
    schema = {"order_id": "string not null", "amount": "decimal(12,2)", "note": "string", "at": "timestamp"}
    records = [("o1", "9.50", "'two\nlines; one value'", "2026-11-22 10:00"),
               ("o2", "NA", "'it\\'s quoted'", "2026-11-22 10:01"),
               ("o3", "  1.25", "", "NA"),
               ("o4", "x", "'NA'", "later"),
               ("o5", "2.00", "' padded '", "2026-11-22 10:02"),
               ("o6", "3.00", "'   '", "2026-11-22 10:03")]
    original = "order_id;amount;note;at\n# exported by the shop\n" + "".join(
        ";".join(fields) + "\n" for fields in records)
    moved = "at;extra;note;order_id;amount\n" + "".join(
        ";".join([at, f"e{index}", note, order_id, amount]) + "\n"
        for index, (order_id, amount, note, at) in enumerate(records))
    specs = []
    for name, policy, text in (("plain", "none", original), ("same", "rescue", original), ("moved", "rescue", moved)):
        spec = csv_stream(name, name, policy, **options)
        spec["source"]["schema"] = schema
        specs.append(spec)
        (tmp_path / "landing" / name).mkdir(parents=True)
        (tmp_path / "landing" / name / "export.csv").write_text(text, encoding="utf-8")
    catalog = load_catalog(write_catalog(tmp_path, *specs))
    roots = roots_in(tmp_path)

    runs = run_streams(spark, catalog, ["plain", "same", "moved"], roots).streams

    assert [run.status for run in runs] == ["succeeded"] * 3, [run.error for run in runs]
    plain, same, moved_rows = (
        {row["order_id"]: row for row in read_table(catalog.get(name).sink_path(roots)).to_pylist()}
        for name in ("plain", "same", "moved"))
    # The header as declared: Spark's split, typed again by the by-header side, equals Spark's reader.
    assert sorted(same) == ["o1", "o2", "o3", "o4", "o5", "o6"]
    for order_id, row in plain.items():
        assert {key: same[order_id][key] for key in schema} == {key: row[key] for key in schema}, order_id
    # o4's values fit no type: a dead letter under none, rescued by the by-header side.
    assert sorted(plain) == ["o1", "o2", "o3", "o5", "o6"] and sorted(moved_rows) == sorted(same)
    assert plain["o5"]["note"] == " padded ", "a quoted value keeps its spaces"
    for order_id, row in plain.items():
        assert {key: moved_rows[order_id][key] for key in schema} == {key: row[key] for key in schema}, order_id
    assert plain["o1"]["note"] == "two\nlines; one value" and plain["o2"]["note"] == "it's quoted"
    assert plain["o2"]["amount"] is None and plain["o3"]["amount"] == Decimal("1.25") and plain["o3"]["at"] is None
    assert (moved_rows["o4"]["amount"], moved_rows["o4"]["note"], moved_rows["o4"]["at"]) == (None, None, None)
    assert json.loads(moved_rows["o4"][RESCUED_COLUMN]) == {"extra": "e3", "amount": "x", "at": "later"}
    assert json.loads(moved_rows["o1"][RESCUED_COLUMN]) == {"extra": "e0"}


def test_csv_by_header_reads_compressed_tab_separated_files_and_names_an_unnamed_column(spark: Any,
                                                                                        tmp_path: Path) -> None:
    """A gzipped export separated by tabs (``sep`` written ``\\t``, as Spark reads it), whose header leaves a column
    unnamed: the header is read through the codec, and the unnamed column is rescued as ``_c<i>``, Spark's name."""
    import gzip

    catalog = load_catalog(write_catalog(tmp_path, csv_stream("orders", "orders", sep="\\t")))
    stream, roots = catalog.get("orders"), roots_in(tmp_path)
    folder = tmp_path / "landing" / "orders"
    folder.mkdir(parents=True)
    (folder / "export.tsv.gz").write_bytes(gzip.compress(b"currency\tamount\t\torder_id\nEUR\t1.00\tx\to1\n"))

    [run] = run_streams(spark, catalog, ["orders"], roots).streams

    assert run.status == "succeeded", run.error
    [row] = read_table(stream.sink_path(roots)).to_pylist()
    assert (row["order_id"], row["amount"], row["currency"]) == ("o1", Decimal("1.00"), "EUR")
    assert json.loads(row[RESCUED_COLUMN]) == {"_c2": "x"}


def test_csv_new_columns_widen_the_table_or_stop_the_batch_by_policy(spark: Any, tmp_path: Path) -> None:
    """A CSV file whose header names a new column: add_new_columns adds it (as text) in the commit of the batch that
    brought it; fail_on_new_columns stops that batch, naming the column and the file, and commits nothing."""
    specs = [csv_stream("added", "orders", "add_new_columns"), csv_stream("failing", "orders", "fail_on_new_columns")]
    catalog = load_catalog(write_catalog(tmp_path, *specs))
    roots = roots_in(tmp_path)
    folder = tmp_path / "landing" / "orders"
    folder.mkdir(parents=True)
    (folder / "a.csv").write_text(CSV_EXPORTS["a.csv"], encoding="utf-8")
    assert [run.status for run in run_streams(spark, catalog, ["added", "failing"], roots).streams] == [
        "succeeded", "succeeded"]
    versions = {name: DeltaTable(catalog.get(name).sink_path(roots)).version() for name in ("added", "failing")}
    (folder / "b.csv").write_text("currency,coupon,order_id,amount,Bad Name\nGBP,X1,o3,1.00,q\nEUR,,o4,n/a,\n",
                                  encoding="utf-8")

    added, failing = run_streams(spark, catalog, ["added", "failing"], roots).streams

    assert added.status == "succeeded", added.error
    assert added.added_columns == {"coupon": "STRING"}
    table = DeltaTable(catalog.get("added").sink_path(roots))
    assert table.version() == versions["added"] + 1, "the column and the rows are one commit"
    rows = {row["order_id"]: row for row in read_table(catalog.get("added").sink_path(roots)).to_pylist()}
    assert (rows["o3"]["coupon"], rows["o3"]["currency"], rows["o4"]["coupon"], rows["o1"]["coupon"]) == (
        "X1", "GBP", None, None)
    assert json.loads(rows["o3"][RESCUED_COLUMN]) == {"`Bad Name`": "q"}, "a name no column may take is rescued"
    assert json.loads(rows["o4"][RESCUED_COLUMN]) == {"amount": "n/a"}
    assert failing.status == "failed" and not failing.retryable
    # Every row under the new header stops the batch, with or without a value in the new column.
    assert "'coupon' (2 rows)" in (failing.error or "") and "b.csv" in (failing.error or "")
    assert DeltaTable(catalog.get("failing").sink_path(roots)).version() == versions["failing"]


ADDED = [record(20, coupon="X1", score=1, vip=True, meta={"a": [1, 2]}),
         record(21, score=2.5, actor={"id": 21, "login": "user21", "site_admin": True}),
         record(22, amount="twelve", **{"user.agent": "curl/8.5"})]


def test_add_new_columns_widens_the_table_in_the_commit_of_the_batch_that_brought_them(spark: Any,
                                                                                      tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, stream_spec("add_new_columns")))
    stream, roots = catalog.get("github"), roots_in(tmp_path)
    land(tmp_path, "first.json", FIRST)
    [first] = run_streams(spark, catalog, ["github"], roots).streams
    assert first.status == "succeeded", first.error
    assert first.added_columns == {}
    before = DeltaTable(stream.sink_path(roots)).version()

    land(tmp_path, "added.json", ADDED)
    [run] = run_streams(spark, catalog, ["github"], roots).streams

    assert run.status == "succeeded", run.error
    assert run.added_columns == {"coupon": "STRING", "meta": "STRING", "score": "DOUBLE", "vip": "BOOLEAN"}
    assert (run.output_rows, run.rescued_rows) == (3, 2)
    table = DeltaTable(stream.sink_path(roots))
    assert table.version() == before + 1, "the columns and the rows are one commit"
    fields = {field["name"]: field for field in json.loads(table.schema().to_json())["fields"]}
    assert {name: fields[name]["type"] for name in run.added_columns} == {
        "coupon": "string", "meta": "string", "score": "double", "vip": "boolean"}
    assert all("sluice.addedBy" in fields[name]["metadata"] for name in run.added_columns)
    assert "coupon" not in json.loads(DeltaTable(stream.sink_path(roots), version=before).schema().to_json())
    rows = rows_by_id(stream.sink_path(roots))
    assert (rows["e20"]["coupon"], rows["e20"]["score"], rows["e20"]["vip"], json.loads(rows["e20"]["meta"])) == (
        "X1", 1.0, True, {"a": [1, 2]})
    assert rows["e21"]["score"] == 2.5 and rows["e0"]["coupon"] is None
    assert json.loads(rows["e21"][RESCUED_COLUMN]) == {"actor.site_admin": True}
    assert json.loads(rows["e22"][RESCUED_COLUMN]) == {"amount": "twelve", "`user.agent`": "curl/8.5"}
    columns = [*COLUMNS, *run.added_columns]
    for item in FIRST + ADDED:
        assert lost_values(item, rows[item["id"]], columns) == [], item["id"]

    # The next run reads the added columns as declared ones: nothing new, nothing rescued.
    land(tmp_path, "more.json", [record(23, coupon="X2", score=3)])
    [again] = run_streams(spark, catalog, ["github"], roots).streams
    assert again.status == "succeeded", again.error
    assert (again.added_columns, again.rescued_rows) == ({}, 0)
    row = rows_by_id(stream.sink_path(roots))["e23"]
    assert (row["coupon"], row["score"], row[RESCUED_COLUMN]) == ("X2", 3.0, None)

    # A new field that arrives as two kinds of value stops its batch, naming it.
    version = DeltaTable(stream.sink_path(roots)).version()
    land(tmp_path, "mixed.json", [record(24, odd=1), record(25, odd="x")])
    [mixed] = run_streams(spark, catalog, ["github"], roots).streams
    assert mixed.status == "failed" and not mixed.retryable
    assert "the new field 'odd' arrives as BIGINT, STRING" in (mixed.error or "")
    assert DeltaTable(stream.sink_path(roots)).version() == version


@pytest.mark.slow
def test_a_sigkill_in_an_add_new_columns_batch_then_a_rerun_gives_the_exact_table_and_schema(tmp_path: Path) -> None:
    from tests.spark.test_crash_recovery import EXECUTORS, kill_at_then_rerun

    spec = stream_spec("add_new_columns")
    spec["name"], spec["trigger"] = "events", {"max_files_per_trigger": 1}
    catalog_path = write_catalog(tmp_path, spec)
    stream, roots = load_catalog(catalog_path).get("events"), roots_in(tmp_path)
    land(tmp_path, "a-first.json", FIRST)
    land(tmp_path, "b-added.json", ADDED, BROKEN)
    # Batch 1 committed to the table (its new columns with it), not yet to the dead-letter table.
    kill_at_then_rerun(catalog_path, roots, "between_commits:1", tmp_path / "faults", write_path=EXECUTORS)

    table = DeltaTable(stream.sink_path(roots))
    fields = {field["name"]: field["type"] for field in json.loads(table.schema().to_json())["fields"]}
    assert {name: fields.get(name) for name in ("coupon", "meta", "score", "vip")} == {
        "coupon": "string", "meta": "string", "score": "double", "vip": "boolean"}
    rows = rows_by_id(stream.sink_path(roots))
    assert sorted(rows) == sorted(item["id"] for item in FIRST + ADDED)
    assert rows["e20"]["coupon"] == "X1" and rows["e21"]["score"] == 2.5
    dead = read_table(stream.dead_letter_table_path(roots)).to_pylist()
    assert sorted(row["raw_record"] for row in dead) == sorted(BROKEN)


def test_add_new_columns_rescues_what_cannot_become_a_column(spark: Any, tmp_path: Path) -> None:
    """A leading '_', a declared name in another case, a value that does not fit the column an earlier batch of the
    run added (text, or a fraction in a whole-number column): kept in _rescued_data. A number past 64 bits keeps its
    digits as text."""
    import os

    spec = stream_spec("add_new_columns")
    spec["trigger"] = {"max_files_per_trigger": 1}
    catalog = load_catalog(write_catalog(tmp_path, spec))
    stream, roots = catalog.get("github"), roots_in(tmp_path)
    first = land(tmp_path, "a.json", [record(30, _id="x1", Amount=5, big=12345678901234567890, rank=1)])
    second = land(tmp_path, "b.json", [record(31, rank="first", Rank=2), record(32, rank=2.5)])
    os.utime(first, (1_700_000_000, 1_700_000_000))
    os.utime(second, (1_700_000_100, 1_700_000_100))

    [run] = run_streams(spark, catalog, ["github"], roots).streams

    assert run.status == "succeeded", run.error
    assert (run.batches, run.added_columns) == (2, {"big": "STRING", "rank": "BIGINT"})
    rows = rows_by_id(stream.sink_path(roots))
    assert (rows["e30"]["big"], rows["e30"]["rank"]) == ("12345678901234567890", 1)
    assert json.loads(rows["e30"][RESCUED_COLUMN]) == {"_id": "x1", "Amount": 5}
    assert rows["e31"]["rank"] is None
    assert json.loads(rows["e31"][RESCUED_COLUMN]) == {"rank": "first", "Rank": 2}
    assert rows["e32"]["rank"] is None and json.loads(rows["e32"][RESCUED_COLUMN]) == {"rank": 2.5}, "not truncated"


# -- A Delta source whose upstream table gains columns --------------------------------------------------------------

UPSTREAM_SCHEMA = {"id": "string not null", "amount": "double", "code": "int", "ratio": "double"}
GAINED = {"coupon": pa.string(), "score": pa.int32(), "seen": pa.timestamp("us", tz="UTC"),
          "meta": pa.struct([("a", pa.int64()), ("tags", pa.list_(pa.string()))]), "user agent": pa.string()}


def upstream_rows(first: int, count: int, *, gained: bool) -> pa.Table:
    """Rows of the upstream table; with ``gained``, with values in the columns it gained (NULL in one row of
    three), and ``code`` as text, one value in four of which no int can hold."""
    ids = range(first, first + count)
    columns: dict[str, pa.Array] = {
        "id": pa.array([f"u{i}" for i in ids]), "amount": pa.array([i / 4 for i in ids]),
        "code": pa.array([("x" if i % 4 == 0 else str(i)) if gained else str(i) for i in ids]),
        "ratio": pa.array([i / 2 for i in ids]),
    }
    if gained:
        def value(i: int, name: str) -> Any:
            if i % 3 == 0:
                return None
            return {"coupon": f"C{i}", "score": i,
                    "seen": dt.datetime(2026, 11, 22, i % 24, 0, 0, i, tzinfo=dt.timezone.utc),
                    "meta": {"a": i, "tags": ["x", str(i)]}, "user agent": f"curl/{i}"}[name]
        columns.update({name: pa.array([value(i, name) for i in ids], kind) for name, kind in GAINED.items()})
    return pa.table(columns)


def delta_stream(policy: str | None, schema: dict[str, str] | None = None) -> dict[str, Any]:
    source: dict[str, Any] = {"type": "delta", "path": "upstream", "schema": schema or UPSTREAM_SCHEMA}
    if policy is not None:
        source["schema_evolution"] = policy
    return events_stream("downstream", source=source, transform="identity",
                         sink={"path": "silver/downstream", "engine": "rs"}, checkpoint="silver/downstream")


def gain_columns(tmp_path: Path, spark: Any, policy: str | None,
                 schema: dict[str, str] | None = None) -> tuple[Any, Any, Any]:
    """The upstream table's version 0, a run, then version 1 (old columns) and version 2 (gained columns): the
    second run reads both, the first with files that lack the gained columns. Returns the catalog, the roots and
    the second run's summary."""
    from deltalake import write_deltalake

    upstream = str(tmp_path / "lake" / "upstream")
    write_deltalake(upstream, upstream_rows(0, 6, gained=False))
    catalog = load_catalog(write_catalog(tmp_path, delta_stream(policy, schema)))
    roots = roots_in(tmp_path)
    [first] = run_streams(spark, catalog, ["downstream"], roots).streams
    assert first.status == "succeeded", first.error
    write_deltalake(upstream, upstream_rows(6, 6, gained=False), mode="append")
    write_deltalake(upstream, upstream_rows(12, 12, gained=True), mode="append", schema_mode="merge")
    [second] = run_streams(spark, catalog, ["downstream"], roots).streams
    return catalog, roots, second


def upstream_oracle(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """The upstream table's rows by id, as delta-rs reads them: the oracle."""
    table = DeltaTable(str(tmp_path / "lake" / "upstream")).to_pyarrow_table()
    return {row["id"]: row for row in table.to_pylist()}


def json_value(value: Any) -> Any:
    """A value as Spark's to_json writes it and Python's json reads it back."""
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, dict):
        return {key: json_value(item) for key, item in value.items() if item is not None}
    return value


def test_a_delta_source_rescues_the_columns_its_upstream_gained(spark: Any, tmp_path: Path) -> None:
    """...and the values a declared type cannot hold: text in an int, a fraction in an int (a cast would lose it)."""
    catalog, roots, run = gain_columns(tmp_path, spark, None, {**UPSTREAM_SCHEMA, "ratio": "int"})

    assert run.status == "succeeded", run.error
    expected = upstream_oracle(tmp_path)
    rows = rows_by_id(catalog.get("downstream").sink_path(roots))
    assert sorted(rows) == sorted(expected)
    for key, source in expected.items():
        row = rows[key]
        rescued = json.loads(row[RESCUED_COLUMN]) if row[RESCUED_COLUMN] else {}
        code_fits, ratio_fits = source["code"] != "x", source["ratio"] == int(source["ratio"])
        assert (row["amount"], row["code"]) == (source["amount"], int(source["code"]) if code_fits else None), key
        assert row["ratio"] == (int(source["ratio"]) if ratio_fits else None), key
        wanted = {("`user agent`" if name == "user agent" else name): json_value(source[name])
                  for name in GAINED if source.get(name) is not None}
        if not code_fits:
            wanted["code"] = "x"
        if not ratio_fits:
            wanted["ratio"] = source["ratio"]
        assert rescued == wanted, key
    assert run.rescued_rows == sum(1 for key, row in rows.items() if row[RESCUED_COLUMN] and int(key[1:]) >= 6)
    assert DeltaTable(catalog.get("downstream").dead_letter_table_path(roots)).to_pyarrow_table().num_rows == 0


def test_a_delta_source_under_fail_on_new_columns_names_them_and_commits_nothing(spark: Any,
                                                                                tmp_path: Path) -> None:
    catalog, roots, run = gain_columns(tmp_path, spark, "fail_on_new_columns", {**UPSTREAM_SCHEMA, "code": "string"})

    assert run.status == "failed" and not run.retryable
    for name in ("coupon", "score", "seen", "meta", "`user agent`"):
        assert f"'{name}'" in (run.error or ""), name
    table = DeltaTable(catalog.get("downstream").sink_path(roots))
    assert table.version() == 1 and table.to_pyarrow_table().num_rows == 6, "nothing of the run is committed"

    # Declared, the columns are read: the rerun reads the versions the failed run did not commit, once.
    declared = {**UPSTREAM_SCHEMA, "code": "string", "coupon": "string", "score": "int", "seen": "timestamp",
                "meta": "struct<a: bigint, tags: array<string>>", "`user agent`": "string"}
    catalog = load_catalog(write_catalog(tmp_path, delta_stream("fail_on_new_columns", declared)))
    [again] = run_streams(spark, catalog, ["downstream"], roots).streams
    assert again.status == "succeeded", again.error
    rows = rows_by_id(catalog.get("downstream").sink_path(roots))
    expected = upstream_oracle(tmp_path)
    assert sorted(rows) == sorted(expected)
    for key, source in expected.items():
        assert {name: rows[key][name] for name in source} == source, key


def test_a_delta_source_under_add_new_columns_adds_them_with_their_upstream_types(spark: Any,
                                                                                 tmp_path: Path) -> None:
    catalog, roots, run = gain_columns(tmp_path, spark, "add_new_columns", {**UPSTREAM_SCHEMA, "code": "string"})

    assert run.status == "succeeded", run.error
    assert run.added_columns == {"coupon": "STRING", "score": "INT", "seen": "TIMESTAMP",
                                 "meta": "STRUCT<`a`: BIGINT, `tags`: ARRAY<STRING>>"}
    stream = catalog.get("downstream")
    fields = {field.name: field.type for field in pa.schema(DeltaTable(stream.sink_path(roots)).schema().to_arrow())}
    assert {name: str(fields[name]) for name in run.added_columns} == {
        "coupon": "string", "score": "int32", "seen": "timestamp[us, tz=UTC]",
        "meta": "struct<a: int64, tags: list<element: string>>"}
    rows = rows_by_id(stream.sink_path(roots))
    expected = upstream_oracle(tmp_path)
    for key, source in expected.items():
        row = rows[key]
        assert {name: row[name] for name in ("id", "amount", "code", *run.added_columns)} == {
            name: source.get(name) for name in ("id", "amount", "code", *run.added_columns)}, key
        rescued = json.loads(row[RESCUED_COLUMN]) if row[RESCUED_COLUMN] else {}
        assert rescued == ({"`user agent`": source["user agent"]} if source.get("user agent") else {}), key

    # The next run reads the added columns as declared ones.
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "lake" / "upstream"), upstream_rows(24, 3, gained=True), mode="append")
    [again] = run_streams(spark, catalog, ["downstream"], roots).streams
    assert again.status == "succeeded", again.error
    assert again.added_columns == {}
    assert rows_by_id(stream.sink_path(roots))["u25"]["seen"] == upstream_oracle(tmp_path)["u25"]["seen"]


def test_a_delta_source_under_none_reads_the_declared_columns_only(spark: Any, tmp_path: Path) -> None:
    catalog, roots, run = gain_columns(tmp_path, spark, "none", {**UPSTREAM_SCHEMA, "code": "string"})

    assert run.status == "succeeded", run.error
    table = DeltaTable(catalog.get("downstream").sink_path(roots)).to_pyarrow_table()
    assert not set(GAINED) & set(table.column_names) and RESCUED_COLUMN not in table.column_names
    assert sorted(table.column("id").to_pylist()) == sorted(upstream_oracle(tmp_path))


# -- Parquet files whose schema grows --------------------------------------------------------------------------------

PARQUET_SCHEMA = {"id": "string not null", "actor": "struct<id: bigint, login: string>",
                  "payload": "struct<size: int, commits: array<struct<sha: string>>, labels: map<string, bigint>>",
                  "amount": "decimal(12,2)", "created_at": "timestamp"}
ACTOR = pa.struct([("id", pa.int64()), ("login", pa.string())])
COMMITS = pa.list_(pa.struct([("sha", pa.string())]))
PAYLOAD = pa.struct([("size", pa.int32()), ("commits", COMMITS), ("labels", pa.map_(pa.string(), pa.int64()))])
AT = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)


def parquet_rows(first: int, count: int) -> dict[str, list[Any]]:
    ids = range(first, first + count)
    return {"id": [f"p{i}" for i in ids], "actor": [{"id": i, "login": f"user{i}"} for i in ids],
            "payload": [{"size": i, "commits": [{"sha": f"{i:04x}"}], "labels": [("bug", i)]} for i in ids],
            "amount": [Decimal(i) / 4 for i in ids], "created_at": [AT + dt.timedelta(hours=i) for i in ids]}


def write_parquet(tmp_path: Path, name: str, table: pa.Table) -> Path:
    folder = tmp_path / "landing" / "github"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / name)
    return folder / name


def fitting_parquet(first: int, count: int) -> pa.Table:
    return pa.table(parquet_rows(first, count), schema=pa.schema([
        ("id", pa.string()), ("actor", ACTOR), ("payload", PAYLOAD), ("amount", pa.decimal128(12, 2)),
        ("created_at", pa.timestamp("us", tz="UTC"))]))


def drifted_parquet() -> pa.Table:
    """Six rows whose file grew: new top-level columns (one that is no identifier), a new field in a struct and in an
    array's element, amounts as text (two that no decimal holds), nanosecond timestamps, an actor id past 64 bits."""
    rows = parquet_rows(10, 6)
    ids = range(10, 16)
    return pa.table({
        "id": rows["id"],
        "actor": pa.array([{"id": (2**63 + 5) if i == 12 else i, "login": f"user{i}", "site_admin": i % 2 == 0}
                           for i in ids], pa.struct([("id", pa.uint64()), ("login", pa.string()),
                                                     ("site_admin", pa.bool_())])),
        "payload": pa.array([{"size": i, "commits": [{"sha": "a1", "verified": i == 11}, {"sha": "b2"}],
                              "labels": [("bug", i)]} for i in ids],
                            pa.struct([("size", pa.int32()),
                                       ("commits", pa.list_(pa.struct([("sha", pa.string()),
                                                                       ("verified", pa.bool_())]))),
                                       ("labels", pa.map_(pa.string(), pa.int64()))])),
        "amount": ["twelve" if i == 13 else "n/a" if i == 14 else f"{i}.50" for i in ids],
        "created_at": pa.array([AT + dt.timedelta(hours=i) for i in ids], pa.timestamp("ns", tz="UTC")),
        "coupon": [f"C{i}" if i % 3 else None for i in ids],
        "score": pa.array([i for i in ids], pa.int32()),
        "user.agent": [f"curl/{i}" for i in ids],
    })


def parquet_stream(policy: str | None) -> dict[str, Any]:
    return stream_spec(policy, PARQUET_SCHEMA, format="parquet")


def test_parquet_files_whose_schema_grows_are_rescued_value_by_value(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, parquet_stream(None)))
    stream, roots = catalog.get("github"), roots_in(tmp_path)
    assert stream.source.schema_evolution.value == "rescue"
    write_parquet(tmp_path, "a-first.parquet", fitting_parquet(0, 4))
    [first] = run_streams(spark, catalog, ["github"], roots).streams
    assert first.status == "succeeded", first.error
    assert (first.input_rows, first.output_rows, first.rescued_rows) == (4, 4, 0)

    write_parquet(tmp_path, "b-drifted.parquet", drifted_parquet())
    (tmp_path / "landing" / "github" / "c-broken.parquet").write_text("id,amount\np1,2\n")  # a CSV, misnamed
    [run] = run_streams(spark, catalog, ["github"], roots).streams

    assert run.status == "succeeded", run.error
    assert (run.input_rows, run.output_rows, run.dead_letter_rows) == (7, 6, 1)
    rows = rows_by_id(stream.sink_path(roots))
    assert sorted(rows) == sorted(f"p{i}" for i in (0, 1, 2, 3, 10, 11, 12, 13, 14, 15))
    for i in range(10, 16):
        row = rows[f"p{i}"]
        rescued = json.loads(row[RESCUED_COLUMN])
        wanted: dict[str, Any] = {"actor.site_admin": i % 2 == 0, "payload.commits[0].verified": i == 11,
                                  "score": i, "`user.agent`": f"curl/{i}"}
        if i % 3:
            wanted["coupon"] = f"C{i}"
        if i == 12:
            wanted["actor.id"] = 2**63 + 5
        if i in (13, 14):
            wanted["amount"] = "twelve" if i == 13 else "n/a"
        assert rescued == wanted, i
        assert row["actor"]["id"] == (None if i == 12 else i) and row["actor"]["login"] == f"user{i}"
        assert row["payload"]["commits"] == [{"sha": "a1"}, {"sha": "b2"}]
        assert row["amount"] == (None if i in (13, 14) else Decimal(f"{i}.50"))
        assert row["created_at"] == AT + dt.timedelta(hours=i)
    assert run.rescued_rows == 6
    [dead] = read_table(stream.dead_letter_table_path(roots)).to_pylist()
    assert dead["reason"].startswith("unreadable Parquet file: ") and dead["source_file"].endswith("c-broken.parquet")


def test_parquet_files_under_fail_on_new_columns_name_the_fields_and_commit_nothing(spark: Any,
                                                                                   tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, parquet_stream("fail_on_new_columns")))
    stream, roots = catalog.get("github"), roots_in(tmp_path)
    write_parquet(tmp_path, "a-first.parquet", fitting_parquet(0, 4))
    [first] = run_streams(spark, catalog, ["github"], roots).streams
    assert first.status == "succeeded", first.error
    version = DeltaTable(stream.sink_path(roots)).version()

    write_parquet(tmp_path, "b-drifted.parquet", drifted_parquet())
    [run] = run_streams(spark, catalog, ["github"], roots).streams

    assert run.status == "failed" and not run.retryable
    for path in ("coupon", "score", "`user.agent`", "actor.site_admin", "payload.commits[0].verified"):
        assert f"'{path}'" in (run.error or ""), path
    assert "b-drifted.parquet" in (run.error or "")
    assert DeltaTable(stream.sink_path(roots)).version() == version


def test_parquet_files_under_add_new_columns_add_them_with_their_parquet_types(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, parquet_stream("add_new_columns")))
    stream, roots = catalog.get("github"), roots_in(tmp_path)
    write_parquet(tmp_path, "a-first.parquet", fitting_parquet(0, 4))
    write_parquet(tmp_path, "b-drifted.parquet", drifted_parquet())
    [run] = run_streams(spark, catalog, ["github"], roots).streams

    assert run.status == "succeeded", run.error
    assert run.added_columns == {"coupon": "STRING", "score": "INT"}
    fields = {field.name: str(field.type) for field in pa.schema(DeltaTable(stream.sink_path(roots)).schema()
                                                                .to_arrow())}
    assert (fields["coupon"], fields["score"]) == ("string", "int32")
    rows = rows_by_id(stream.sink_path(roots))
    for i in range(10, 16):
        row = rows[f"p{i}"]
        assert (row["coupon"], row["score"]) == (f"C{i}" if i % 3 else None, i), i
        assert json.loads(row[RESCUED_COLUMN])["`user.agent`"] == f"curl/{i}"
    assert rows["p0"]["coupon"] is None and rows["p0"]["score"] is None


def test_a_parquet_backfill_reads_its_files_under_the_streams_policy(spark: Any, tmp_path: Path) -> None:
    """A replace over every file gives back the same table: the same typed values, the same rescued data."""
    from sluice.operations.backfill import parse_request
    from sluice_spark.backfill import run_backfill

    spec = {**parquet_stream(None), "backfill": {"event_time_column": "created_at"}}
    catalog = load_catalog(write_catalog(tmp_path, spec))
    stream, roots = catalog.get("github"), roots_in(tmp_path)
    write_parquet(tmp_path, "a-first.parquet", fitting_parquet(0, 4))
    write_parquet(tmp_path, "b-drifted.parquet", drifted_parquet())
    [run] = run_streams(spark, catalog, ["github"], roots).streams
    assert run.status == "succeeded", run.error
    before = rows_by_id(stream.sink_path(roots))

    request = parse_request({"stream": "github", "start": (AT - dt.timedelta(days=1)).isoformat(),
                             "end": (AT + dt.timedelta(days=2)).isoformat(), "mode": "replace",
                             "select_by": "event_time"}, catalog, run_id="again")
    summary = run_backfill(spark, catalog, request, roots)

    assert summary.ok and summary.files == 2, summary
    assert summary.rows_written == 10 and summary.rows_replaced == 10
    after = rows_by_id(stream.sink_path(roots))
    assert sorted(after) == sorted(before)
    for key, row in after.items():
        assert {**row, "_ingested_at": None} == {**before[key], "_ingested_at": None}, key
    assert json.loads(after["p13"][RESCUED_COLUMN])["amount"] == "twelve"
