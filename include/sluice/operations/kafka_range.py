"""The offsets a range backfill of a Kafka source reads: offsets per partition, or a time range resolved to offsets
with Kafka's offsets-for-times, checked against the brokers and the live stream's checkpoint before anything is read.

Both kinds of range end as offsets: ``[first, last]`` (both included) per topic partition. A time range ``[start,
end)`` takes, in each partition, the offsets from the first record whose timestamp is at or after ``start`` to the
last one before the first record at or after ``end`` (what a consumer seeking by time reads; with producer
timestamps out of order within a partition, the offsets between are taken whole).

The rows a table holds from a range are known by their lineage: a Kafka source's ``_source_file`` is
``kafka://<topic>/<partition>/<offset>`` (the dead-letter table's ``source_file`` too), so ``replace`` swaps out
exactly the rows of those offsets, and ``append`` reads only the offsets neither table holds yet.

Every refusal names the param it is about (:class:`~sluice.errors.BackfillError`): an offsets value that is not
``{"<partition>": [first, last]}`` (or ``{"<topic>": {...}}``), a topic the stream does not read, a partition the
topic does not have, a first offset below the partition's earliest (deleted by retention), a last offset past its
latest, or past what the live stream has read (its next run reads them), and a selection with nothing in it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sluice.errors import BackfillError

# (topic, partition) -> (earliest offset, end offset), as :func:`sluice.kinds.kafka.kafka_watermarks` reads them.
Watermarks = Mapping[tuple[str, int], tuple[int, int]]
# {topic: {"<partition>": [first, last]}}: a request's offsets, normalized.
Offsets = dict[str, dict[str, list[int]]]
LINEAGE_PREFIX = "kafka://"


@dataclass(frozen=True)
class PartitionRange:
    """Offsets ``first`` to ``last`` (both included) of one topic partition."""

    topic: str
    partition: int
    first: int
    last: int

    @property
    def offsets(self) -> int:
        return self.last - self.first + 1

    @property
    def key(self) -> str:
        return f"{self.topic}:{self.partition}"


@dataclass
class KafkaRange:
    """What a Kafka range backfill selects (``ranges``: what ``replace`` swaps out) and reads (``read``: the same,
    or for ``append`` the offsets of it the tables do not hold yet)."""

    ranges: list[PartitionRange]
    read: list[PartitionRange] = field(default_factory=list)
    held_offsets: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def offsets(self) -> int:
        return sum(part.offsets for part in self.ranges)

    def per_partition(self) -> dict[str, dict[str, int]]:
        """The dry run's counts: per ``topic:partition``, its first and last offset, the offsets selected and the
        offsets to read."""
        counts: dict[str, dict[str, int]] = {}
        for part in self.ranges:
            counts[part.key] = {"first": part.first, "last": part.last, "offsets": part.offsets, "to_read": 0}
        for part in self.read:
            counts[part.key]["to_read"] += part.offsets
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {"ranges": [asdict(part) for part in self.ranges], "read": [asdict(part) for part in self.read],
                "held_offsets": self.held_offsets, "notes": list(self.notes), "offsets": self.offsets,
                "partitions": self.per_partition()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KafkaRange:
        return cls(ranges=[PartitionRange(**part) for part in data["ranges"]],
                   read=[PartitionRange(**part) for part in data["read"]], held_offsets=int(data["held_offsets"]),
                   notes=list(data.get("notes") or ()))


def parse_offsets(value: object, topics: Sequence[str], pattern: str | None) -> Offsets:
    """A request's ``offsets``: ``{"<partition>": [first, last]}`` for a stream that reads one topic, or
    ``{"<topic>": {"<partition>": [first, last]}}``; a mapping or its JSON text. Checked without the brokers."""
    shape = 'expected JSON such as {"0": [10, 50], "1": [0, 20]} (first and last offset of each partition, both ' \
            'included), or {"<topic>": {"0": [10, 50]}}'
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise BackfillError("offsets", f"not valid JSON ({exc.msg}); {shape}") from None
    if not isinstance(value, Mapping) or not value:
        raise BackfillError("offsets", f"{shape}, got {value!r}")
    if all(isinstance(bounds, list) for bounds in value.values()):
        if len(topics) != 1:
            raise BackfillError("offsets", f"the stream reads {', '.join(topics) or 'the topics of a pattern'}: name "
                                           'the topic, e.g. {"<topic>": {"0": [10, 50]}}')
        value = {topics[0]: value}
    offsets: Offsets = {}
    for topic, partitions in value.items():
        if not isinstance(partitions, Mapping) or not partitions:
            raise BackfillError("offsets", f"{shape}, got {value!r}")
        if topic not in topics and not (pattern and re.fullmatch(pattern, str(topic))):
            raise BackfillError("offsets", f"the stream does not read topic {topic!r}; it reads "
                                           f"{', '.join(topics) or f'the topics matching {pattern!r}'}")
        for partition, bounds in partitions.items():
            if not re.fullmatch(r"[0-9]{1,9}", str(partition)):
                raise BackfillError("offsets", f"partition {partition!r} of {topic}: expected a partition number")
            if (not isinstance(bounds, list) or len(bounds) != 2
                    or any(isinstance(b, bool) or not isinstance(b, int) or b < 0 for b in bounds)):
                raise BackfillError("offsets", f"partition {partition} of {topic}: expected [first, last] offsets "
                                               f"(integers from 0), got {bounds!r}")
            if bounds[0] > bounds[1]:
                raise BackfillError("offsets", f"partition {partition} of {topic}: first offset {bounds[0]} is "
                                               f"after the last, {bounds[1]}")
            offsets.setdefault(str(topic), {})[str(int(partition))] = [bounds[0], bounds[1]]
    return offsets


def check_offsets(offsets: Offsets, watermarks: Watermarks, committed: Mapping[str, Mapping[str, int]] | None,
                  ) -> list[PartitionRange]:
    """The requested offsets as ranges, each checked against its partition's watermarks (retention, the latest
    offset) and the live stream's checkpoint (``committed``: its next offset per partition): offsets the live
    stream has not read yet are its next run's."""
    ranges = []
    for topic, partitions in sorted(offsets.items()):
        for partition, (first, last) in sorted(partitions.items(), key=lambda item: int(item[0])):
            marks = watermarks.get((topic, int(partition)))
            if marks is None:
                known = sorted(p for t, p in watermarks if t == topic)
                raise BackfillError("offsets", f"topic {topic} has no partition {partition}; it has "
                                               f"{', '.join(map(str, known)) or 'none'}")
            earliest, end = marks
            if first < earliest:
                raise BackfillError("offsets", f"{topic}:{partition}: offset {first} was deleted by retention; the "
                                               f"earliest the topic holds is {earliest}")
            if last >= end:
                raise BackfillError("offsets", f"{topic}:{partition}: offset {last} is past the latest, "
                                               f"{end - 1}" if end > earliest else
                                               f"{topic}:{partition}: the partition holds no record")
            read_to = _committed(committed, topic, int(partition))
            if last >= read_to:
                raise BackfillError("offsets", f"{topic}:{partition}: the live stream has read up to offset "
                                               f"{read_to - 1}; offsets after it are its next run's, not a "
                                               "backfill's")
            ranges.append(PartitionRange(topic, int(partition), first, last))
    return ranges


