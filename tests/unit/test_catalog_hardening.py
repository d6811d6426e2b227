"""Catalog hardening (issue 13): what the loader used to accept and now refuses, each refusal naming the stream and
the field. YAML-level cases go through ``load_catalog`` on a file; the rest through ``parse_catalog``."""

from __future__ import annotations

import itertools
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.catalog import DEFAULT_CATALOG, Catalog, load_catalog, parse_catalog
from sluice.errors import CatalogError
from sluice.limits import YAML_MAX_ALIAS_NODES
from sluice.paths import Roots
from tests.helpers import events_stream, roots_in
from tests.unit.test_catalog import catalog_with, rejects
from tests.unit.test_patterns import silver


def entry(name: str = "events", *extra: str, **overrides: Any) -> str:
    """One catalog entry as block YAML (``events_stream``), followed by ``extra`` lines of its own keys."""
    lines = yaml.safe_dump(events_stream(name, **overrides), sort_keys=False).splitlines()
    return "\n".join(["  - " + lines[0], *("    " + line for line in [*lines[1:], *extra])]) + "\n"


def document(*entries: str, head: str = "version: 1\n") -> str:
    return head + "streams:\n" + "".join(entries)


def load_text(tmp_path: Path, text: str) -> Catalog:
    path = tmp_path / "catalog.yaml"
    path.write_text(text, encoding="utf-8")
    return load_catalog(path)


def load_rejects(tmp_path: Path, text: str, *fragments: str) -> str:
    with pytest.raises(CatalogError) as caught:
        load_text(tmp_path, text)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


# -- 1. duplicate keys -----------------------------------------------------------------------------------------------

def test_a_second_streams_key_is_refused_not_merged(tmp_path: Path) -> None:
    text = document(entry("first"), head="version: 1\nstreams:\n" + entry("second"))
    assert text.count("streams:") == 2
    load_rejects(tmp_path, text, "streams:", "duplicate key 'streams'", "first at line 2")


def test_a_duplicate_key_inside_a_stream_names_the_stream_and_field(tmp_path: Path) -> None:
    load_rejects(tmp_path, document(entry("events", "checkpoint: elsewhere")), "stream 'events'", "checkpoint:",
                 "duplicate key 'checkpoint'")
    nested = document(entry("events")).replace("    sink:\n", "    sink:\n      path: bronze/other\n")
    load_rejects(tmp_path, nested, "stream 'events'", "sink.path:", "duplicate key 'path'")
    column = document(entry("events")).replace("        amount: ", "        amount: string\n        amount: ")
    load_rejects(tmp_path, column, "stream 'events'", "source.schema.amount:", "duplicate key 'amount'")


def test_keys_are_names_so_the_documented_on_key_loads(tmp_path: Path) -> None:
    # docs/guides/silver-gold.md: `- {table: dim/users, on: [user_id], columns: [country, plan]}`. YAML 1.1 reads a
    # plain `on` as true.
    stream = silver(lookup=[{"table": "dim/users", "on": ["user_id"], "columns": ["country"]}])
    text = yaml.safe_dump(catalog_with(stream), sort_keys=False).replace("'on':", "on:")
    assert "on: " in text and "'on'" not in text
    lookup = load_text(tmp_path, text).get("silver").patterns.lookup[0]
    assert lookup.on == ("user_id",)


# -- 2. aliases ------------------------------------------------------------------------------------------------------

def laughs(levels: int, indent: str = "") -> list[str]:
    lines = [f'{indent}a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"{indent}{name}: &{name} [{','.join([f'*{previous}'] * 9)}]"
              for previous, name in itertools.pairwise("abcdefghijklmnop"[:levels])]
    return lines


