"""A SQL transform runs as its select list over the parsed frame (sluice_spark.steps.transforms): the rows and
columns of ``SELECT ... FROM source AS <alias>`` run by ``spark.sql``, without the temporary view that costs a
cold driver a command to execute and describe."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.catalog import parse_catalog
from sluice.model.sql import SqlTransform, spark_select
from sluice_spark.steps.transforms import apply_transform, carried_columns
from tests.helpers import RULES_SCHEMA, events_stream, py4j_commands

pytestmark = pytest.mark.spark

# The parsed frame's columns, its amount and event time as text (cast below).
SCHEMA = ("event_id string, event_type string, user_id string, amount string, currency string, event_time string, "
          "_corrupt_record string, _source_file string")
ROWS = [("e1", " Click ", "u1", "5.00", "EUR", "2026-11-23 09:00:00", None, "a.json"),
        ("e2", "purchase", None, None, "USD", "2026-11-23 10:30:00", None, "b.json"),
        (None, None, None, None, None, None, "{not json", "b.json")]
TRANSFORMS = [
    # The bundled stream's.
    "SELECT event_id, lower(trim(event_type)) AS event_type, user_id, amount, currency, event_time, "
    "to_date(event_time) AS event_date FROM source",
    # A star with exceptions, an alias qualifying columns, a literal with braces, a quoted name.
    "SELECT s.* EXCEPT (currency), concat('{', s.event_type, '}') AS tagged, amount * 2 AS doubled, "
    "s.amount + 1 AS `amount plus one` FROM source s",
    "SELECT *, coalesce(amount, 0) AS amount_or_zero FROM source",
]


def stream(sql: str) -> Any:
    return parse_catalog({"version": 1, "streams": [events_stream(**{
        "source": {"type": "files", "format": "json", "path": "events", "schema": RULES_SCHEMA},
        "transform": {"sql": sql}, "sink": {"path": "bronze/events", "engine": "rs"}})]}).get("events")


@pytest.mark.parametrize("sql", TRANSFORMS)
def test_a_sql_transform_gives_what_its_sql_gives_without_a_temporary_view(spark: Any, sql: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql import functions as F

    spec = stream(sql)
    assert isinstance(spec.transform, SqlTransform)
    frame = spark.createDataFrame(ROWS, SCHEMA).withColumns({
        "amount": F.col("amount").cast("decimal(12,2)"), "event_time": F.col("event_time").cast("timestamp")})
    # As the runner ran it before: the SQL over a temporary view of the frame.
    expected = spark.sql(spark_select(spec.transform, carried_columns(frame.columns, spec)), source=frame)

    calls = py4j_commands(monkeypatch, "c\n")
    transformed = apply_transform(frame, spec)
    monkeypatch.undo()
    called = {command.split("\n")[2] for command in calls}  # Py4J's call: c, the object, the method
    assert not {"createOrReplaceTempView", "sql", "dropTempView"} & called, called
    assert transformed.schema == expected.schema
    assert sorted(map(tuple, transformed.collect()), key=repr) == sorted(map(tuple, expected.collect()), key=repr)
