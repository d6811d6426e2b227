"""Sluice's session extension (``include/jvm/drift/sluice/plan``, issue 41): a micro-batch's timestamp (the
``_ingested_at`` column, ``current_timestamp()`` in a rule) is held out of the generated code, so that the next batch
runs the classes the first one compiled; the rows stay the same, and a scan's filters stay pushed."""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sluice.catalog import parse_catalog
from sluice.constants import INGEST_TIME_COLUMN, SOURCE_FILE_COLUMN
from sluice.paths import Roots
from sluice_spark.kinds import read_stream
from sluice_spark.steps.route import route
from tests.helpers import EXAMPLE_RULES, RULES_SCHEMA, events_stream

pytestmark = pytest.mark.spark

HOLD = "spark.sluice.holdTimestamps"  # HoldTimestamps.ENABLED
UTC = dt.timezone.utc


def held_in_session(spark: SparkSession) -> None:
    assert "sluice.plan.SluiceExtensions" in spark.conf.get("spark.sql.extensions", ""), \
        "Sluice's session extension is not configured: is sluice-drift.jar built (python -m sluice jvm-classes)?"


def compiled(spark: SparkSession) -> int:
    """How many classes Spark's code generator has compiled in this JVM so far."""
    return int(spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount())


def generated_code(spark: SparkSession, plan: Any) -> list[str]:
    """The Java source of each whole-stage code subtree of an executed plan, without the plan's text."""
    subtrees = spark._jvm.org.apache.spark.sql.execution.debug.package.codegenStringSeq(plan)
    return [subtrees.apply(index)._2() for index in range(subtrees.size())]


def events(*event_times: dt.datetime, first: int) -> str:
    return "\n".join(json.dumps({"event_id": f"e{first + index}", "event_type": "click", "user_id": "u1",
                                 "amount": 5, "currency": "EUR", "event_time": time.isoformat()})
                     for index, time in enumerate(event_times)) + "\n"


def routed_stream(spark: SparkSession, work: Path, salt: int) -> DataFrame:
    """The bronze stream's routed rows (Sluice's reader and route step: the quality split, four rules, one of them
    with ``current_timestamp()``, and ``_ingested_at``) over the JSON files in ``work/landing/events``. ``salt``, an
    integer literal in the transform, is written into the generated code: the session's earlier queries of the same
    shape (other tests') cannot have compiled this code already."""
    definition = events_stream(source={"type": "files", "format": "json", "path": "events", "schema": RULES_SCHEMA,
                                       "schema_evolution": "none"},
                               transform={"sql": f"SELECT *, amount * 2 AS doubled, length(event_id) + {salt} AS salt "
                                                    "FROM source"},
                               expectations=EXAMPLE_RULES, sink={"path": "bronze/events", "engine": "rs"})
    stream = parse_catalog({"version": 1, "streams": [definition]}).get("events")
    roots = Roots(landing=str(work / "landing"), lake=str(work / "lake"), checkpoints=str(work / "checkpoints"))
    return route(read_stream(spark, stream, roots), stream).frame


