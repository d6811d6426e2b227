"""The Python transforms: every one the catalog may name, declared once, with what it needs from its input.

Most transforms are a few SQL expressions and belong in the catalog (``transform: {sql: ...}``,
:mod:`sluice.model.sql`). A Python transform is for what SQL cannot say. It is declared here, where the catalog is
validated without pyspark; its code is the function :attr:`TransformSpec.implementation` names, which the Spark side
imports when a stream runs (``sluice_spark.steps.transforms.get_transform``). A test imports every one.
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
    # Lowers or uppers strings (Spark then loads its case mappings ahead: sluice_spark.session).
    maps_case: bool = False
    # ``module:function`` of the implementation, a ``DataFrame -> DataFrame`` function; by default the function of
    # the transform's name in ``sluice_spark.steps.transforms``.
    implementation: str = ""

    @property
    def target(self) -> tuple[str, str]:
        """The module and the function that implement the transform."""
        module, _, function = (self.implementation or f"sluice_spark.steps.transforms:{self.name}").partition(":")
        return module, function


TRANSFORMS: dict[str, TransformSpec] = {
    spec.name: spec
    for spec in (
        TransformSpec("identity", "Pass the parsed records through unchanged."),
        TransformSpec(
            "bronze_events",
            "Normalise event_type to lower case and derive the event_date partition column from event_time.",
            required_columns=("event_type", "event_time"),
            adds_columns=("event_date",),
            maps_case=True,
        ),
    )
}
