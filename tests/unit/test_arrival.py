"""Arrival-driven runs without Airflow: the catalog's ``arrival`` block, what each source kind counts as unread data,
and the debounce that decides when new data starts a run (a burst is one run, a trickle still runs)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import parse_catalog
from sluice.cli.demo_producer import DemoProducer
from sluice.errors import CatalogError
from sluice.kinds.kafka import kafka_backlog
from sluice.lag.arrival import ArrivalWatch, unread
from sluice.model.stream import ArrivalSpec
from tests.helpers import events_stream, roots_in, write_catalog

NOW = dt.datetime(2026, 11, 27, 9, 0, tzinfo=dt.timezone.utc)


def catalog_of(**overrides: Any) -> Any:
    return parse_catalog({"version": 1, "streams": [events_stream(**overrides)]})


def refused(message: str, **overrides: Any) -> None:
    with pytest.raises(CatalogError) as caught:
        catalog_of(**overrides)
    assert message in str(caught.value), str(caught.value)
    assert "\n" not in str(caught.value)


# --- the catalog ------------------------------------------------------------------------------------------------


def test_arrival_takes_durations_and_makes_the_schedule_optional() -> None:
    stream = catalog_of(arrival={"settle": "10s", "max_wait": "2 minutes", "min_interval": "1 minute"},
                        schedule=None).get("events")
    assert stream.arrival == ArrivalSpec(poll_seconds=5, settle_seconds=10, max_wait_seconds=120,
                                         min_interval_seconds=60)
    assert stream.schedule is None
    assert catalog_of(arrival={}).get("events").arrival == ArrivalSpec()
    assert catalog_of().get("events").arrival is None


def test_bad_arrival_blocks_are_refused_naming_the_field() -> None:
    refused("arrival.settle: must not be longer than max_wait", arrival={"settle": "2m", "max_wait": "1m"})
    refused("arrival.poll: expected a positive duration", arrival={"poll": "soon"})
    refused("arrival: unknown key(s) debounce", arrival={"debounce": "5s"})
    refused("schedule", schedule=None)  # neither a cron nor arrival: nothing would ever start the stream
    refused("arrival: the streams of group 'g' run together", arrival={}, group="g")


# --- what is unread, by identity --------------------------------------------------------------------------------


def test_a_files_stream_s_unread_data_is_its_unread_files(tmp_path: Path) -> None:
    stream = parse_catalog({"version": 1, "streams": [events_stream(arrival={})]}).get("events")
    roots = roots_in(tmp_path)
    assert unread(stream, roots) == frozenset()
    producer = DemoProducer(tmp_path / "landing", seed=1, malformed_rate=0.0)
    written = {path for minute in range(2)
               for path in producer.events_file(lines=3, now=NOW + dt.timedelta(minutes=minute)).files}
    assert {Path(path).name for path in unread(stream, roots)} == {Path(path).name for path in written}


def test_a_topic_s_unread_data_is_each_lagging_partition_s_end_offset() -> None:
    marks = {("t", 0): (0, 10), ("t", 1): (0, 5), ("t", 2): (0, 7)}
    backlog = kafka_backlog({"t": {"0": 10, "1": 2, "2": 0}}, marks)
    assert backlog.arrivals == frozenset({"t:1@5", "t:2@7"})
    moved = kafka_backlog({"t": {"0": 10, "1": 2, "2": 0}}, {**marks, ("t", 1): (0, 9)})
    assert moved.arrivals - backlog.arrivals == {"t:1@9"}, "more records on a partition are new data"


# --- the debounce -----------------------------------------------------------------------------------------------


def watch(**seconds: int) -> ArrivalWatch:
    return ArrivalWatch(ArrivalSpec(**{f"{name}_seconds": value for name, value in seconds.items()}))


def test_a_burst_is_one_start_once_it_settles() -> None:
    arrivals = watch(poll=1, settle=3, max_wait=60)
    assert arrivals.look(frozenset({"a"}), 0) is None
    assert arrivals.look(frozenset({"a", "b"}), 1) is None
    assert arrivals.look(frozenset({"a", "b", "c"}), 2) is None
    assert arrivals.look(frozenset({"a", "b", "c"}), 4) is None, "settles 3 s after the last change (at 2)"
    started = arrivals.look(frozenset({"a", "b", "c"}), 5)
    assert started is not None and started.new == 3 and started.waited_seconds == 5
    assert [arrivals.look(frozenset({"a", "b", "c"}), t) for t in range(6, 30)] == [None] * 24, \
        "what a start covered never starts another"


def test_a_steady_trickle_starts_a_run_at_max_wait() -> None:
    arrivals = watch(poll=1, settle=5, max_wait=10)
    starts = [t for t in range(0, 25) if arrivals.look(frozenset(str(i) for i in range(t + 1)), t) is not None]
    assert starts == [10, 21], "a file every second never settles; each wait is capped at max_wait"


def test_what_the_run_read_leaves_and_new_data_after_it_starts_the_next_run() -> None:
    arrivals = watch(poll=1, settle=1, max_wait=10)
    assert arrivals.look(frozenset({"a", "b"}), 0) is None
    assert arrivals.look(frozenset({"a", "b"}), 1) is not None
    assert arrivals.look(frozenset({"a", "b"}), 2) is None, "the run has not committed yet: nothing new"
    assert arrivals.look(frozenset(), 3) is None, "the run committed"
    assert arrivals.announced == frozenset(), "what the run read is forgotten"
    assert arrivals.look(frozenset({"c"}), 4) is None
    again = arrivals.look(frozenset({"c"}), 5)
    assert again is not None and again.examples == ("c",)


def test_data_arriving_during_a_run_starts_one_more_run_for_itself_only() -> None:
    arrivals = watch(poll=1, settle=1, max_wait=10)
    arrivals.look(frozenset({"a"}), 0)
    assert arrivals.look(frozenset({"a"}), 1) is not None
    assert arrivals.look(frozenset({"a", "b"}), 2) is None
    later = arrivals.look(frozenset({"a", "b"}), 3)
    assert later is not None and later.new == 1 and later.examples == ("b",)


def test_min_interval_holds_back_a_second_start() -> None:
    arrivals = watch(poll=1, settle=1, max_wait=2, min_interval=10)
    arrivals.look(frozenset({"a"}), 0)
    assert arrivals.look(frozenset({"a"}), 1) is not None
    assert [t for t in range(2, 15) if arrivals.look(frozenset({"a", "b"}), t) is not None] == [11]


def test_the_next_look_comes_when_the_settle_time_ends_not_a_poll_later() -> None:
    arrivals = watch(poll=30, settle=4, max_wait=60)
    assert arrivals.next_look_in(0) == 30, "nothing pending: the poll interval"
    arrivals.look(frozenset({"a"}), 10)
    assert arrivals.next_look_in(11) == 3
    assert arrivals.look(frozenset({"a"}), 14) is not None


# --- the trigger, on the triggerer's event loop ------------------------------------------------------------------


def test_the_trigger_fires_once_for_a_burst_of_files_and_again_for_a_later_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_airflow.triggers import StreamArrivalTrigger

    monkeypatch.setenv("SLUICE_CATALOG", str(write_catalog(tmp_path, events_stream(
        arrival={"poll": "1s", "settle": "1s", "max_wait": "10s"}))))
    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    producer = DemoProducer(tmp_path / "landing", seed=3, malformed_rate=0.0)
    trigger = StreamArrivalTrigger(stream="events", storage_conn_id=None)
    classpath, kwargs = trigger.serialize()
    assert classpath == "sluice_airflow.triggers.StreamArrivalTrigger" and kwargs == {
        "stream": "events", "storage_conn_id": None}

    async def scenario() -> list[dict[str, Any]]:
        events = trigger.run()
        for minute in range(3):  # a burst
            producer.events_file(lines=2, now=NOW + dt.timedelta(minutes=minute))
        first = await asyncio.wait_for(anext(events), timeout=20)
        pending = asyncio.ensure_future(anext(events))
        done, _ = await asyncio.wait({pending}, timeout=3)
        assert not done, "the burst started one run, not one per file"
        producer.events_file(lines=2, now=NOW + dt.timedelta(minutes=10))
        second = await asyncio.wait_for(pending, timeout=20)
        await events.aclose()
        return [first.payload, second.payload]

    first, second = asyncio.run(scenario())
    assert first["stream"] == "events" and first["new"] == 3
    assert second["new"] == 1


def test_a_file_landing_in_a_local_folder_is_seen_when_it_lands_not_a_poll_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_airflow.triggers import StreamArrivalTrigger

    monkeypatch.setenv("SLUICE_CATALOG", str(write_catalog(tmp_path, events_stream(
        arrival={"poll": "60s", "settle": "1s", "max_wait": "10s"}))))
    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    producer = DemoProducer(tmp_path / "landing", seed=3, malformed_rate=0.0)
    producer.events_file(lines=2, now=NOW)  # read by no run yet: announced by the first look
    trigger = StreamArrivalTrigger(stream="events", storage_conn_id=None)

    async def scenario() -> tuple[float, dict[str, Any]]:
        events = trigger.run()
        await asyncio.wait_for(anext(events), timeout=20)
        pending = asyncio.ensure_future(anext(events))
        await asyncio.sleep(1.5)  # the watcher waits for its next look, a minute away
        landed = time.monotonic()
        producer.events_file(lines=2, now=NOW + dt.timedelta(minutes=1))
        second = await asyncio.wait_for(pending, timeout=20)
        fired = time.monotonic() - landed
        await events.aclose()
        return fired, second.payload

    fired, payload = asyncio.run(scenario())
    assert payload["new"] == 1
    # The upper bound is far from the minute's poll, not close to the settle time: a loaded machine adds seconds.
    assert 1.0 <= fired < 30, f"fired {fired:.1f}s after the file landed: the settle time, not the minute's poll"


def test_a_stream_on_arrival_checks_its_health_in_its_run_task_unless_the_catalog_says_otherwise() -> None:
    from sluice.constants import HealthGate

    assert catalog_of(arrival={}).get("events").health_gate is HealthGate.INLINE
    assert catalog_of(arrival={}, health_gate="task").get("events").health_gate is HealthGate.TASK
    assert catalog_of().get("events").health_gate is HealthGate.TASK
