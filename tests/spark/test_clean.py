"""``source.clean``: the landing files committed batches have read are archived or deleted after the run, once old
enough; an unread file, a file a batch planned but never committed, and a file an unfinished backfill still needs
are never touched, under SIGKILL too. The oracle is the files themselves, read with the json module."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog, parse_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.errors import CatalogError
from sluice.operations.backfill import BackfillError, parse_request
from sluice.storage import clean
from sluice.storage.clean import BACKFILL_ROOT, clean_landing
from sluice_spark.runner import run_streams
from tests.helpers import events_stream, expected_events, roots_in, write_catalog
from tests.spark.test_crash_recovery import bronze, kill_at_then_rerun

pytestmark = pytest.mark.spark
NOW = dt.datetime(2026, 11, 27, 8, 0, tzinfo=dt.timezone.utc)
ARCHIVE = {"action": "archive", "after": "1 hour", "archive_to": "archive/events"}


def files_under(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*.json")} if folder.exists() else set()


def age(paths: list[Path], hours: float) -> list[Path]:
    """Make the files ``hours`` older (before a run reads them: the source log records the time it saw)."""
    for path in paths:
        stamp = path.stat().st_mtime - hours * 3600
        os.utime(path, (stamp, stamp))
    return paths


def land(producer: DemoProducer, count: int, minute: int) -> list[Path]:
    return [path for index in range(count)
            for path in producer.events_file(lines=20, now=NOW + dt.timedelta(minutes=minute + index)).files]


def test_read_files_are_archived_once_old_enough_and_unread_ones_stay(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, events_stream(source={**events_stream()["source"],
                                                                          "clean": ARCHIVE})))
    roots = roots_in(tmp_path)
    landing, archive = tmp_path / "landing" / "events", tmp_path / "landing" / "archive" / "events"
    producer = DemoProducer(tmp_path / "landing", seed=5, malformed_rate=0.05)
    old = age(land(producer, 3, 0), 2)
    [recent] = land(producer, 1, 5)

    first = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert first.status == "succeeded"
    assert first.cleaned == {"archived": 3, "deleted": 0, "waiting": 1, "held": 0, "changed": 0, "log_pruned": 0,
                              "folders_removed": 0}
    assert files_under(archive) == {str(path.relative_to(landing)) for path in old}, \
        "each read file is in the archive, at its path below the source folder"
    assert files_under(landing) == {str(recent.relative_to(landing))}, "read, but younger than after: kept"

    unread = age(land(producer, 2, 10), 2)
    report = clean_landing(catalog.get("events"), roots)
    assert report is not None and (report.archived, report.waiting) == (0, 1)
    assert all(path.exists() for path in unread), "an unread file is never touched, whatever its age"

    second = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert second.status == "succeeded" and second.batches == 1
    assert second.cleaned is not None and second.cleaned["archived"] == 2
    assert files_under(landing) == {str(recent.relative_to(landing))}
    good, _ = expected_events(tmp_path / "landing")
    assert bronze(str(tmp_path / "lake" / "bronze" / "events")) == good, "no file was read twice or lost"
    third = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert third.batches == 0, "archived files are not read again"


def test_delete_removes_only_read_files_and_a_rewritten_file_is_left(spark: Any, tmp_path: Path) -> None:
    # An hour: the recent file must still be waiting when the run's clean step comes, however long a loaded machine
    # takes to get there.
    clean = {"action": "delete", "after": "1 hour"}
    catalog = load_catalog(write_catalog(tmp_path, events_stream(source={**events_stream()["source"],
                                                                          "clean": clean})))
    roots = roots_in(tmp_path)
    producer = DemoProducer(tmp_path / "landing", seed=6, malformed_rate=0.0)
    [old] = age(land(producer, 1, 0), 2)
    [recent] = land(producer, 1, 5)
    summary = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert summary.cleaned == {"archived": 0, "deleted": 1, "waiting": 1, "held": 0, "changed": 0, "log_pruned": 0,
                               "folders_removed": 0}
    assert not old.exists() and recent.exists()

    rewritten = recent.read_text() + recent.read_text().splitlines()[0] + "\n"
    recent.write_text(rewritten)  # written again under the same name after the stream read it
    stamp = recent.stat().st_mtime + 5
    os.utime(recent, (stamp, stamp))
    report = clean_landing(catalog.get("events"), roots, now=stamp + 2 * 3600)
    assert report is not None and (report.deleted, report.changed) == (0, 1)
    assert recent.read_text() == rewritten, "not the file the stream read: not Sluice's to delete"


def test_a_file_an_unfinished_backfill_planned_is_held(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, events_stream(source={**events_stream()["source"],
                                                                          "clean": ARCHIVE})))
    roots = roots_in(tmp_path)
    producer = DemoProducer(tmp_path / "landing", seed=7, malformed_rate=0.0)
    planned, free = age(land(producer, 2, 0), 2)
    own = tmp_path / "checkpoints" / BACKFILL_ROOT / "events" / "run-1"
    own.mkdir(parents=True)
    (own / "plan.json").write_text(json.dumps({"files": [{"path": str(planned), "size": 1, "modified": 0}]}))

    summary = run_streams(spark, catalog, ["events"], roots).streams[0]
    assert summary.cleaned is not None and (summary.cleaned["archived"], summary.cleaned["held"]) == (1, 1)
    assert planned.exists() and not free.exists()
    (own / "done").write_bytes(b"")
    report = clean_landing(catalog.get("events"), roots)
    assert report is not None and report.archived == 1 and not planned.exists()


def test_sigkill_mid_clean_then_rerun_archives_each_read_file_once(tmp_path: Path) -> None:
    catalog_path = write_catalog(tmp_path, events_stream(source={**events_stream()["source"], "clean": ARCHIVE}))
    roots = roots_in(tmp_path)
    landing, archive = tmp_path / "landing" / "events", tmp_path / "landing" / "archive" / "events"
    producer = DemoProducer(tmp_path / "landing", seed=8, malformed_rate=0.05)
    age(land(producer, 4, 0), 2)
    everything = files_under(landing)
    good, _ = expected_events(landing)

    kill_at_then_rerun(catalog_path, roots, "cleaning", tmp_path / "faults")

    assert files_under(archive) == everything and files_under(landing) == set()
    assert bronze(str(tmp_path / "lake" / "bronze" / "events")) == good


def test_the_catalog_refuses_a_clean_that_would_lose_or_reread_files() -> None:
    def refused(fragment: str, *streams: dict[str, Any]) -> None:
        with pytest.raises(CatalogError) as caught:
            parse_catalog({"version": 1, "streams": list(streams)})
        assert fragment in str(caught.value), str(caught.value)

    source = events_stream()["source"]
    refused("source.clean.archive_to: is required to archive",
            events_stream(source={**source, "clean": {"action": "archive", "after": "1 day"}}))
    refused("source.clean.archive_to: is for action archive",
            events_stream(source={**source, "clean": {"action": "delete", "after": "1 day", "archive_to": "a"}}))
    refused("source.clean.after: expected a positive duration",
            events_stream(source={**source, "clean": {"action": "delete", "after": "later"}}))
    refused("stream 'other' also reads 'events'",
            events_stream(source={**source, "clean": ARCHIVE}),
            events_stream("other", source=source, checkpoint="other", sink={"path": "bronze/other"}))
    refused("the archive 'events/old' overlaps the landing folder 'events'",
            events_stream(source={**source, "clean": {**ARCHIVE, "archive_to": "events/old"}}))


def test_a_backfill_cannot_reach_back_past_what_clean_keeps(tmp_path: Path) -> None:
    catalog = parse_catalog({"version": 1, "streams": [events_stream(source={**events_stream()["source"],
                                                                             "clean": ARCHIVE})]})
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    with pytest.raises(BackfillError) as caught:
        parse_request({"stream": "events", "start": (now - dt.timedelta(hours=3)).isoformat(),
                       "end": now.isoformat(), "select_by": "file_time"}, catalog, run_id="r1")
    assert "start: stream 'events' cleans its landing zone" in str(caught.value)
    assert "moved to 'archive/events'" in str(caught.value)
    request = parse_request({"stream": "events", "start": (now - dt.timedelta(minutes=30)).isoformat(),
                             "end": now.isoformat(), "select_by": "file_time"}, catalog, run_id="r2")
    assert request.start > now - dt.timedelta(hours=1)


def test_a_cleaned_streams_source_log_keeps_only_its_horizon_and_each_file_is_read_once(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clean, "PRUNE_AT_LEAST", 1)  # rewrite at the first entry Spark forgets (100 in production)
    source = events_stream()["source"]
    stream = events_stream(source={**source, "clean": {"action": "delete", "after": "1 second"},
                                   "options": {**source["options"], "maxFileAge": "1h"}},
                           trigger={"max_files_per_trigger": 1})
    catalog = load_catalog(write_catalog(tmp_path, stream))
    roots = roots_in(tmp_path)
    landing, log = tmp_path / "landing", tmp_path / "checkpoints" / "bronze" / "events" / "sources" / "0"
    producer = DemoProducer(landing, seed=9, malformed_rate=0.0)

    def landed(minutes: list[int]) -> list[Path]:
        """Files written ``minutes`` after NOW, by their modification times (the source log records those)."""
        paths = []
        for minute in minutes:
            [path] = land(producer, 1, minute)
            stamp = (NOW + dt.timedelta(minutes=minute)).timestamp()
            os.utime(path, (stamp, stamp))
            paths.append(path)
        return paths

    def run(batches: int) -> dict[str, int]:
        summary = run_streams(spark, catalog, ["events"], roots).streams[0]
        assert summary.status == "succeeded" and summary.batches == batches, (summary.batches, summary.error)
        assert summary.cleaned is not None
        return summary.cleaned

    old = landed(list(range(10)))
    good, _ = expected_events(landing)
    assert run(10)["log_pruned"] == 0, "batches 0-9 (9.compact) are inside the horizon of the newest, minute 9"
    recent = landed([180, 181])  # three hours on: minutes 0-9 are behind the horizon, and cleaned
    good += expected_events(landing)[0]
    cleaned = run(2)
    assert cleaned["deleted"] == 2 and cleaned["log_pruned"] == 10
    assert (log / "9.compact").read_text() == "v1" and not (log / ".9.compact.crc").exists()

    more = landed(list(range(182, 190)))  # batches 12-19: Spark compacts 19.compact from the pruned 9.compact
    good += expected_events(landing, files=more)[0]
    old[0].write_text(more[0].read_text())  # back under its name and time, behind the horizon: not read
    os.utime(old[0], (NOW.timestamp(), NOW.timestamp()))
    assert run(8)["deleted"] == 8
    compacted = (log / "19.compact").read_text()
    assert [str(path) for path in recent + more if str(path) not in compacted] == []
    assert not any(str(path) in compacted for path in old), "what Spark forgot stays out of its next compaction"
    assert old[0].exists(), "behind the horizon: Spark does not read it, pruned entry or not, and no one cleans it"
    assert bronze(str(tmp_path / "lake" / "bronze" / "events")) == sorted(good, key=repr), "each file read once"
    assert run(0)["deleted"] == 0