def test_the_billion_laughs_fails_fast_and_small(tmp_path: Path) -> None:
    bomb = document(entry("events"), head="version: 1\nlaughs:\n" + "\n".join(laughs(9, "  ")) + "\n")
    tracemalloc.start()
    try:
        message = load_rejects(tmp_path, bomb, "laughs.", "aliases expand this value", f"{YAML_MAX_ALIAS_NODES:,}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Expanded, the document holds 9**9 (387 million) strings; refused, it costs what its 84 nodes cost
    # (about 70 KiB measured).
    assert peak < 1024 * 1024, f"peak {peak:,} bytes for {message}"


def test_an_alias_bomb_inside_a_stream_names_the_stream_and_field(tmp_path: Path) -> None:
    bomb = [f"  - {line.split(': ', 1)[1]}" for line in laughs(6)]
    text = document(entry("events", "tags:", *bomb))
    load_rejects(tmp_path, text, "stream 'events'", "tags[", "aliases expand this value")


def test_merge_keys_cannot_multiply_either(tmp_path: Path) -> None:
    # PyYAML copies every merged pair into the merging mapping: nine merges of nine merges grow as 9**n
    # (five levels: 1.1 million nodes).
    levels = ["  - &m0 {" + ", ".join(f"k{index}: {index}" for index in range(9)) + "}"]
    levels += [f"  - &m{level} {{<<: [{', '.join([f'*m{level - 1}'] * 9)}]}}" for level in range(1, 6)]
    load_rejects(tmp_path, document(entry("events", "tags:", *levels)), "stream 'events'", "tags[",
                 "aliases expand this value")


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    load_rejects(tmp_path, document(entry("events", "tags: &tags [bronze, *tags]")), "stream 'events'", "tags[1]:",
                 "contains an alias of itself")


def test_anchors_for_shared_settings_still_load(tmp_path: Path) -> None:
    text = document(
        entry("first", "alerts: &default_alerts {stale_after_seconds: 1800, warn_files: 100, critical_files: 1000}",
              "trigger: &limits {max_files_per_trigger: 50}"),
        entry("second", "alerts: *default_alerts", "trigger: *limits"),
        entry("third", "alerts:", "  <<: *default_alerts", "  critical_files: 5000", "  email_to: [ops@example.com]"),
    )
    catalog = load_text(tmp_path, text)
    first, second, third = (catalog.get(name) for name in ("first", "second", "third"))
    assert first.alerts == second.alerts
    assert (second.alerts.stale_after_seconds, second.alerts.warn_files, second.alerts.critical_files) == (1800, 100,
                                                                                                           1000)
    assert second.trigger.max_files_per_trigger == 50
    assert (third.alerts.warn_files, third.alerts.critical_files) == (100, 5000)
    assert third.alerts.email_to == ("ops@example.com",)


def test_nesting_and_integer_literals_are_bounded(tmp_path: Path) -> None:
    load_rejects(tmp_path, document(entry("events", "tags: " + "[" * 80 + "]" * 80)), "stream 'events'", "tags[0]",
                 "nest more than 64 levels")
    load_rejects(tmp_path, "streams: " + "[" * 5000 + "]" * 5000, "nests values too deeply")
    load_rejects(tmp_path, document(entry("events", "backfill: {max_range_days: " + "9" * 5000 + "}")),
                 "stream 'events'", "backfill.max_range_days:", "integer of 5000 characters")


def test_an_oversized_catalog_file_is_refused_unread(tmp_path: Path) -> None:
    load_rejects(tmp_path, "#" * (16 * 1024 * 1024 + 1), "larger than 16,777,216 bytes")


# -- 3. nested and overlapping checkpoints and tables -------------------------------------------------------------

def test_a_checkpoint_inside_another_is_refused_either_way() -> None:
    outer, inner = events_stream("outer"), events_stream("inner", checkpoint="bronze/outer/offsets")
    rejects(catalog_with(outer, inner), "stream 'inner'", "checkpoint:", "lies inside the checkpoint 'bronze/outer' "
                                                                          "of stream 'outer'")
    rejects(catalog_with(inner, outer), "stream 'outer'", "checkpoint:", "holds the checkpoint 'bronze/outer/offsets' "
                                                                          "of stream 'inner'")


@pytest.mark.parametrize(("second", "field"), [
    ({"sink": {"path": "bronze/first/part", "partition_by": ["event_date"]}}, "sink.path"),
    ({"dead_letter": {"path": "bronze/first/_dead_letter"}}, "dead_letter.path"),
    ({"fan_out": [{"path": "bronze/first_dead_letter/x", "where": "amount > 1"}]}, "fan_out[0].path"),
    ({"sink": {"path": "bronze", "partition_by": ["event_date"]}}, "sink.path"),
])
def test_a_table_inside_another_tables_folder_is_refused(second: dict[str, Any], field: str) -> None:
    rejects(catalog_with(events_stream("first"), events_stream("second", **second)), "stream 'second'", f"{field}:",
            "stream 'first'", "VACUUM")


def test_a_streams_own_tables_must_not_nest() -> None:
    rejects(catalog_with(events_stream("events", dead_letter={"path": "bronze/events/_dead_letter"})),
            "stream 'events'", "dead_letter.path:", "lies inside the sink table 'bronze/events' of stream 'events'")


def test_absolute_paths_are_compared_across_kinds_at_load() -> None:
    rejects(catalog_with(events_stream("first", checkpoint="/data/cp/first"),
                         events_stream("second", sink={"path": "/data/cp/first/table"})),
            "stream 'second'", "sink.path:", "inside the checkpoint '/data/cp/first' of stream 'first'")
    rejects(catalog_with(events_stream("first", sink={"path": "s3a://bucket/t"}),
                         events_stream("second", sink={"path": "S3A://bucket//t/./"})),
            "stream 'second'", "sink.path:", "already used by stream 'first'")


def test_a_relative_and_an_absolute_name_for_one_table_collide_once_the_roots_are_known(tmp_path: Path) -> None:
    roots = roots_in(tmp_path)
    catalog = parse_catalog(catalog_with(
        events_stream("first"), events_stream("second", sink={"path": f"{roots.lake}/bronze/first"})))
    with pytest.raises(CatalogError) as caught:
        catalog.check_roots(roots)
    assert "stream 'second': sink.path: sink table" in str(caught.value)
    assert "already used by stream 'first' as its sink table 'bronze/first'" in str(caught.value)


def test_check_roots_resolves_links(tmp_path: Path) -> None:
    real = tmp_path / "real-lake"
    real.mkdir()
    (tmp_path / "lake").symlink_to(real)
    roots = roots_in(tmp_path)  # its lake root is the link
    catalog = parse_catalog(catalog_with(
        events_stream("first"), events_stream("second", fan_out=[{"path": f"{real}/bronze/first/x", "where": "1=1"}])))
    with pytest.raises(CatalogError, match=r"stream 'second': fan_out\[0\]\.path: .* lies inside the sink table"):
        catalog.check_roots(roots)


def test_check_roots_refuses_a_shared_root_that_makes_a_checkpoint_a_table(tmp_path: Path) -> None:
    shared = Roots(landing=str(tmp_path / "landing"), lake=str(tmp_path / "data"), checkpoints=str(tmp_path / "data"))
    catalog = parse_catalog(catalog_with(events_stream("events")))  # checkpoint and sink are both bronze/events
    with pytest.raises(CatalogError, match=r"stream 'events': sink\.path: .* already used by stream 'events' as "
                                           r"its checkpoint"):
        catalog.check_roots(shared)


@pytest.mark.parametrize(("overrides", "field", "fragment"), [
    ({"checkpoint": "{checkpoints}"}, "checkpoint", "is or contains the checkpoints root"),
    ({"sink": {"path": "{data}"}}, "sink.path", "is or contains the landing root"),
    ({"checkpoint": "{checkpoints}/_backfill/events/run"}, "checkpoint", "lies in _backfill/"),
    ({"dead_letter": {"path": "{checkpoints}/_sluice"}}, "dead_letter.path", "lies in _sluice/"),
    ({"sink": {"path": "{lake}/_sluice/runs"}}, "sink.path", "lies in _sluice/ under the lake root"),
    ({"sink": {"path": "{landing}/events/table"}}, "source.path", "the stream would read Delta's own files"),
])
def test_check_roots_refusals(tmp_path: Path, overrides: dict[str, Any], field: str, fragment: str) -> None:
    roots = roots_in(tmp_path)
    values = {"checkpoints": roots.checkpoints, "landing": roots.landing, "lake": roots.lake, "data": str(tmp_path)}
    resolved = yaml.safe_load(yaml.safe_dump(overrides).format(**values))
    if "sink" in resolved:
        resolved["sink"]["partition_by"] = ["event_date"]
    catalog = parse_catalog(catalog_with(events_stream("events", **resolved)))
    with pytest.raises(CatalogError) as caught:
        catalog.check_roots(roots)
    assert f"stream 'events': {field}: " in str(caught.value) and fragment in str(caught.value)


def test_the_bundled_catalog_passes_check_roots(tmp_path: Path) -> None:
    load_catalog(DEFAULT_CATALOG).check_roots(roots_in(tmp_path))
    load_catalog(DEFAULT_CATALOG).check_roots(Roots(landing="s3a://b/landing", lake="s3a://b/lake",
                                                    checkpoints=str(tmp_path / "checkpoints")))


def stream_with_path(field: str, path: str) -> dict[str, Any]:
    """The events stream with ``path`` at the dotted ``field`` (a checkpoint, a table or the source path)."""
    stream = events_stream("events")
    if field == "checkpoint":
        stream["checkpoint"] = path
    elif field == "fan_out[0].path":
        stream["fan_out"] = [{"path": path, "where": "1 = 1"}]
    else:
        section, key = field.split(".")
        stream[section] = {**stream.get(section, {}), key: path}
    return stream


# -- 4. paths that name their root -----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [".", "./", "//", "/", "/./", "s3a://bucket/", "s3a://bucket", "a\x00b",
                                  "x://", "bronze/s3a://x"])
