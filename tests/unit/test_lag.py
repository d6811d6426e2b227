"""Lag without Spark: Kafka offsets behind from checkpoint offset files in Spark's format, Delta versions behind from a
real delta-rs table, the status rules, the lag store and the alert policy."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from sluice.errors import SluiceError
from sluice.kinds.base import Backlog
from sluice.kinds.delta import delta_backlog, delta_next_version
from sluice.kinds.kafka import kafka_backlog, kafka_watermarks
from sluice.lag.alerting import AlertKind, decide
from sluice.lag.observe import LagObservation, LagReport, LagStatus, evaluate
from sluice.lag.store import LagStore
from sluice.model.stream import AlertSpec
from sluice.storage.checkpoint import CheckpointReader

T0 = 1_795_000_000.0


def spark_checkpoint(root: Path, batches: dict[int, str], committed: list[int]) -> CheckpointReader:
    """A checkpoint laid out as Spark 4 writes it: offsets/N (version, batch metadata, one line per source) and
    commits/N."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
    for batch, source_line in batches.items():
        metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 1795000000000 + batch,
                    "conf": {"spark.sql.streaming.stateStore.providerClass": "x"}}
        (root / "offsets" / str(batch)).write_text(f"v1\n{json.dumps(metadata)}\n{source_line}")
    for batch in committed:
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    return CheckpointReader(root)


def test_kafka_offsets_behind_per_partition_from_the_last_committed_batch(tmp_path: Path) -> None:
    # Batch 1 was planned but not committed: the next run starts from batch 0's end offsets.
    reader = spark_checkpoint(tmp_path / "ckpt", {0: '{"events":{"1":100,"0":120,"2":7}}',
                                                  1: '{"events":{"1":150,"0":170,"2":9}}'}, committed=[0])
    processed = reader.committed_source_offset()
    assert processed == {"events": {"1": 100, "0": 120, "2": 7}}
    watermarks = {("events", 0): (0, 200), ("events", 1): (0, 100), ("events", 2): (50, 60),
                  ("events", 3): (5, 45)}
    backlog = kafka_backlog(processed, watermarks)
    assert backlog.partitions == {"events:0": 80, "events:1": 0, "events:2": 10, "events:3": 40}
    assert backlog.records == 130
    assert backlog.new_partitions == ["events:3"]
    assert "events:2: offsets 7..49 were deleted by retention" in backlog.notes[0]
    assert backlog.files is None and not backlog.empty


def test_kafka_backlog_before_the_first_commit_follows_starting_offsets() -> None:
    watermarks = {("a", 0): (10, 15), ("a", 1): (0, 8), ("b", 0): (0, 0)}
    assert kafka_backlog(None, watermarks).records == 0, "Spark's default for a stream is latest"
    assert kafka_backlog(None, watermarks, starting_offsets="earliest").partitions == {"a:0": 5, "a:1": 8, "b:0": 0}
    assert kafka_backlog(None, watermarks, starting_offsets={"a": {"0": 12, "1": -2}}).partitions == {
        "a:0": 3, "a:1": 8, "b:0": 0}
    with pytest.raises(SluiceError, match="startingOffsets 'oldest'"):
        kafka_backlog(None, watermarks, starting_offsets="oldest")


