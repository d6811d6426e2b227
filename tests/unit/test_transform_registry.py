from __future__ import annotations

import pytest

from sluice.errors import SluiceError
from sluice.model.transforms import TRANSFORMS
from sluice_spark.steps.transforms import get_transform


def test_every_declared_python_transform_has_its_implementation() -> None:
    for name in TRANSFORMS:
        assert callable(get_transform(name)), name


def test_an_undeclared_transform_is_refused() -> None:
    with pytest.raises(SluiceError, match="no Python transform 'nope'; declared: bronze_events, identity"):
        get_transform("nope")