def time_ranges(starts: Mapping[tuple[str, int], int], ends: Mapping[tuple[str, int], int], watermarks: Watermarks,
                committed: Mapping[str, Mapping[str, int]] | None, *, start: datetime,
                end: datetime) -> tuple[list[PartitionRange], list[str]]:
    """A time range's offsets: per partition from the first offset at or after ``start`` (``starts``, Kafka's
    offsets-for-times; -1 when there is none) up to the one before the first at or after ``end`` (``ends``), less
    what the live stream has not read yet (a note says how much). Refused when retention may have deleted records of
    the range, and when nothing is left."""
    ranges, notes = [], []
    for (topic, partition), (earliest, high) in sorted(watermarks.items()):
        first = starts.get((topic, partition), -1)
        stop = ends.get((topic, partition), -1)
        first = high if first < 0 else first
        stop = high if stop < 0 else stop
        if first >= stop:
            continue
        if first == earliest and earliest > 0:
            raise BackfillError("start", f"{topic}:{partition}: its records before offset {earliest} were deleted "
                                         f"by retention, and some may have been at or after {start.isoformat()}; "
                                         "start the range at the earliest record's time or later")
        read_to = _committed(committed, topic, partition)
        if stop > read_to:
            notes.append(f"{topic}:{partition}: offsets {max(first, read_to)} to {stop - 1} are not read by the "
                         "live stream yet; its next run ingests them, so the backfill leaves them alone")
            stop = read_to
        if first < stop:
            ranges.append(PartitionRange(topic, partition, first, stop - 1))
    if not ranges:
        raise BackfillError("start", f"no record the live stream has read has a timestamp from {start.isoformat()} "
                                     f"to {end.isoformat()}: there is nothing to backfill")
    return ranges, notes