def two_batches(spark: SparkSession, work: Path, *, held: bool, now: dt.datetime | None = None,
                salt: int | None = None) -> dict[str, Any]:
    """Two availableNow runs of the routed stream into Parquet, one new file each: the classes each run compiled,
    the whole-stage code of each batch, each batch's timestamp (from its offset log) and the rows written."""
    landing, out, checkpoint = work / "landing" / "events", work / "out", work / "checkpoint"
    landing.mkdir(parents=True)
    now = now or dt.datetime.now(UTC)
    salt = salt or random.randrange(1_000_000, 1_000_000_000)  # a code no query of the session compiled before
    files = [events(now - dt.timedelta(days=1), now + dt.timedelta(minutes=30), now + dt.timedelta(days=2), first=0),
             events(now - dt.timedelta(days=2), now + dt.timedelta(days=3), first=10)]
    result: dict[str, Any] = {"compiled": [], "code": []}
    spark.conf.set(HOLD, str(held).lower())
    try:
        for index, text in enumerate(files):
            (landing / f"events-{index}.json").write_text(text, encoding="utf-8")
            before = compiled(spark)
            query = (routed_stream(spark, work, salt).writeStream.format("parquet").option("path", str(out))
                     .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
            query.awaitTermination()
            result["compiled"].append(compiled(spark) - before)
            result["code"].append(generated_code(spark, query._jsq.streamingQuery().lastExecution().executedPlan()))
    finally:
        spark.conf.unset(HOLD)
    result["batch_times"] = [
        dt.datetime.fromtimestamp(json.loads((checkpoint / "offsets" / str(batch)).read_text().splitlines()[1])[
            "batchTimestampMs"] / 1000, UTC) for batch in (0, 1)]
    result["rows"] = spark.read.parquet(str(out)).collect()
    return result


def test_a_batch_timestamp_stays_out_of_the_generated_code(spark: SparkSession, tmp_path: Path) -> None:
    held_in_session(spark)
    held = two_batches(spark, tmp_path / "held", held=True)
    assert held["compiled"][0] > 0, "the first batch compiles its code"
    assert all("heldTimestamp" in "".join(code) for code in held["code"]), "the batch's timestamp is held"
    for code, moment in zip(held["code"], held["batch_times"], strict=True):
        assert str(int(moment.timestamp() * 1_000_000)) not in "".join(code), "no timestamp in the code"
    # Spark's code cache is keyed by the source text, so a text without the timestamp is the one the batch before
    # compiled, when the plan keeps its shape (a cold session's batches: see the bench_rules section of
    # docs/performance/benchmarks.md; a warm test session's earlier queries can change a later plan's shape, so the
    # texts and the JVM's compile counter are not compared here).

    # The same stream with the rule off (the ground Spark gives): each batch's timestamp is written into its code.
    written = two_batches(spark, tmp_path / "literal", held=False)
    assert written["compiled"][1] > 0, "without the rule the second batch compiles its code again"
    for code, moment in zip(written["code"], written["batch_times"], strict=True):
        assert str(int(moment.timestamp() * 1_000_000)) in "".join(code), "Spark writes the timestamp as text"


def test_the_rows_are_the_same_and_each_batch_has_its_own_timestamp(spark: SparkSession, tmp_path: Path) -> None:
    held_in_session(spark)
    now = dt.datetime.now(UTC)
    runs = {held: two_batches(spark, tmp_path / str(held), held=held, now=now, salt=2) for held in (True, False)}
    for run in runs.values():
        first, second = run["batch_times"]
        assert first < second
        by_file: dict[str, set[dt.datetime]] = {}
        for row in run["rows"]:
            by_file.setdefault(Path(row[SOURCE_FILE_COLUMN]).name, set()).add(row[INGEST_TIME_COLUMN])
        # one value per batch, that batch's current_timestamp(), as Spark recorded it in the offset log
        assert by_file == {"events-0.json": {first.astimezone().replace(tzinfo=None)},
                           "events-1.json": {second.astimezone().replace(tzinfo=None)}}

    def without_time(rows: list[Any]) -> list[tuple[Any, ...]]:
        return sorted(tuple((key, Path(value).name if key == SOURCE_FILE_COLUMN else value)
                            for key, value in row.asDict().items() if key != INGEST_TIME_COLUMN) for row in rows)

    assert without_time(runs[True]["rows"]) == without_time(runs[False]["rows"])
    # the rule `event_time <= current_timestamp() + INTERVAL 1 HOUR` drops the events of the coming days only
    assert sorted(row["event_id"] for row in runs[True]["rows"]) == ["e0", "e1", "e10"]


def test_a_scan_keeps_its_pushed_timestamp_filters(spark: SparkSession, tmp_path: Path) -> None:
    held_in_session(spark)
    times = [dt.datetime(2026, 1, day, 12) for day in (1, 2, 3)]
    spark.createDataFrame([(index, time) for index, time in enumerate(times)], "id long, ts timestamp") \
        .write.parquet(str(tmp_path / "t"))
    frame = spark.read.parquet(str(tmp_path / "t")).where(
        (F.col("ts") < F.lit(times[2])) & (F.col("ts") <= F.current_timestamp()))
    assert sorted(row["id"] for row in frame.collect()) == [0, 1]
    plan = frame._jdf.queryExecution().executedPlan()
    pushed = plan.toString().split("PushedFilters: [")[1].split("]")[0]
    assert "LessThan(ts,2026-01-03 12:00:00.0)" in pushed and "LessThanOrEqual(ts," in pushed, pushed
    final = plan.finalPhysicalPlan() if plan.getClass().getSimpleName() == "AdaptiveSparkPlanExec" else plan
    code = "".join(generated_code(spark, final))
    assert "heldTimestamp" in code, "the filter above the scan holds its timestamps"
    assert str(int(times[2].timestamp() * 1_000_000)) not in code


def test_a_held_timestamp_without_generated_code(spark: SparkSession) -> None:
    held_in_session(spark)
    settings = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}
    try:
        for key, value in settings.items():
            spark.conf.set(key, value)
        frame = spark.range(4).repartition(2).select(
            "id", F.current_timestamp().alias("now"),
            F.lit(dt.datetime(2026, 1, 1)).cast("timestamp_ntz").alias("ntz"),
            (F.current_timestamp() > F.lit(dt.datetime(2026, 1, 1))).alias("later"))
        rows = frame.collect()
    finally:
        for key in settings:
            spark.conf.unset(key)
    assert len({row["now"] for row in rows}) == 1 and all(row["later"] for row in rows)
    assert {row["ntz"] for row in rows} == {dt.datetime(2026, 1, 1)}
