"""The settings every Sluice application's SparkSession starts with (``sluice_spark.session.configure_sluice``)."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from sluice_spark.session import configure_sluice


@pytest.mark.parametrize(("given", "expected"), [(None, "4"), ("16", "16")])
def test_delta_rebuilds_a_tables_state_in_the_shuffles_parallelism(
        monkeypatch: pytest.MonkeyPatch, given: str | None, expected: str) -> None:
    """delta-spark's own default is 50 state tasks per table load; Sluice's tables take the shuffle's parallelism,
    one knob for both."""
    if given is None:
        monkeypatch.delenv("SLUICE_SHUFFLE_PARTITIONS", raising=False)
    else:
        monkeypatch.setenv("SLUICE_SHUFFLE_PARTITIONS", given)
    options = configure_sluice(SparkSession.Builder())._options
    assert options["spark.sql.shuffle.partitions"] == expected
    assert options["spark.databricks.delta.snapshotPartitions"] == expected