def _committed(committed: Mapping[str, Mapping[str, int]] | None, topic: str, partition: int) -> int:
    """The live stream's next offset in a partition: nothing read when it has no committed batch."""
    return int((committed or {}).get(topic, {}).get(str(partition), 0))


def lineage_offsets(uris: Sequence[str]) -> dict[tuple[str, int], set[int]]:
    """The offsets that ``kafka://<topic>/<partition>/<offset>`` lineage values name, per partition."""
    held: dict[tuple[str, int], set[int]] = {}
    for uri in uris:
        topic, _, rest = uri.removeprefix(LINEAGE_PREFIX).partition("/")
        partition, _, offset = rest.partition("/")
        if partition.isdigit() and offset.isdigit():
            held.setdefault((topic, int(partition)), set()).add(int(offset))
    return held


def less_held(ranges: Sequence[PartitionRange], held: Mapping[tuple[str, int], set[int]]) -> list[PartitionRange]:
    """``ranges`` without the offsets in ``held``, as the ranges of offsets left (an append reads only those)."""
    left = []
    for part in ranges:
        taken = held.get((part.topic, part.partition), set())
        run_start = None
        for offset in range(part.first, part.last + 2):
            inside = offset <= part.last and offset not in taken
            if inside and run_start is None:
                run_start = offset
            elif not inside and run_start is not None:
                left.append(PartitionRange(part.topic, part.partition, run_start, offset - 1))
                run_start = None
    return left


def broker_config(connection: str) -> dict[str, str]:
    """librdkafka settings for the stream's connection: in a Spark driver, from the variable the operator passed;
    elsewhere (the plan task), from the Airflow connection."""
    from sluice.connections.kafka import (
        client_config,
        client_config_from_spark,
        connection_fields,
        env_name,
        options_from_env,
    )

    if os.environ.get(env_name(connection)):
        return client_config_from_spark(options_from_env(connection))
    return client_config(connection_fields(connection))


def offsets_for_times(config: Mapping[str, Any], partitions: Sequence[tuple[str, int]], moment: datetime, *,
                      timeout: float = 10.0) -> dict[tuple[str, int], int]:
    """Per partition, the first offset whose record's timestamp is at or after ``moment`` (Kafka's
    offsets-for-times); -1 when no record is."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"group.id": "sluice-backfill-probe", "enable.auto.commit": False, **config})
    try:
        millis = int(moment.timestamp() * 1000)
        found = consumer.offsets_for_times([TopicPartition(topic, partition, millis)
                                            for topic, partition in partitions], timeout=timeout)
        return {(item.topic, item.partition): int(item.offset) for item in found}
    finally:
        consumer.close()
