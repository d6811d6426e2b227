"""The row transform of a stream: its SQL, or the Python implementation of a name in
:data:`sluice.model.transforms.TRANSFORMS`.

A transform is row-wise: one row out per row in, because the dead-letter split and the row reconciliation happen
around it. A SQL transform (:mod:`sluice.model.sql`, checked when the catalog loaded) selects what it likes; Sluice's
own columns (the dead-letter flags, the lineage, the rescued data) ride along beside its select list. A Python
transform is a pure function ``DataFrame -> DataFrame`` that must keep every column it was given.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice.errors import SluiceError
from sluice.model.sql import SqlTransform
from sluice.model.stream import StreamSpec
from sluice.model.transforms import TRANSFORMS
from sluice.model.types import quote

Transform = Callable[[DataFrame], DataFrame]


def identity(frame: DataFrame) -> DataFrame:
    return frame


def bronze_events(frame: DataFrame) -> DataFrame:
    return frame.withColumn("event_type", F.lower(F.trim(F.col("event_type")))).withColumn(
        "event_date", F.to_date(F.col("event_time"))
    )


def get_transform(name: str) -> Transform:
    """The implementation of a Python transform the catalog declares (:data:`sluice.model.transforms.TRANSFORMS`)."""
    spec = TRANSFORMS.get(name)
    if spec is None:
        raise SluiceError(f"no Python transform {name!r}; declared: {', '.join(sorted(TRANSFORMS))}")
    module, function = spec.target
    implementation = getattr(importlib.import_module(module), function, None)
    if not callable(implementation):
        raise SluiceError(f"transform {name!r}: {module} has no function {function!r}")
    return implementation


def carried_columns(columns: list[str], stream: StreamSpec) -> list[str]:
    """The columns of a frame of ``columns`` that ride along a stream's SQL transform unchanged, after its select
    items: Sluice's own, which the transform neither selects nor could (the dead-letter flags, the rescued data)."""
    assert isinstance(stream.transform, SqlTransform)
    produced = {name.casefold() for name in stream.transform.names}
    declared = {name.casefold() for name in stream.source.schema.names}
    return [name for name in columns if name.casefold() not in produced | declared]


def select_list(transform: SqlTransform, columns: list[str], carried: list[str]) -> list[str]:
    """A SQL transform's select items over a frame of ``columns``: the user's, each star written out as the frame's
    columns but those it excepts and Sluice's own (``carried``, which ride along unchanged after the user's)."""
    hidden = {name.casefold() for name in carried}
    items: list[str] = []
    for projection in transform.projections:
        if projection.name is None:
            excluded = hidden | {name.casefold() for name in projection.excluded}
            items += [quote(name) for name in columns if name.casefold() not in excluded]
        else:
            items.append(projection.text)
    return [*items, *(quote(name) for name in carried)]


def apply_transform(frame: DataFrame, stream: StreamSpec) -> DataFrame:
    """The stream's transform over its parsed frame (good rows and flagged dead letters alike)."""
    transform = stream.transform
    if isinstance(transform, SqlTransform):
        carried = carried_columns(frame.columns, stream)
        # The select list over the frame, as `SELECT ... FROM source AS <alias>` reads it: without the temporary view
        # that `spark.sql(..., source=frame)` would create and drop, a command Spark executes and describes.
        return frame.alias(transform.alias).selectExpr(*select_list(transform, frame.columns, carried))
    before = set(frame.columns)
    transformed = get_transform(transform)(frame)
    lost = sorted(before - set(transformed.columns))
    if lost:
        raise SluiceError(
            f"stream '{stream.name}': transform '{transform}' dropped column(s) {', '.join(lost)}; a Python "
            "transform must keep every column so that bad records still reach the dead-letter table"
        )
    return transformed
