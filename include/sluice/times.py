"""Durations and instants: one parser per grammar Sluice reads, and one formatter for the times it reports.

- :func:`parse_duration` reads Spark's option grammar (``maxFileAge``, ``maxTriggerDelay``): ``7d``, ``36h``,
  ``600000`` (milliseconds), as Spark's ``Utils.timeStringAsMs`` does.
- :func:`parse_interval` reads the catalog's grammar for watermarks, windows and joins: ``10 minutes``, ``1 hour``,
  ``30s``, in whole seconds.
- :func:`iso_utc` writes an instant as ISO 8601 in UTC, the form of every time in a report, a summary or an alert.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from sluice.errors import SluiceError
from sluice.limits import DAY_SECONDS, MAX_DURATION_SECONDS

_DURATION = re.compile(r"^\s*(\d+)\s*(us|ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_DURATION_UNIT_SECONDS = {"us": 0.000001, "ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, None: 0.001}
# Longer than any retention a landing zone or a broker keeps; a larger number is a typo, and overflows timedelta.
MAX_DURATION = timedelta(seconds=MAX_DURATION_SECONDS)

# At most 12 digits: Python refuses to convert a number of thousands of digits, and no bound needs more.
INTERVAL = re.compile(r"^\s*(\d{1,12})\s*(seconds?|s|minutes?|min|m|hours?|h|days?|d)\s*$", re.IGNORECASE)
# Keyed by the unit's first letter, which tells seconds, minutes, hours and days apart.
_INTERVAL_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """A Spark duration option such as ``7d``, ``36h`` or ``600000`` (milliseconds)."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if not match:
        raise SluiceError(f"cannot read {text!r} as a duration (e.g. 7d, 36h, 30m, 600000ms)")
    unit = match.group(2).lower() if match.group(2) else None
    seconds = int(match.group(1)) * _DURATION_UNIT_SECONDS[unit]
    if seconds > MAX_DURATION.total_seconds():
        raise SluiceError(f"duration {text!r} is longer than {MAX_DURATION.days} days")
    return timedelta(seconds=seconds)


def parse_interval(text: object) -> int:
    """``"10 minutes"``, ``"1 hour"``, ``"30s"``... as whole seconds (at least one, at most 3650 days)."""
    match = INTERVAL.match(text) if isinstance(text, str) else None
    if match is None or int(match.group(1)) <= 0:
        raise SluiceError(f"expected a positive duration such as '10 minutes', '1 hour' or '30s', got {text!r}")
    seconds = int(match.group(1)) * _INTERVAL_UNIT_SECONDS[match.group(2)[0].lower()]
    if seconds > MAX_DURATION_SECONDS:
        raise SluiceError(f"must be at most {MAX_DURATION_SECONDS // DAY_SECONDS} days ({MAX_DURATION_SECONDS:,} "
                          f"seconds, Sluice's bound for a duration), got {text!r}")
    return seconds


def spark_interval(seconds: int) -> str:
    """The interval string Spark's ``withWatermark``/``window`` take."""
    return f"{seconds} seconds"


def iso_utc(moment: float | datetime, *, timespec: str = "auto") -> str:
    """An instant (seconds since the epoch, or an aware datetime) as an ISO 8601 UTC time."""
    if isinstance(moment, datetime):
        return moment.astimezone(timezone.utc).isoformat(timespec=timespec)
    return datetime.fromtimestamp(moment, timezone.utc).isoformat(timespec=timespec)
