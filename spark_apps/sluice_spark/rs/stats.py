"""Delta statistics and partition values of the Parquet files the rs engine writes, as the Delta protocol
stores them."""

from __future__ import annotations

import json
from typing import Any

# Delta truncates string statistics; a longer string's min/max is left out rather than stored wrong.
_MAX_STRING_STAT = 32


def partition_string(value: object) -> str | None:
    """A partition value as the Delta protocol serialises it."""
    import datetime as dt

    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value.isoformat(sep=" ", timespec="microseconds")
    return str(value)


def file_stats(metadata: Any, rows: int) -> str:
    """Delta file statistics (numRecords, nullCount, minValues, maxValues) from the Parquet footer.

    A bound that cannot be stored exactly is left out, never stored approximately: a wrong bound would make
    readers skip files that hold matching rows.
    """
    null_count: dict[str, int] = {}
    bounds: dict[str, list[Any]] = {}
    unusable: set[str] = set()
    for group_index in range(metadata.num_row_groups):
        group = metadata.row_group(group_index)
        for column_index in range(group.num_columns):
            chunk = group.column(column_index)
            name = chunk.path_in_schema
            statistics = chunk.statistics
            if "." in name or statistics is None or not statistics.has_null_count:
                unusable.add(name)
                continue
            null_count[name] = null_count.get(name, 0) + statistics.null_count
            if not statistics.has_min_max:
                if statistics.null_count < chunk.num_values:
                    unusable.add(name)  # values without bounds: no bound for the file either
                continue
            low, high = statistics.min, statistics.max
            if name in bounds:
                bounds[name][0] = min(bounds[name][0], low)
                bounds[name][1] = max(bounds[name][1], high)
            else:
                bounds[name] = [low, high]

    stats: dict[str, Any] = {"numRecords": rows, "nullCount": {}, "minValues": {}, "maxValues": {}}
    for name, count in null_count.items():
        if name in unusable:
            continue
        stats["nullCount"][name] = count
        if name not in bounds:
            continue
        low, high = _stat_value(bounds[name][0], round_up=False), _stat_value(bounds[name][1], round_up=True)
        if low is not None and high is not None:
            stats["minValues"][name], stats["maxValues"][name] = low, high
    return json.dumps(stats)


def _stat_value(value: Any, *, round_up: bool) -> Any:
    """A bound as Delta stores it in JSON, or None when it cannot be stored exactly."""
    import datetime as dt
    import decimal
    import math

    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, decimal.Decimal):
        # Up to 15 significant digits survive the trip through a JSON number exactly.
        return float(value) if len(value.as_tuple().digits) <= 15 else None
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        # Delta keeps milliseconds; the upper bound is rounded up so that it still bounds the data.
        if round_up and value.microsecond % 1000:
            value = value + dt.timedelta(microseconds=1000 - value.microsecond % 1000)
        return value.isoformat(timespec="milliseconds") + "Z"
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, str):
        return value if len(value) <= _MAX_STRING_STAT else None
    return None
