"""Hostile checkpoint contents and lag-history rows: the health gate, ``make status`` and the Streams page's data
read them bounded (regular files only, no links, no blocking opens, a size cap, batch ids that are plain decimals of
at most 2**63-1), name the file that is wrong, and skip a bad row instead of failing every stream."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import Catalog, cached_catalog, load_catalog
from sluice.cli import health as health_cli
from sluice.cli import status
from sluice.errors import printable
from sluice.lag.observe import check
from sluice.lag.store import LagStore, default_path
from sluice.limits import CHECKPOINT_FILE_MAX_BYTES
from sluice.operations import streams_view
from sluice.operations.health import HealthReport, check_stream
from sluice.paths import Roots
from sluice.storage.checkpoint import CheckpointReader, batch_id, gaps, log_file_batch
from sluice.storage.store import LocalFolder
from tests.helpers import events_stream, roots_in, write_catalog

MARKUP = '"><img src=x onerror=alert(1)>'
# A check that has not returned by then is stuck on a read that never ends (a FIFO with no writer).
RETURNS_WITHIN_SECONDS = 30


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Catalog, Roots]:
    """Two file streams, in the environment as ``make status`` and the page read it; ``clicks`` has committed
    batch 0 and 1."""
    path = write_catalog(tmp_path, events_stream("clicks"),
                         events_stream("orders", source={**events_stream()["source"], "path": "orders"}))
    monkeypatch.setenv("SLUICE_CATALOG", str(path))
    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    catalog, roots = load_catalog(path), roots_in(tmp_path)
    for name in ("events", "orders"):
        Path(roots.landing, name).mkdir(parents=True)
    checkpoint = Path(catalog.get("clicks").checkpoint_path(roots))
    write(checkpoint / "metadata", '{"id":"6f1c2c8e-0d5e-4f4e-9a43-4c6f4b1d2e10"}\n')
    for batch in (0, 1):
        write(checkpoint / "offsets" / str(batch), f'v1\n{{"batchWatermarkMs":0}}\n{{"logOffset":{batch}}}\n')
        write(checkpoint / "commits" / str(batch), 'v1\n{"nextBatchWatermarkMs":0}\n')
        write(checkpoint / "sources" / "0" / str(batch), "v1\n")
    return catalog, roots


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def returns(call: Callable[[], Any]) -> Any:
    """What ``call`` returns, or a test failure when it is still running after RETURNS_WITHIN_SECONDS."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the test
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(RETURNS_WITHIN_SECONDS)
    assert not worker.is_alive(), "the read never ended"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def link_outside(path: Path) -> None:
    outside = path.parent.parent.parent / "outside.txt"
    outside.write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":1}\n')
    path.unlink()
    path.symlink_to(outside)


def link_loop(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.name)


def huge_number(path: Path) -> None:
    path.write_text('v1\n{}\n{"logOffset":' + "9" * 5000 + "}\n")


def deep_json(path: Path) -> None:
    path.write_text("v1\n{}\n" + "[" * 100_000 + "]" * 100_000 + "\n")


def too_large(path: Path) -> None:
    with path.open("r+b") as handle:  # sparse: no disk used
        handle.truncate(CHECKPOINT_FILE_MAX_BYTES + 1)


@pytest.mark.parametrize(("name", "plant", "code", "says"), [
    ("offsets/1", fifo, "OFFSETS_CORRUPT", "not a regular file (a FIFO)"),
    ("offsets/1", link_outside, "OFFSETS_CORRUPT", "a symbolic link"),
    ("offsets/1", too_large, "OFFSETS_CORRUPT", f"larger than {CHECKPOINT_FILE_MAX_BYTES} bytes"),
    ("offsets/1", link_loop, "OFFSETS_CORRUPT", "a symbolic link"),
    ("offsets/1", huge_number, "OFFSETS_CORRUPT", "not JSON that Spark writes"),
    ("offsets/1", deep_json, "OFFSETS_CORRUPT", "not JSON that Spark writes"),
    ("metadata", fifo, "METADATA_CORRUPT", "not a regular file (a FIFO)"),
    ("metadata", link_outside, "METADATA_CORRUPT", "a symbolic link"),
])
def test_the_health_gate_names_a_special_file_and_returns(world: tuple[Catalog, Roots], name: str,
                                                          plant: Callable[[Path], None], code: str,
                                                          says: str) -> None:
    catalog, roots = world
    stream = catalog.get("clicks")
    plant(Path(stream.checkpoint_path(roots), name))
    report: HealthReport = returns(lambda: check_stream(stream, roots))
    [finding] = [finding for finding in report.findings if finding.code == code]
    assert finding.severity.value == "FAIL"
    assert f"{name}: {says}" in finding.message


