"""Kafka into Delta: Sluice's run of a Kafka stream against plain Spark's
``readStream.format("kafka") ... writeStream.format("delta")`` with availableNow, over the same topic.

A real broker (``python -m sluice kafka-broker``'s, KRaft on 127.0.0.1 with SASL/PLAIN) gets ``--records`` JSON
events in ``--partitions`` partitions. Each round, each side reads the whole topic from the earliest offsets into a
fresh Delta table with its own checkpoint:

- ``spark``: the baseline. The records' values parsed with ``from_json`` and the declared schema, written by
  delta-spark (the jars `make venv` resolved).
- ``sluice``: the same topic as a catalog stream (``engine: auto``, the jvm engine here), through Sluice's runner:
  the same parse, plus the dead-letter split, the drift policy's rescue, lineage columns and the run's bookkeeping.

Both tables are checked to hold every record. The last line is JSON with ``ratios`` and ``goals``
(``sluice_vs_spark`` <= 1.10).

    python bench/bench_kafka.py [--records 1000000] [--partitions 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from harness import best_of_rounds, local_spark, run_catalog
from pyspark.sql import functions as F

from sluice.catalog import parse_catalog
from sluice.cli.kafka_broker import BrokerAddress, LocalKafkaBroker, create_topic
from sluice.connections.kafka import env_name
from sluice.model.schema import parse_schema
from sluice.paths import Roots

SCHEMA = {"event_id": "string not null", "event_type": "string", "user_id": "string", "amount": "decimal(12,2)",
          "event_time": "timestamp"}
SIDES = ("spark", "sluice")


def produce(address: BrokerAddress, topic: str, records: int, partitions: int) -> None:
    from confluent_kafka import Producer

    generator = random.Random(7)
    producer = Producer({**address.client_config(), "linger.ms": 50, "batch.num.messages": 10000,
                         "compression.type": "lz4", "queue.buffering.max.messages": 500000})
    for index in range(records):
        event = {"event_id": str(uuid.UUID(int=generator.getrandbits(128))),
                 "event_type": generator.choice(("click", "purchase", "view")), "user_id": f"u{index % 10_000}",
                 "amount": round(generator.uniform(1, 500), 2), "event_time": "2026-11-22T10:00:00Z"}
        while True:
            try:
                producer.produce(topic, value=json.dumps(event).encode(), partition=index % partitions)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0


def plain_spark(spark, address: BrokerAddress, topic: str, out: Path) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    schema = parse_schema(SCHEMA, stream="bench_kafka").ddl(nullable_only=True)
    started = time.perf_counter()
    frame = (spark.readStream.format("kafka").options(**address.spark_options())
             .option("subscribe", topic).option("startingOffsets", "earliest").load()
             .select(F.from_json(F.col("value").cast("string"), schema).alias("event")).select("event.*"))
    query = (frame.writeStream.format("delta").option("checkpointLocation", str(out / "checkpoint"))
             .trigger(availableNow=True).start(str(out / "table")))
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    return elapsed, spark.read.format("delta").load(str(out / "table")).count()


def sluice_run(spark, topic: str, out: Path) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    catalog = parse_catalog({"version": 1, "streams": [{
        "name": "bench_kafka",
        "source": {"type": "kafka", "format": "json", "schema": SCHEMA,
                   "options": {"subscribe": topic, "startingOffsets": "earliest"}},
        "sink": {"path": str(out / "table"), "engine": "auto"},
        "checkpoint": str(out / "checkpoint"),
        "schedule": "@hourly",
    }]})
    elapsed, result = run_catalog(spark, catalog, Roots(landing=str(out), lake=str(out), checkpoints=str(out)),
                                  name="bench_kafka")
    return elapsed, result.output_rows + result.dead_letter_rows


def main() -> None:
    import os

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-kafka-"))
    broker = LocalKafkaBroker(work / "broker", heap="1g")
    try:
        address = broker.start()
        topic = "bench-events"
        create_topic(address, topic, args.partitions)
        started = time.perf_counter()
        produce(address, topic, args.records, args.partitions)
        print(f"produced {args.records:,} records in {time.perf_counter() - started:.1f}s")
        os.environ[env_name("sluice_kafka")] = json.dumps(address.spark_options())
        spark = local_spark()
        counts: dict[str, int] = {}
        runs = {"spark": lambda out: plain_spark(spark, address, topic, out),
                "sluice": lambda out: sluice_run(spark, topic, out)}
        for side in SIDES:  # warm the JIT, the Kafka consumers and delta-spark's classes
            runs[side](work / f"warmup-{side}")

        def timed(side: str, round_index: int) -> float:
            elapsed, counts[side] = runs[side](work / f"{side}-{round_index}")
            return elapsed

        best = best_of_rounds(SIDES, args.rounds, timed)
        assert counts == {"spark": args.records, "sluice": args.records}, counts
        spark.stop()
        ratio = round(best["sluice"] / best["spark"], 3)
        print(json.dumps({"records": args.records, "partitions": args.partitions,
                          "best_seconds": {k: round(v, 2) for k, v in best.items()},
                          "ratios": {"sluice_vs_spark": ratio}, "goals": {"sluice_vs_spark": 1.10}}))
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
