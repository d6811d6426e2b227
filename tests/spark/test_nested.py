"""Nested records end to end: a GitHub-like feed (objects, arrays of objects, maps, nulls at every level, unicode,
keys with dots and dashes) read with a declared nested schema into typed Delta columns, checked against the same
records parsed by Python's json module (an oracle independent of Spark)."""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.storage.delta import read_table
from sluice_spark.runner import run_streams
from tests.helpers import events_stream, roots_in, write_catalog

pytestmark = pytest.mark.spark

SCHEMA = {
    "id": "string not null",
    "type": "string not null",
    "actor": "struct<id: bigint not null, login: string, `display.name`: string>",
    "repo": "struct<id: bigint, name: string, owner: struct<login: string, `site-admin`: boolean>>",
    "payload": "struct<size: int, commits: array<struct<sha: string not null, message: string, "
               "`author.email`: string>>, labels: map<string, bigint>>",
    "`user-agent`": "string",
    "created_at": "timestamp",
}


def event(number: int, rng: random.Random) -> dict[str, Any]:
    """A GitHub-like event; some fields absent or null at every level, some undeclared."""
    commits = [{"sha": f"{number:04x}{index}", "message": rng.choice(["fix ünïcode ✓", "", None, "初版"]),
                "author.email": rng.choice([f"dev{index}@example.org", None]), "distinct": True}
               for index in range(rng.randint(0, 3))]
    record: dict[str, Any] = {
        "id": str(number), "type": rng.choice(["PushEvent", "WatchEvent", "IssuesEvent"]),
        "actor": rng.choice([{"id": number, "login": f"user{number}", "display.name": "Zoë ☕"},
                             {"id": number * 7, "login": None}, None]),
        "repo": {"id": 1000 + number, "name": f"org/repo-{number % 5}",
                 "owner": rng.choice([{"login": "org", "site-admin": False}, None, {}])},
        "payload": rng.choice([{"size": len(commits), "commits": commits,
                                "labels": {"bug": number, "good first issue": None, "ñ": 1}},
                               {"size": 0, "commits": [], "labels": None}, {}]),
        "user-agent": rng.choice(["curl/8.5", None]),
        "created_at": f"2026-11-22T08:{number % 60:02d}:00Z",
        "public": True,  # not declared: not read
    }
    if number % 17 == 0:
        del record["user-agent"]
    return record


def project(value: Any, spec: str) -> Any:
    """The oracle: a JSON value as the declared type reads it (undeclared fields left out)."""
    from sluice.model.types import Array, MapType, Primitive, Struct, parse

    def walk(item: Any, data_type: Any) -> Any:
        if item is None:
            return None
        if isinstance(data_type, Struct):
            return {field.name: walk(item.get(field.name), field.type) for field in data_type.fields}
        if isinstance(data_type, Array):
            return [walk(element, data_type.element) for element in item]
        if isinstance(data_type, MapType):
            return {key: walk(entry, data_type.value) for key, entry in item.items()}
        assert isinstance(data_type, Primitive)
        if data_type.name == "TIMESTAMP":
            return dt.datetime.fromisoformat(item.replace("Z", "+00:00"))
        return item

    return walk(value, parse(spec)[0])


def normalized(value: Any) -> Any:
    """Delta's rows as plain Python: a map (a list of pairs in Arrow) as a dict."""
    if isinstance(value, dict):
        return {key: normalized(item) for key, item in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(item, tuple) and len(item) == 2 for item in value):
            return {key: normalized(item) for key, item in value}
        return [normalized(item) for item in value]
    return value


def test_a_nested_feed_lands_in_typed_columns_equal_to_a_json_oracle(spark: Any, tmp_path: Path) -> None:
    rng = random.Random(7)
    records = [event(number, rng) for number in range(120)]
    # Records that break a nested NOT NULL: an actor without its id, a commit without its sha.
    records.append({**records[0], "id": "no-actor-id", "actor": {"login": "ghost"}})
    records.append({**records[1], "id": "no-sha", "payload": {"size": 1, "commits": [{"message": "x"}]}})
    landing = tmp_path / "landing" / "github"
    landing.mkdir(parents=True)
    (landing / "events.json").write_text("\n".join(json.dumps(record, ensure_ascii=False) for record in records)
                                         + "\n", encoding="utf-8")
    stream_spec = events_stream("github", source={"type": "files", "format": "json", "path": "github",
                                                  "schema": SCHEMA}, transform="identity",
                                sink={"path": "bronze/github", "engine": "rs"})
    catalog = load_catalog(write_catalog(tmp_path, stream_spec))
    roots = roots_in(tmp_path)
    [run] = run_streams(spark, catalog, ["github"], roots).streams
    assert run.status == "succeeded", run.error

    def lacks_nested(record: dict[str, Any]) -> bool:
        actor, commits = record.get("actor"), (record.get("payload") or {}).get("commits") or []
        return (actor is not None and actor.get("id") is None) or any(c.get("sha") is None for c in commits)

    good = [record for record in records if not lacks_nested(record)]
    names = [name.strip("`") for name in SCHEMA]
    expected = sorted(([project(record.get(name), SCHEMA[key]) for name, key in zip(names, SCHEMA, strict=True)]
                       for record in good), key=lambda row: row[0])
    stream = catalog.get("github")
    table = read_table(stream.sink_path(roots), names).to_pylist()
    actual = sorted(([normalized(row[name]) for name in names] for row in table), key=lambda row: row[0])
    assert (run.input_rows, run.output_rows, run.dead_letter_rows) == (len(records), len(good), 2)
    assert actual == expected
    dead = read_table(stream.dead_letter_table_path(roots), ["reason"]).to_pylist()
    assert sorted(row["reason"] for row in dead) == ["missing required field 'actor.id'",
                                                     "missing required field 'payload.commits[].sha'"]
