"""The catalog's side of ``source.read: changes``: the key, its refusals, the change columns a stream may use, and
the upstream table that must record its changes."""

from __future__ import annotations

from typing import Any

from sluice.catalog import parse_catalog
from sluice.kinds.delta import CHANGE_COLUMNS, DeltaRead, DeltaSink
from tests.helpers import events_stream
from tests.unit.test_catalog import catalog_with, rejects, silver


def changes(**source: Any) -> dict[str, Any]:
    return silver(source={**silver()["source"], "read": "changes", **source})


def test_a_changes_read_marks_its_upstreams_table_and_offers_the_change_columns() -> None:
    stream = changes()
    stream["transform"] = {"sql": "SELECT event_id, event_time, _change_type AS kind, _commit_version AS version, "
                                  "_commit_timestamp AS committed_at FROM source"}
    stream["expectations"] = {"known_kind": {"check": "kind IN ('insert', 'update_postimage', 'delete')",
                                             "on_violation": "fail"}}
    catalog = parse_catalog(catalog_with(events_stream(), stream))
    reader, writer = catalog.get("events_silver"), catalog.get("events")
    assert reader.source.read is DeltaRead.CHANGES  # type: ignore[attr-defined]
    assert {name: reader.source.columns[name] for name in CHANGE_COLUMNS} == CHANGE_COLUMNS
    assert isinstance(writer.sink, DeltaSink) and writer.sink.change_feed
    assert not isinstance(reader.sink, DeltaSink) or not reader.sink.change_feed
    assert catalog.upstream_of(reader) is writer


def test_appends_stay_the_default_and_mark_nothing() -> None:
    catalog = parse_catalog(catalog_with(events_stream(), silver()))
    assert catalog.get("events_silver").source.read is DeltaRead.APPENDS  # type: ignore[attr-defined]
    assert "_change_type" not in catalog.get("events_silver").source.columns
    sink = catalog.get("events").sink
    assert isinstance(sink, DeltaSink) and not sink.change_feed
    rejects(catalog_with(events_stream(), silver(transform={"sql": "SELECT *, _change_type AS kind FROM source"})),
            "_change_type")


def test_changes_refusals_name_the_field() -> None:
    rejects(catalog_with(events_stream(), changes(read="updates")), "source.read", "updates")
    rejects(catalog_with(events_stream(), changes(options={"skipChangeCommits": True})), "source.options",
            "skipChangeCommits skips the versions read: changes is there to read")
    fan_out = events_stream(fan_out=[{"path": "bronze/purchases", "where": "event_type = 'purchase'"}])
    rejects(catalog_with(fan_out, changes(path="bronze/purchases")), "source.read",
            "'bronze/purchases' is a fan-out table of stream 'events'")


def test_a_changes_read_of_a_table_no_stream_writes_is_left_to_the_run() -> None:
    """Only the table can say whether it records its changes: the run refuses it otherwise
    (tests/spark/test_change_feed.py)."""
    catalog = parse_catalog(catalog_with({**changes(), "schedule": "@hourly"}))
    assert catalog.upstream_of(catalog.get("events_silver")) is None


def test_a_merge_orders_the_changes_by_their_commit_version() -> None:
    stream = changes()
    stream["sink"] = {"path": "silver/events", "mode": "merge", "keys": ["event_id"], "sequence_by": "_commit_version"}
    stream["fan_out"] = [{"path": "silver/deleted", "where": "_change_type = 'delete'"}]
    catalog = parse_catalog(catalog_with(events_stream(), stream))
    assert catalog.get("events_silver").sink.sequence_by == "_commit_version"  # type: ignore[attr-defined]