@pytest.mark.parametrize("field", ["checkpoint", "sink.path", "dead_letter.path", "source.path", "fan_out[0].path"])
def test_a_path_naming_a_root_is_refused_everywhere(path: str, field: str) -> None:
    stream = stream_with_path(field, path)
    rejects(catalog_with(stream), "stream 'events'", f"{field}:")


def test_a_lookup_table_naming_the_lake_root_is_refused() -> None:
    stream = silver(lookup=[{"table": "./", "on": ["user_id"], "columns": ["country"]}])
    rejects(catalog_with(stream), "stream 'silver'", "lookup[0].table:", "names its root itself")


def test_paths_are_normalized() -> None:
    stream = parse_catalog(catalog_with(events_stream(
        "events", checkpoint="bronze//events/./", sink={"path": "./bronze/events//", "partition_by": ["event_date"]},
        dead_letter={"path": "/data//dl/./events/"}))).get("events")
    assert (stream.checkpoint, stream.sink.path, stream.dead_letter_path) == ("bronze/events", "bronze/events",
                                                                              "/data/dl/events")
    assert stream.sink_path(Roots(landing="/l", lake="/k", checkpoints="/c")) == "/k/bronze/events"
    rejects(catalog_with(events_stream("first"), events_stream("second", checkpoint="bronze//first/.")),
            "stream 'second'", "checkpoint:", "already used by stream 'first'")


