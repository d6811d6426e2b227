"""Spark's file-source rules as Sluice reads them: Hadoop globs, maxFileAge and when Spark ignores it, fileNameOnly,
files of an uncommitted batch, and relative roots."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import parse_stream
from sluice.errors import SluiceError
from sluice.paths import Roots
from sluice.storage.checkpoint import CheckpointReader
from sluice.storage.landing import SourceState, glob_regex, max_file_age, unread_files
from sluice.times import parse_duration
from tests.helpers import events_stream


def stream_with(options: dict[str, Any], **overrides: Any):  # type: ignore[no-untyped-def]
    source = {**events_stream()["source"], "options": options}
    return parse_stream(events_stream(source=source, **overrides), index=0)


@pytest.mark.parametrize(("glob", "name", "matches"), [
    ("*.json", "a.json", True), ("*.{csv,json}", "a.csv", True), ("*.{csv,json}", "a.txt", False),
    ("[!a]*.json", "b.json", True), ("[^a]*.json", "a.json", False), ("part-?.json", "part-10.json", False),
    ("a\\*b", "a*b", True), ("a\\*b", "axb", False), ("{x,y{1,2}}.json", "y2.json", True),
])
def test_hadoop_globs(glob: str, name: str, matches: bool) -> None:
    assert bool(glob_regex(glob).match(name)) is matches


def test_bad_globs_and_durations_are_refused_with_the_option() -> None:
    with pytest.raises(SluiceError, match=re.escape("'{' without '}'")):
        glob_regex("*.{csv")
    assert parse_duration("36h").total_seconds() == 36 * 3600
    assert parse_duration("600000").total_seconds() == 600
    with pytest.raises(SluiceError, match="cannot read '2w' as a duration"):
        parse_duration("2w")


def test_latest_first_with_either_trigger_limit_turns_max_file_age_off() -> None:
    latest = {"latestFirst": True, "maxFileAge": "1h"}
    assert max_file_age(stream_with(latest)).total_seconds() == 3600  # type: ignore[union-attr]
    assert max_file_age(stream_with(latest, trigger={"max_files_per_trigger": 5})) is None
    assert max_file_age(stream_with(latest, trigger={"max_bytes_per_trigger": 5})) is None
    assert max_file_age(stream_with({})).days == 7  # type: ignore[union-attr]


def write_log(checkpoint: Path, entries: list[tuple[Path, int]], commits: list[int]) -> CheckpointReader:
    """A file source log as Spark writes it (one file per batch, ``file://`` URIs) and the commit files."""
    (checkpoint / "sources" / "0").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    for batch in sorted({batch for _, batch in entries}):
        lines = [json.dumps({"path": path.as_uri(), "timestamp": int(path.stat().st_mtime * 1000), "batchId": b})
                 for path, b in entries if b == batch]
        (checkpoint / "sources" / "0" / str(batch)).write_text("v1\n" + "\n".join(lines) + "\n")
    for batch in commits:
        (checkpoint / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    return CheckpointReader(checkpoint)


def test_uncommitted_batches_file_names_and_relative_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    landing = tmp_path / "landing" / "events"
    (landing / "a").mkdir(parents=True)
    (landing / "b").mkdir()
    files = {name: landing / name for name in ("a/1.json", "a/2.json", "b/3.json", "b/1.json", "b/4.csv")}
    for path in files.values():
        path.write_text("{}\n")
    old = time.time() - 30 * 86400
    os.utime(files["b/3.json"], (old, old))
    reader = write_log(tmp_path / "ckpt", [(files["a/1.json"], 0), (files["a/2.json"], 1)], commits=[0])
    monkeypatch.chdir(tmp_path)
    roots = Roots(landing="landing", lake="lake", checkpoints="checkpoints")

    stream = stream_with({"recursiveFileLookup": True, "pathGlobFilter": "*.{json}"})
    unread = unread_files(stream, roots, SourceState.of(stream, reader))
    # a/2.json: planned by batch 1, never committed: the next run replays it. b/1.json: new. b/3.json: older than
    # the 7-day horizon, never read. b/4.csv: not matched by the glob.
    assert sorted(f.path for f in unread.files) == [str(files["a/2.json"]), str(files["b/1.json"])]
    assert unread.behind_horizon == 1

    by_name = stream_with({"recursiveFileLookup": True, "pathGlobFilter": "*.json", "fileNameOnly": True})
    unread = unread_files(by_name, roots, SourceState.of(by_name, reader))
    assert sorted(f.path for f in unread.files) == [str(files["a/2.json"])], "b/1.json has a recorded name"


def test_symbolic_links_are_never_listed_and_the_gate_and_the_backfill_plan_refuse_them(tmp_path: Path) -> None:
    """An uploader who plants a link must not make Spark read a host file (into the dead-letter table's raw text)."""
    from sluice.catalog import parse_catalog
    from sluice.operations.backfill import parse_request, plan_backfill
    from sluice.operations.health import Health, check_stream
    from sluice.storage.landing import list_source_files, source_links

    roots = Roots(landing=str(tmp_path / "landing"), lake=str(tmp_path / "lake"), checkpoints=str(tmp_path / "cp"))
    catalog = parse_catalog({"streams": [events_stream()]})
    stream = catalog.get("events")
    landing = tmp_path / "landing" / "events"
    (landing / "2026-11-22").mkdir(parents=True)
    real = landing / "2026-11-22" / "a.json"
    real.write_text('{"event_id": "1"}\n')
    secret = tmp_path / "host-secret.json"
    secret.write_text('{"password": "hunter2"}\n')
    (landing / "2026-11-22" / "planted.json").symlink_to(secret)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.json").write_text("{}\n")
    (landing / "linked-folder").symlink_to(tmp_path / "elsewhere")

    assert [found.path for found in list_source_files(stream, roots)] == [str(real)]
    assert source_links(stream, roots) == [str(landing / "2026-11-22" / "planted.json"), str(landing / "linked-folder")]
    report = check_stream(stream, roots)
    assert report.status is Health.FAIL and "LANDING_SYMLINK" in report.codes
    assert "planted.json" in report.describe()
    request = parse_request({"stream": "events", "start": "2026-11-01T00:00:00Z", "end": "2026-11-02T00:00:00Z",
                             "select_by": "file_time"}, catalog, run_id="r")
    with pytest.raises(SluiceError, match="symbolic link"):
        plan_backfill(request, stream, roots)

    (landing / "2026-11-22" / "planted.json").unlink()
    (landing / "linked-folder").unlink()
    assert check_stream(stream, roots).status is Health.OK