@pytest.mark.kafka
def test_kafka_lag_against_a_real_broker(tmp_path: Path, kafka: Any) -> None:
    """Offsets behind, from the broker's end offsets (confluent-kafka, no JVM), equal what the broker itself says a
    consumer at the checkpoint's offsets lags: its committed offsets for a group, read back through the admin API."""
    from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    from sluice.cli.kafka_broker import create_topic

    topic = f"sluice-lag-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 2)
    producer = Producer(kafka.client_config())
    for index in range(30):
        producer.produce(topic, value=b"x", partition=index % 2)
    assert producer.flush(30) == 0
    reader = spark_checkpoint(tmp_path / "ckpt", {0: json.dumps({topic: {"0": 5, "1": 9}})}, committed=[0])
    backlog = kafka_backlog(reader.committed_source_offset(), kafka_watermarks(kafka.client_config(),
                                                                             topics=[topic]))
    assert backlog.partitions == {f"{topic}:0": 10, f"{topic}:1": 6}
    assert backlog.records == 16
    group = f"oracle-{topic}"
    consumer = Consumer({**kafka.client_config(), "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, 5), TopicPartition(topic, 1, 9)], asynchronous=False)
    consumer.close()
    admin = AdminClient(kafka.client_config())
    [listed] = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
    committed = {(tp.topic, tp.partition): tp.offset for tp in listed.result(30).topic_partitions}
    ends = kafka_watermarks(kafka.client_config(), topics=[topic])
    broker_lag = {f"{t}:{p}": ends[(t, p)][1] - offset for (t, p), offset in committed.items()}
    assert backlog.partitions == broker_lag


def test_delta_versions_bytes_and_records_behind(tmp_path: Path) -> None:
    path = str(tmp_path / "silver")
    for rows in (3, 5, 7):
        write_deltalake(path, pa.table({"id": list(range(rows))}), mode="append")
    table = DeltaTable(path)
    files_at_v0 = set(DeltaTable(path, version=0).file_uris())
    newer = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    added = [a for a in newer if os.path.join(path, a["path"]) not in files_at_v0 and a["path"] not in files_at_v0]

    next_version = delta_next_version({"sourceVersion": 1, "reservoirId": "x", "reservoirVersion": 1, "index": -1,
                                       "isStartingVersion": False})
    assert next_version == 1
    backlog = delta_backlog(path, next_version)
    assert backlog.versions == 2
    assert backlog.records == 12
    assert backlog.bytes == sum(a["size_bytes"] for a in added)
    assert backlog.oldest_unread_at == table.history()[-2]["timestamp"] / 1000

    assert delta_next_version({"reservoirVersion": 2, "index": 0}) == 3
    assert delta_backlog(path, delta_next_version({"version": 2})).empty
    with pytest.raises(SluiceError, match="not a Delta source offset"):
        delta_next_version({"logOffset": 3})


def observation(units: int, *, at: float, batch: int | None = 4, commit_at: float | None = T0,
                oldest: float | None = None, bytes_: int = 0) -> LagObservation:
    return LagObservation("s", "files", at, Backlog(files=units, bytes=bytes_, oldest_unread_at=oldest),
                          last_batch_id=batch, last_commit_at=commit_at)


def test_error_reports_say_what_failed() -> None:
    from sluice.catalog import parse_stream
    from sluice.lag.observe import error_report
    from tests.helpers import events_stream

    stream = parse_stream(events_stream(), index=0)
    failed = error_report(stream, ValueError("offsets/7: line 2 is not JSON"), now=T0)
    assert failed.status is LagStatus.ERROR
    assert failed.reasons == ["ERROR: the lag could not be measured: offsets/7: line 2 is not JSON"]
    assert LagReport.from_dict(json.loads(json.dumps(failed.to_dict()))).status is LagStatus.ERROR


def test_thresholds_per_measure() -> None:
    alerts = AlertSpec(warn_files=10, critical_files=100, warn_bytes=1000, warn_seconds=60, critical_seconds=600)
    assert evaluate(observation(0, at=T0), alerts).status is LagStatus.OK
    assert evaluate(observation(9, at=T0, oldest=T0 - 59), alerts).status is LagStatus.OK
    assert evaluate(observation(10, at=T0), alerts).status is LagStatus.WARN
    assert evaluate(observation(1, at=T0, bytes_=1000), alerts).reasons == ["WARN: 1,000 bytes behind (warn at 1,000)"]
    report = evaluate(observation(1, at=T0, oldest=T0 - 600), alerts)
    assert report.status is LagStatus.CRITICAL
    assert report.reasons == ["CRITICAL: 600 seconds behind (critical at 600)"]
    assert evaluate(observation(100, at=T0), alerts).status is LagStatus.CRITICAL


def test_stalled_needs_a_full_window_of_growth_without_a_commit() -> None:
    alerts = AlertSpec(stall_observations=3)
    grow = [observation(n, at=T0 + i) for i, n in enumerate((1, 2))]
    assert evaluate(observation(3, at=T0 + 2), alerts, grow).status is LagStatus.STALLED
    assert evaluate(observation(3, at=T0 + 2), alerts, grow[1:]).status is LagStatus.OK, "window not full"
    assert evaluate(observation(1, at=T0 + 2), alerts, grow).status is LagStatus.OK, "shrank"
    committed = [observation(1, at=T0, batch=3), observation(2, at=T0 + 1)]
    assert evaluate(observation(3, at=T0 + 2), alerts, committed).status is LagStatus.OK, "a batch committed"
    dip = [observation(2, at=T0), observation(1, at=T0 + 1)]
    assert evaluate(observation(3, at=T0 + 2), alerts, dip).status is LagStatus.OK, "not monotonic"


def test_stopped_needs_a_backlog_older_than_the_threshold_and_no_commit_since() -> None:
    alerts = AlertSpec(stale_after_seconds=600)
    assert evaluate(observation(1, at=T0 + 601, oldest=T0 - 10), alerts).status is LagStatus.STOPPED
    assert evaluate(observation(0, at=T0 + 6000), alerts).status is LagStatus.OK, "no backlog: nothing waits"
    assert evaluate(observation(1, at=T0 + 601, oldest=T0 + 300), alerts).status is LagStatus.OK, "data is fresh"
    never = observation(1, at=T0, batch=None, commit_at=None, oldest=T0 - 601)
    report = evaluate(never, alerts)
    assert report.status is LagStatus.STOPPED and "no batch ever committed" in report.reasons[0]


def test_store_keeps_history_in_order_and_drops_what_is_past_retention(tmp_path: Path) -> None:
    store = LagStore(tmp_path / "lag.sqlite", retention_days=1)
    for hours in (0, 12, 30):
        store.record(LagReport(observation(hours, at=T0 + hours * 3600), LagStatus.OK))
    assert [seen.backlog.files for seen in store.observations("s")] == [12, 30]
    assert store.count("s") == 2
    assert store.observations("s", limit=1)[0].backlog.files == 30


def report(status: LagStatus, at: float) -> LagReport:
    return LagReport(observation(1, at=at), status, [f"{status.value}: because"])


def test_alert_policy_fires_once_escalates_resolves_and_reminds_only_when_asked() -> None:
    sent = []
    state = None
    for at, status in enumerate([LagStatus.OK, LagStatus.WARN, LagStatus.WARN, LagStatus.CRITICAL, LagStatus.WARN,
                                 LagStatus.WARN, LagStatus.CRITICAL, LagStatus.STOPPED, LagStatus.OK, LagStatus.OK]):
        alert, new_state = decide(state, report(status, T0 + at), channel="webhook")
        if alert:
            sent.append((alert.kind, alert.status, alert.previous))
        state = new_state or state
    assert sent == [(AlertKind.FIRING, LagStatus.WARN, LagStatus.OK),
                    (AlertKind.ESCALATED, LagStatus.CRITICAL, LagStatus.WARN),
                    # CRITICAL -> WARN is kept without a message, so that the return to CRITICAL escalates again
                    (AlertKind.ESCALATED, LagStatus.CRITICAL, LagStatus.WARN),
                    (AlertKind.ESCALATED, LagStatus.STOPPED, LagStatus.CRITICAL),
                    (AlertKind.RESOLVED, LagStatus.OK, LagStatus.STOPPED)]
    assert state is not None and (state.channel, state.status) == ("webhook", LagStatus.OK)

    firing, state = decide(None, report(LagStatus.WARN, T0))
    assert firing is not None and state is not None
    assert decide(state, report(LagStatus.WARN, T0 + 100), repeat_after_seconds=3600) == (None, None)
    reminder, _ = decide(state, report(LagStatus.WARN, T0 + 3600), repeat_after_seconds=3600)
    assert reminder is not None and reminder.kind is AlertKind.REMINDER


def test_store_keeps_alert_state_per_channel(tmp_path: Path) -> None:
    store = LagStore(tmp_path / "lag.sqlite")
    _, state = decide(None, report(LagStatus.WARN, T0), channel="email")
    assert state is not None
    store.save_alert_state(state)
    assert store.alert_state("s", "email") == state
    assert store.alert_state("s", "webhook") is None


def test_alert_messages_say_what_and_carry_the_report() -> None:
    alert, _ = decide(None, report(LagStatus.CRITICAL, T0))
    assert alert is not None
    assert alert.title == "[Sluice] CRITICAL: stream s"
    assert "- CRITICAL: because" in alert.text()
    payload = json.loads(json.dumps(alert.payload()))
    assert payload["text"].startswith("[Sluice] CRITICAL")
    assert payload["sluice"]["report"]["backlog"]["files"] == 1


def test_status_view_prints_every_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from sluice.cli.status import NO_REASONS, main
    from tests.helpers import events_stream, write_catalog

    catalog = write_catalog(tmp_path, events_stream(alerts={"warn_files": 2}), events_stream(
        "quiet", source={**events_stream()["source"], "path": "quiet"}))
    day = tmp_path / "landing" / "events" / "2026-11-22"
    day.mkdir(parents=True)
    for index in range(3):
        (day / f"e{index}.json").write_text('{"event_id": "e"}\n')
    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    assert main(["--catalog", str(catalog), "--record", "--reasons"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["STREAM", "STATUS", "FILES"]
    assert lines[1].split()[:5] == ["events", "WARN", "3", "54", "B"]
    assert lines[2].split()[:3] == ["quiet", "OK", "0"]
    assert "events: WARN: 3 files behind (warn at 2)" in lines
    assert LagStore(tmp_path / "checkpoints" / "_sluice" / "lag.sqlite").count() == 2

    assert main(["--catalog", str(catalog), "--json", "--stream", "events"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["status"], printed["backlog"]["files"], printed["health"]) == ("WARN", 3, "OK")
    assert main(["--catalog", str(catalog), "--stream", "nope"]) == 2
    capsys.readouterr()
    assert main(["--catalog", str(catalog), "--stream", "quiet", "--reasons"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == NO_REASONS


def test_a_resolve_waits_for_enough_ok_observations_in_a_row(tmp_path: Path) -> None:
    store = LagStore(tmp_path / "lag.sqlite")
    _, state = decide(None, report(LagStatus.WARN, T0))
    statuses = [LagStatus.WARN, LagStatus.OK, LagStatus.WARN, LagStatus.OK, LagStatus.OK, LagStatus.OK]
    kinds = []
    for at, status in enumerate(statuses, start=1):
        store.record(report(status, T0 + at))
        alert, new_state = decide(state, report(status, T0 + at), ok_streak=store.ok_streak("s", limit=3),
                                  resolve_after=3)
        kinds.append(alert.kind if alert else None)
        state = new_state or state
    # The flap back to WARN sends nothing (the alert is still open); the resolve comes with the third OK in a row.
    assert kinds == [None, None, None, None, None, AlertKind.RESOLVED]
    assert store.ok_streak("s") == 3