# -- 5. Sluice's own folder names ------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["_backfill", "_backfill/events", "_sluice/lag", "_SLUICE/x"])
@pytest.mark.parametrize("field", ["checkpoint", "sink.path", "dead_letter.path", "fan_out[0].path"])
def test_reserved_folders_are_refused(path: str, field: str) -> None:
    stream = stream_with_path(field, path)
    rejects(catalog_with(stream), "stream 'events'", f"{field}:", "a folder Sluice keeps for itself")


def test_reserved_names_deeper_down_and_the_kafka_dead_letter_default_are_fine() -> None:
    stream = parse_catalog(catalog_with(events_stream(
        "events", checkpoint="bronze/_backfill", sink={"path": "bronze/_sluice", "partition_by": ["event_date"]},
        dead_letter={"path": "_dead_letter/events"}))).get("events")
    assert stream.checkpoint == "bronze/_backfill"


def test_a_checkpoint_named_like_a_repair_copy_is_refused() -> None:
    rejects(catalog_with(events_stream("events", checkpoint="bronze/events.backup-20260101T000000Z-000001")),
            "stream 'events'", "checkpoint:", "looks like a copy the repair tools make")


# -- 6. numbers ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("section", "key", "too_big", "bound"), [
    ("trigger", "max_files_per_trigger", 1_000_001, "1,000,000"),
    ("trigger", "max_bytes_per_trigger", 2**40 + 1, "1,099,511,627,776"),
    ("alerts", "stale_after_seconds", 10**12, "315,360,000"),
    ("alerts", "warn_records", 10**15 + 1, "1,000,000,000,000,000"),
    ("alerts", "critical_records", 10**18, "1,000,000,000,000,000"),
    ("alerts", "warn_files", 10**10, "1,000,000,000"),
    ("alerts", "critical_bytes", 2**62, "1,152,921,504,606,846,976"),
    ("alerts", "warn_seconds", 10**9, "315,360,000"),
    ("alerts", "stall_observations", 1001, "1,000"),
    ("alerts", "resolve_after_observations", 10**6, "1,000"),
    ("backfill", "max_range_days", 10**9, "3,650"),
    ("backfill", "clock_skew_seconds", 10**9, "2,592,000"),
])
def test_every_number_has_an_upper_bound(section: str, key: str, too_big: int, bound: str) -> None:
    rejects(catalog_with(events_stream("events", **{section: {key: too_big}})), "stream 'events'",
            f"{section}.{key}:", f"must be at most {bound}")


