"""Transform implementations, keyed by the names in :data:`sluice.model.transforms.TRANSFORMS`.

A transform is a pure function ``DataFrame -> DataFrame``, testable without a source or a sink. Transforms of file
streams are row-wise: they add or rewrite columns and keep every row and every column they were given, because the
dead-letter split and the row reconciliation happen around them.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

Transform = Callable[[DataFrame], DataFrame]


def identity(frame: DataFrame) -> DataFrame:
    return frame


def bronze_events(frame: DataFrame) -> DataFrame:
    return frame.withColumn("event_type", F.lower(F.trim(F.col("event_type")))).withColumn(
        "event_date", F.to_date(F.col("event_time"))
    )


TRANSFORMS: dict[str, Transform] = {
    "identity": identity,
    "bronze_events": bronze_events,
}


def get_transform(name: str) -> Transform:
    try:
        return TRANSFORMS[name]
    except KeyError:
        raise KeyError(f"no Spark implementation for transform {name!r}; known: {', '.join(sorted(TRANSFORMS))}") \
            from None
