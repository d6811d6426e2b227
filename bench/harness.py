"""What every Spark benchmark shares: a local session with Sluice's data sources, and rounds that alternate the order
of the sides and keep the best time of each, because these machines are shared and noisy."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import SparkSession

from sluice_spark.session import configure_sluice, register_data_sources


def local_spark() -> SparkSession:
    spark = configure_sluice(SparkSession.builder).master("local[2]").config("spark.ui.enabled", "false") \
        .getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register_data_sources(spark)
    return spark


def best_of_rounds(sides: Sequence[str], rounds: int, run: Callable[[str, int], float]) -> dict[str, float]:
    """Run every side once per round (``run(side, round_index)`` returns its seconds), forwards in even rounds and
    backwards in odd ones; the best time of each side."""
    times: dict[str, list[float]] = {side: [] for side in sides}
    for round_index in range(rounds):
        for side in sides if round_index % 2 == 0 else list(reversed(sides)):
            times[side].append(run(side, round_index))
        print(f"round {round_index + 1}: " + ", ".join(f"{side} {times[side][-1]:.2f}s" for side in sides))
    return {side: min(values) for side, values in times.items()}