def test_a_device_in_the_checkpoint_is_refused(world: tuple[Catalog, Roots]) -> None:
    catalog, roots = world
    stream = catalog.get("clicks")
    offsets = Path(stream.checkpoint_path(roots), "offsets", "1")
    offsets.unlink()
    try:
        os.mknod(offsets, 0o600 | 0o020000, os.makedev(1, 5))  # /dev/zero's numbers: a read never ends
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")
    report: HealthReport = returns(lambda: check_stream(stream, roots))
    assert "offsets/1: not a regular file (a character device)" in " ".join(f.message for f in report.findings)


@pytest.mark.parametrize("name", ["9" * 250, str(2**63), "١٢", "²"])
def test_a_batch_number_spark_never_writes_is_skipped_and_named(world: tuple[Catalog, Roots], name: str) -> None:
    catalog, roots = world
    stream = catalog.get("clicks")
    write(Path(stream.checkpoint_path(roots), "offsets", name), "v1\n{}\n")
    reader = CheckpointReader(stream.checkpoint_path(roots))
    assert reader.offset_ids() == [0, 1]
    report: HealthReport = returns(lambda: check_stream(stream, roots))
    [odd] = [finding for finding in report.findings if finding.code == "ODD_LOG_FILE"]
    assert odd.severity.value == "WARN" and odd.evidence["file"].endswith(f"offsets/{name}")


def test_batch_ids_are_plain_bounded_decimals() -> None:
    assert [batch_id(text) for text in ("0", "17", str(2**63 - 1), str(2**63), "1" * 20, "٣", "+1", " 1", "1\n",
                                        "")] == [0, 17, 2**63 - 1, None, None, None, None, None, None, None]
    assert [log_file_batch(name) for name in ("4.compact", "٤.compact", "9" * 30, "3\n")] == [4, None, None, None]


def test_gaps_come_from_neighbours_not_from_the_span() -> None:
    assert gaps([0, 1, 5, 2**62, 2**63 - 1], limit=5) == ([2, 3, 4, 6, 7], 3 + (2**62 - 6) + (2**63 - 2 - 2**62))
    assert gaps([]) == ([], 0) and gaps([3]) == ([], 0) and gaps([1, 2, 3]) == ([], 0)


def test_a_gap_across_the_whole_range_of_ids_is_reported_at_once(world: tuple[Catalog, Roots]) -> None:
    catalog, roots = world
    stream = catalog.get("clicks")
    write(Path(stream.checkpoint_path(roots), "commits", str(2**62)), 'v1\n{}\n')
    report: HealthReport = returns(lambda: check_stream(stream, roots))
    [gap] = [finding for finding in report.findings if finding.code == "GAP"]
    assert gap.evidence["missing_count"] == 2**62 - 2 and gap.evidence["missing"][:2] == [2, 3]


def test_a_file_source_log_offset_of_2_63_is_checked_without_counting_to_it(world: tuple[Catalog, Roots]) -> None:
    catalog, roots = world
    stream = catalog.get("clicks")
    write(Path(stream.checkpoint_path(roots), "offsets", "1"), f'v1\n{{}}\n{{"logOffset":{2**63 - 1}}}\n')
    report: HealthReport = returns(lambda: check_stream(stream, roots))
    [missing] = [finding for finding in report.findings if finding.code == "SOURCE_LOG_MISSING"]
    assert missing.evidence["missing"][:2] == [2, 3] and len(missing.evidence["missing"]) == 100


