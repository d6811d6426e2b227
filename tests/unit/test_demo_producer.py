from __future__ import annotations

import csv
import json
from datetime import datetime, timezone
from pathlib import Path

from sluice.demo_producer import DemoProducer
from tests.helpers import expected_events


def test_counts_match_the_files(tmp_path: Path) -> None:
    producer = DemoProducer(tmp_path, seed=3, malformed_rate=0.1, duplicate_rate=0.1, late_rate=0.2)
    batch = producer.produce(files=2, lines=100, now=datetime(2026, 3, 29, 1, 30, tzinfo=timezone.utc))
    lines = [line for path in batch.files if path.suffix == ".json" for line in path.read_text().splitlines()]
    assert len(lines) == batch.event_lines
    assert batch.malformed > 0 and batch.duplicates > 0 and batch.late > 0
    good, bad = expected_events(tmp_path / "events")
    assert (len(good), bad) == (batch.events + batch.duplicates, batch.malformed)
    ids = [json.loads(line)["event_id"] for line in lines if line.endswith("}") and "twelve" not in line]
    assert len(ids) > len(set(ids)), "duplicates repeat an event_id"
    with next(p for p in batch.files if p.suffix == ".csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == batch.orders + batch.malformed_orders


def test_files_appear_atomically(tmp_path: Path) -> None:
    DemoProducer(tmp_path, seed=1).produce(files=3)
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")], "no temporary file is left behind"


def test_same_seed_same_data(tmp_path: Path) -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    first = DemoProducer(tmp_path / "a", seed=5).produce(files=1, now=now)
    second = DemoProducer(tmp_path / "b", seed=5).produce(files=1, now=now)
    assert first.files[0].read_text() == second.files[0].read_text()
