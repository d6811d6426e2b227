from __future__ import annotations

from sluice.model.transforms import TRANSFORMS as CONTRACT
from sluice_spark.transforms import TRANSFORMS as IMPLEMENTATIONS


def test_every_catalog_transform_has_a_spark_implementation_and_back() -> None:
    assert set(CONTRACT) == set(IMPLEMENTATIONS)
