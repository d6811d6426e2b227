"""Catalog validation: one test per bad-config case, each asserting the message names the stream and the field."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sluice.catalog import DEFAULT_CATALOG, load_catalog, parse_catalog
from sluice.constants import DeltaEngine, FileFormat, HealthGate
from sluice.errors import CatalogError
from sluice.paths import Roots
from tests.helpers import events_stream


def catalog_with(*streams: dict[str, Any]) -> dict[str, Any]:
    return {"version": 1, "streams": list(streams)}


def rejects(raw: dict[str, Any], *fragments: str) -> str:
    with pytest.raises(CatalogError) as caught:
        parse_catalog(raw)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def test_bundled_catalog_is_valid() -> None:
    catalog = load_catalog(DEFAULT_CATALOG)
    assert [stream.name for stream in catalog] == ["events_bronze", "orders_bronze", "events_silver", "activity_hourly"]
    events = catalog.get("events_bronze")
    assert events.source.format is FileFormat.JSON
    assert events.source.schema.required == ["event_id", "event_type", "user_id", "event_time"]
    assert events.sink.partition_by == ("event_date",)
    assert events.sink.engine is DeltaEngine.AUTO
    assert events.trigger.max_files_per_trigger == 50


def test_valid_stream_resolves_paths_against_roots() -> None:
    stream = parse_catalog(catalog_with(events_stream())).get("events")
    roots = Roots(landing="/l", lake="s3a://lake", checkpoints="/c")
    assert stream.source_path(roots) == "/l/events"
    assert stream.sink_path(roots) == "s3a://lake/bronze/events"
    assert stream.dead_letter_table_path(roots) == "s3a://lake/bronze/events_dead_letter"
    assert stream.checkpoint_path(roots) == "/c/bronze/events"
    assert stream.source.schema.ddl().startswith("`event_id` STRING NOT NULL, `event_type` STRING NOT NULL")


def test_unknown_stream_key() -> None:
    rejects(catalog_with(events_stream(sheduel="* * * * *")), "stream 'events'", "unknown key(s) sheduel")


def test_unknown_source_key() -> None:
    stream = events_stream()
    stream["source"]["glob"] = "*.json"
    rejects(catalog_with(stream), "stream 'events'", "source: unknown key(s) glob")


def test_unknown_top_level_key() -> None:
    raw = catalog_with(events_stream())
    raw["stream"] = []
    rejects(raw, "unknown key(s) stream")


def test_bad_cron() -> None:
    rejects(catalog_with(events_stream(schedule="every five minutes")), "stream 'events'", "schedule:",
            "not a valid cron expression")


def test_file_source_without_schema() -> None:
    stream = events_stream()
    del stream["source"]["schema"]
    rejects(catalog_with(stream), "stream 'events'", "source.schema:", "needs a declared schema")


def test_two_streams_sharing_a_checkpoint() -> None:
    first = events_stream("first")
    second = events_stream("second", checkpoint=first["checkpoint"])
    rejects(catalog_with(first, second), "stream 'second'", "checkpoint:", "already used by stream 'first'")


def test_two_streams_sharing_a_sink() -> None:
    first = events_stream("first")
    second = events_stream("second")
    second["sink"]["path"] = "bronze/./first"
    rejects(catalog_with(first, second), "stream 'second'", "sink.path:", "already used by stream 'first'")


def test_sink_sharing_another_streams_dead_letter_table() -> None:
    first = events_stream("first")
    second = events_stream("second")
    second["sink"]["path"] = "bronze/first_dead_letter"
    rejects(catalog_with(first, second), "stream 'second'", "sink.path:", "already used by stream 'first'")


def test_unknown_transform() -> None:
    rejects(catalog_with(events_stream(transform="silverize")), "stream 'events'", "transform:",
            "unknown transform 'silverize'", "bronze_events")


def test_transform_needing_an_undeclared_column() -> None:
    stream = events_stream()
    del stream["source"]["schema"]["event_time"]
    rejects(catalog_with(stream), "stream 'events'", "transform:", "needs column(s) event_time")


def test_partition_column_not_produced() -> None:
    stream = events_stream()
    stream["sink"]["partition_by"] = ["event_day"]
    rejects(catalog_with(stream), "stream 'events'", "sink.partition_by:", "event_day")


def test_unknown_column_type() -> None:
    stream = events_stream()
    stream["source"]["schema"]["amount"] = "money"
    rejects(catalog_with(stream), "stream 'events'", "source.schema.amount:", "unknown type 'money'")


def test_bad_decimal_precision() -> None:
    stream = events_stream()
    stream["source"]["schema"]["amount"] = "decimal(2,5)"
    rejects(catalog_with(stream), "source.schema.amount:", "scale <= precision")


def test_reserved_column_name() -> None:
    stream = events_stream()
    stream["source"]["schema"]["_ingested_at"] = "timestamp"
    rejects(catalog_with(stream), "source.schema:", "reserved")


def test_bad_stream_name() -> None:
    rejects(catalog_with(events_stream("Events-Bronze")), "streams[0].name:", "must match")


def test_duplicate_stream_name() -> None:
    first = events_stream("events")
    second = copy.deepcopy(first)
    second["checkpoint"], second["sink"]["path"] = "other", "other"
    rejects(catalog_with(first, second), "stream 'events'", "name:", "defined twice")


def test_both_trigger_limits() -> None:
    rejects(catalog_with(events_stream(trigger={"max_files_per_trigger": 5, "max_bytes_per_trigger": 1024})),
            "stream 'events'", "trigger.max_bytes_per_trigger:", "not both")


def test_non_positive_trigger_limit() -> None:
    rejects(catalog_with(events_stream(trigger={"max_files_per_trigger": 0})), "trigger.max_files_per_trigger:",
            "positive integer")


def test_boolean_is_not_an_integer() -> None:
    rejects(catalog_with(events_stream(trigger={"max_files_per_trigger": True})), "trigger.max_files_per_trigger:",
            "got a boolean")


def test_warn_above_critical() -> None:
    rejects(catalog_with(events_stream(alerts={"warn_files": 10, "critical_files": 5})), "alerts.warn_files:",
            "exceeds CRITICAL")


def test_path_escaping_its_root() -> None:
    stream = events_stream()
    stream["sink"]["path"] = "../elsewhere"
    rejects(catalog_with(stream), "stream 'events'", "sink.path:", "must not contain '..'")


def test_unknown_source_option() -> None:
    stream = events_stream()
    stream["source"]["options"]["maxFilesPerTrigger"] = 10
    rejects(catalog_with(stream), "source.options.maxFilesPerTrigger:", "not a supported json source option")


def test_unknown_engine() -> None:
    stream = events_stream()
    stream["sink"]["engine"] = "photon"
    rejects(catalog_with(stream), "sink.engine:", "unknown value 'photon'", "auto, jvm, rs")


def test_unknown_format() -> None:
    stream = events_stream()
    stream["source"]["format"] = "xml"
    rejects(catalog_with(stream), "source.format:", "expected one of json, csv, parquet")


def test_missing_sink() -> None:
    stream = events_stream()
    del stream["sink"]
    rejects(catalog_with(stream), "stream 'events'", "sink:", "is required")


def test_unsupported_version() -> None:
    raw = catalog_with(events_stream())
    raw["version"] = 2
    rejects(raw, "version:", "unsupported catalog version 2")


def test_unknown_stream_selection() -> None:
    catalog = parse_catalog(catalog_with(events_stream()))
    with pytest.raises(CatalogError, match="unknown stream 'nope'; the catalog has: events"):
        catalog.select(["nope"])


def test_unreadable_and_invalid_files(tmp_path: Any) -> None:
    with pytest.raises(CatalogError, match="cannot read catalog"):
        load_catalog(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("streams: [", encoding="utf-8")
    with pytest.raises(CatalogError, match="not valid YAML"):
        load_catalog(broken)


def test_boolean_option_is_rendered_for_spark() -> None:
    stream = parse_catalog(catalog_with(events_stream())).get("events")
    assert stream.source.options["recursiveFileLookup"] == "true"


def silver(**overrides: Any) -> dict[str, Any]:
    stream: dict[str, Any] = {
        "name": "events_silver",
        "source": {"type": "delta", "path": "bronze/events", "options": {"startingVersion": 0},
                   "schema": {"event_id": "string not null", "event_time": "timestamp not null"}},
        "sink": {"path": "silver/events"},
        "checkpoint": "silver/events",
    }
    stream.update(overrides)
    return stream


def test_a_delta_source_reads_under_the_lake_root_and_is_scheduled_on_its_upstream() -> None:
    catalog = parse_catalog(catalog_with(events_stream(), silver()))
    stream = catalog.get("events_silver")
    assert stream.source.format is FileFormat.DELTA and stream.schedule is None
    roots = Roots(landing="/l", lake="/k", checkpoints="/c")
    assert stream.source_path(roots) == "/k/bronze/events"
    assert catalog.upstream_of(stream) is catalog.get("events")
    assert catalog.upstream_of(catalog.get("events")) is None


def test_delta_source_refusals_name_the_field() -> None:
    rejects(catalog_with(silver()), "stream 'events_silver'", "schedule", "no stream of the catalog writes "
                                                                         "'bronze/events'")
    assert parse_catalog(catalog_with(silver(schedule="0 * * * *"))).get("events_silver").schedule == "0 * * * *"
    rejects(catalog_with(events_stream(), silver(source={**silver()["source"], "format": "csv"})), "source.format",
            "a delta source cannot have format csv")
    rejects(catalog_with(events_stream(), silver(source={**silver()["source"], "options": {"header": True}})),
            "source.options.header", "not a supported delta source option")
    rejects(catalog_with(events_stream(), silver(source={**silver()["source"], "schema": None})), "source.schema",
            "a delta source needs a declared schema")
    own = silver(source={**silver()["source"], "path": "silver/events"}, schedule="@hourly")
    rejects(catalog_with(own), "source.path", "a stream cannot read its own table")


def test_a_group_runs_its_streams_from_one_dag_on_one_cron() -> None:
    catalog = parse_catalog(catalog_with(events_stream("clicks", group="small"), events_stream("views", group="small"),
                                         events_stream("alone")))
    assert [stream.dag_id for stream in catalog] == ["ingest_group_small", "ingest_group_small", "ingest_alone"]
    rejects(catalog_with(events_stream("clicks", group="small"), events_stream("views", group="small",
                                                                                 schedule="@hourly")),
            "stream 'views'", "schedule", "the streams of group 'small' run together, on one cron: 'clicks' has "
                                          "'*/5 * * * *', this stream '@hourly'")
    rejects(catalog_with(events_stream(), silver(group="small")), "stream 'events_silver'", "group",
            "a stream that runs on another stream's table updates cannot join a group")
    rejects(catalog_with(events_stream("clicks", group="Small Group")), "stream 'clicks'", "group", "must match")
    rejects(catalog_with(events_stream("clicks", group="x"), events_stream("group_x")), "stream 'group_x'", "name",
            "the DAG of group 'x' would be ingest_group_x")


def test_the_health_gate_is_a_task_of_its_own_or_the_run_tasks_first_step() -> None:
    catalog = parse_catalog(catalog_with(events_stream("own"), events_stream("inline", health_gate="inline")))
    assert [stream.health_gate for stream in catalog] == [HealthGate.TASK, HealthGate.INLINE]
    rejects(catalog_with(events_stream(health_gate="before")), "stream 'events'", "health_gate", "'before'")
    rejects(catalog_with(events_stream("clicks", group="small"),
                         events_stream("views", group="small", health_gate="inline")),
            "stream 'views'", "health_gate", "the streams of group 'small' share one DAG, so one kind of health gate: "
                                             "'clicks' has task, this stream inline")
