"""Durations as Spark's options write them (``maxFileAge``, ``maxTriggerDelay``): one parser for all of Sluice."""

from __future__ import annotations

import re
from datetime import timedelta

from sluice.errors import SluiceError

# Spark reads these with Utils.timeStringAsMs: a number of milliseconds, or a number with one of these suffixes.
_DURATION = re.compile(r"^\s*(\d+)\s*(us|ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"us": 0.000001, "ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, None: 0.001}
# Longer than any retention a landing zone or a broker keeps; a larger number is a typo, and overflows timedelta.
MAX_DURATION = timedelta(days=36500)


def parse_duration(text: str) -> timedelta:
    """A Spark duration option such as ``7d``, ``36h`` or ``600000`` (milliseconds)."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if not match:
        raise SluiceError(f"cannot read {text!r} as a duration (e.g. 7d, 36h, 30m, 600000ms)")
    unit = match.group(2).lower() if match.group(2) else None
    seconds = int(match.group(1)) * _UNIT_SECONDS[unit]
    if seconds > MAX_DURATION.total_seconds():
        raise SluiceError(f"duration {text!r} is longer than {MAX_DURATION.days} days")
    return timedelta(seconds=seconds)
