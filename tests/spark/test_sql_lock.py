"""The run-time lock behind the catalog's SQL allowlist (issue 40): a script transform that reaches the session by
any way (a catalog the gate did not check, an expression's subquery) is refused before anything runs, so its
command never starts on an executor. Spark 4.2 has no setting that turns script transformation off
(``sluice_spark.session.refuse_script_transforms`` says where that was looked for)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import Catalog
from sluice.errors import SluiceError
from sluice.storage.delta import table_version
from sluice_spark.runner import run_streams
from sluice_spark.session import refuse_script_transforms
from tests.helpers import roots_in
from tests.spark.test_expectations import catalog_with, record, write_feed

pytestmark = pytest.mark.spark


def test_a_plan_with_a_script_transform_is_refused_wherever_it_sits(spark: Any) -> None:
    from pyspark.sql import functions as F

    rows = spark.range(3)
    refuse_script_transforms(rows.select((F.col("id") + 1).alias("next")), stream="plain")
    statement = spark.sql("SELECT TRANSFORM(id) USING 'cat' AS k FROM {rows}", rows=rows)
    in_a_subquery = rows.where(F.expr("id IN (SELECT TRANSFORM(1) USING 'cat' AS k)"))
    in_a_value = rows.select(F.expr("(SELECT TRANSFORM(1) USING 'cat' AS k)").alias("x"))
    for frame in (statement, in_a_subquery, in_a_value):
        with pytest.raises(SluiceError, match=r"stream 'probe': its SQL runs a script transform \(TRANSFORM ... "
                                              r"USING 'cat'\)"):
            refuse_script_transforms(frame, stream="probe")


@pytest.mark.parametrize("place", ["expectation", "fan_out"])
def test_a_script_transform_the_catalog_gate_missed_never_runs(spark: Any, tmp_path: Path, place: str) -> None:
    marker = tmp_path / "the-command-ran"
    script = f"(SELECT TRANSFORM(1) USING 'touch {marker}; cat' AS k) IS NOT NULL"
    write_feed(tmp_path / "landing" / "events", "a.json", [record(1), record(2)])
    catalog = catalog_with(tmp_path, {"positive": {"check": "amount > 0"}},
                           fan_out=[{"path": "silver/positive", "where": "amount > 0"}])
    stream = catalog.get("events")
    # As if the catalog had been read by a gate with a hole: the stream carries the text the gate refuses.
    if place == "expectation":
        stream = dataclasses.replace(stream, expectations=(dataclasses.replace(stream.expectations[0], check=script),))
    else:
        fan_out = (dataclasses.replace(stream.patterns.fan_out[0], where=script),)
        stream = dataclasses.replace(stream, patterns=dataclasses.replace(stream.patterns, fan_out=fan_out))
    roots = roots_in(tmp_path)
    with pytest.raises(SluiceError, match=r"stream 'events': its SQL runs a script transform"):
        run_streams(spark, Catalog({"events": stream}), ["events"], roots)
    assert not marker.exists(), "the command ran"
    assert table_version(stream.sink_path(roots)) is None
