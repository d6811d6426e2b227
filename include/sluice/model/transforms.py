"""The transform contract: every transform the catalog may name, and what it needs from its input.

The implementations live on the Spark side (``sluice_spark.transforms``); this registry is what the catalog is
validated against, without importing pyspark. A test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransformSpec:
    """What the catalog needs to know about a transform before Spark runs it."""

    name: str
    description: str
    required_columns: tuple[str, ...] = ()
    adds_columns: tuple[str, ...] = ()
    # Stateful transforms (aggregations, deduplication, stream joins) keep state in the checkpoint's state/ folder.
    stateful: bool = False


TRANSFORMS: dict[str, TransformSpec] = {
    spec.name: spec
    for spec in (
        TransformSpec("identity", "Pass the parsed records through unchanged."),
        TransformSpec(
            "bronze_events",
            "Normalise event_type to lower case and derive the event_date partition column from event_time.",
            required_columns=("event_type", "event_time"),
            adds_columns=("event_date",),
        ),
    )
}