def test_numbers_at_their_bounds_load() -> None:
    stream = parse_catalog(catalog_with(events_stream(
        "events", trigger={"max_bytes_per_trigger": 2**40},
        alerts={"stale_after_seconds": 315_360_000, "warn_records": 10**15, "stall_observations": 1000},
        backfill={"max_range_days": 3650, "clock_skew_seconds": 2_592_000}))).get("events")
    assert stream.backfill.max_range_days == 3650 and stream.alerts.stall_observations == 1000
    rejects(catalog_with(events_stream("events", backfill={"clock_skew_seconds": -1})), "backfill.clock_skew_seconds:",
            "must be at least 0")


@pytest.mark.parametrize(("fields", "field"), [
    ({"watermark": {"column": "event_time", "delay": "3651 days"}, "dedupe": {"keys": ["event_id"]}},
     "watermark.delay"),
    ({"watermark": {"column": "event_time", "delay": "1 hour"},
      "aggregate": {"window": {"type": "tumbling", "column": "event_time", "duration": "99999999 hours"},
                    "measures": {"n": "count(*)"}}, "sink": {"mode": "merge"}}, "aggregate.window.duration"),
    ({"watermark": {"column": "event_time", "delay": "1 hour"},
      "aggregate": {"window": {"type": "session", "column": "event_time", "gap": "315360001s"},
                    "measures": {"n": "count(*)"}}}, "aggregate.window.gap"),
])
def test_durations_have_an_upper_bound(fields: dict[str, Any], field: str) -> None:
    rejects(catalog_with(silver(**fields)), "stream 'silver'", f"{field}:", "must be at most 3650 days")


def test_a_duration_of_thousands_of_digits_is_refused_as_a_duration() -> None:
    rejects(catalog_with(silver(watermark={"column": "event_time", "delay": "9" * 5000 + " s"},
                                dedupe={"keys": ["event_id"]})), "stream 'silver'", "watermark.delay:",
            "expected a positive duration")


def test_a_decimal_with_thousands_of_digits_is_refused_with_the_field(tmp_path: Path) -> None:
    stream = events_stream()
    stream["source"]["schema"]["amount"] = "decimal(" + "9" * 5000 + ",2)"
    with pytest.raises(CatalogError, match=r"source\.schema"):
        parse_catalog({"streams": [stream]})