def test_status_and_the_page_return_when_a_source_log_is_a_fifo(world: tuple[Catalog, Roots]) -> None:
    catalog, roots = world
    fifo(Path(catalog.get("clicks").checkpoint_path(roots), "sources", "0", "1"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert returns(lambda: status.main(["--json"])) == 0
    reports = {report["stream"]: report for report in map(json.loads, out.getvalue().splitlines())}
    assert reports["clicks"]["status"] == "ERROR" and "sources/0/1: not a regular file (a FIFO)" in " ".join(
        reports["clicks"]["reasons"]) and reports["orders"]["status"] == "OK"
    listed = returns(lambda: streams_view.overview(catalog, roots))
    assert [entry["stream"] for entry in listed] == ["clicks", "orders"]


# -- the lag history ------------------------------------------------------------------------------------------------


def hostile_reports(good: dict[str, Any]) -> list[Any]:
    """Rows whose report is not what Sluice writes: each field of another type, markup where a number belongs."""
    def changed(**fields: Any) -> dict[str, Any]:
        return {**good, **fields}

    return ["not json", "[1, 2]", "null", json.dumps(changed(status="PWNED")), json.dumps(changed(status=MARKUP)),
            json.dumps(changed(last_batch_id=MARKUP)), json.dumps(changed(last_batch_id=True)),
            json.dumps(changed(last_batch_id=1.5)), json.dumps(changed(observed_at=MARKUP)),
            json.dumps(changed(last_commit_at=[MARKUP])), json.dumps(changed(stream="orders")),
            json.dumps(changed(reasons=MARKUP)), json.dumps(changed(reasons=[{"x": MARKUP}])),
            json.dumps(changed(backlog=MARKUP)), json.dumps(changed(backlog={**good["backlog"], "files": MARKUP})),
            json.dumps(changed(backlog={**good["backlog"], "oldest_unread_at": "NaN"})),
            json.dumps(changed(backlog={**good["backlog"], "partitions": {"0": MARKUP}})),
            json.dumps(changed(backlog={**good["backlog"], "notes": [1]})),
            json.dumps(changed(newest_event_time=7)), json.dumps(changed(source_type=None)),
            "[" * 100_000 + "]" * 100_000]


def plant_rows(roots: Roots, catalog: Catalog, *, at: float) -> int:
    """A good observation of each stream, then hostile rows of ``clicks`` after it; how many."""
    store = LagStore.for_roots(roots)
    for stream in catalog:
        store.record(check(stream, roots, now=at))
    good = store.history("clicks")[-1].to_dict()
    rows = hostile_reports(good)
    with sqlite3.connect(default_path(roots)) as db:
        db.executemany("INSERT INTO observations VALUES ('clicks', ?, 'OK', 0, 0, 0, 0, 0, ?)",
                       [(at + 1 + index, text) for index, text in enumerate(rows)])
        db.execute("INSERT INTO alert_channel_state VALUES ('clicks', 'email', ?, 'x', 'y')", (MARKUP,))
    return len(rows)


def test_a_bad_row_of_the_lag_history_is_skipped_and_logged(world: tuple[Catalog, Roots],
                                                            caplog: pytest.LogCaptureFixture) -> None:
    catalog, roots = world
    planted = plant_rows(roots, catalog, at=1_795_000_000)
    store = LagStore.for_roots(roots)
    history = store.history("clicks", limit=100)
    assert [report.observation.last_batch_id for report in history] == [1]
    assert len([record for record in caplog.records if "skipped" in record.getMessage()]) == planted
    assert store.alert_state("clicks", "email") is None


def test_status_and_the_page_show_every_stream_over_bad_rows(world: tuple[Catalog, Roots]) -> None:
    catalog, roots = world
    plant_rows(roots, catalog, at=1_795_000_000)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert status.main([]) == 0
    assert out.getvalue().splitlines()[1].startswith("clicks") and MARKUP not in out.getvalue()
    listed = streams_view.overview(catalog, roots, now=1_795_000_100)
    assert [(entry["stream"], entry["last_batch_id"]) for entry in listed] == [("clicks", 1), ("orders", None)]
    assert MARKUP not in json.dumps(listed)
    detail = streams_view.detail(catalog.get("clicks"), roots, now=1_795_000_100)
    assert MARKUP not in json.dumps(detail, default=str) and len(detail["backlog"]) == 1


# -- what reaches a terminal ----------------------------------------------------------------------------------------


def test_printable_escapes_what_a_terminal_would_act_on() -> None:
    hostile = "a\x1b[2Jb\x07c\r\nd\x9b31me\u202ef\udcff g\x00é"
    assert printable(hostile) == "a\\x1b[2Jb\\x07c\\x0d\\x0ad\\x9b31me\\u202ef\\xff g\\x00é"


def test_the_health_command_escapes_a_landing_file_name(world: tuple[Catalog, Roots]) -> None:
    _, roots = world
    Path(roots.landing, "events", "x\x1b]0;owned\x07\x1b[2J.json").symlink_to("/etc/hostname")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        health_cli.main(["--stream", "clicks"])
    assert "LANDING_SYMLINK" in out.getvalue() and "\x1b" not in out.getvalue() and "\x07" not in out.getvalue()
    assert "x\\x1b]0;owned\\x07\\x1b[2J.json" in out.getvalue()


# -- writes ---------------------------------------------------------------------------------------------------------


def test_a_write_never_goes_through_a_link_planted_at_its_temporary_name(tmp_path: Path) -> None:
    place = LocalFolder(tmp_path / "checkpoint")
    place.path.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    for name in (f".metadata.{os.getpid()}.tmp", ".metadata.tmp", "metadata.tmp"):
        (place.path / name).symlink_to(victim)
    place.write_bytes("metadata", b'{"id": "q"}\n')
    assert victim.read_text() == "keep me" and place.read_text("metadata") == '{"id": "q"}\n'
    assert oct((place.path / "metadata").stat().st_mode & 0o777) == oct(0o644)


# -- the catalog the page reads -------------------------------------------------------------------------------------


def test_the_page_parses_the_catalog_again_only_when_its_file_changes(tmp_path: Path) -> None:
    path = write_catalog(tmp_path, events_stream("clicks"))
    first = cached_catalog(path)
    assert cached_catalog(path) is first
    write_catalog(tmp_path, events_stream("clicks"), events_stream("views", source={**events_stream()["source"],
                                                                                   "path": "views"}))
    second = cached_catalog(path)
    assert list(second.streams) == ["clicks", "views"]
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1))
    assert cached_catalog(path) is not second
