"""Run catalog streams with ``trigger(availableNow=True)``: the entry points of the apps (``stream_runner.py``, the
warm server, the backfill)."""

from __future__ import annotations

from sluice_spark.runner.run import *  # noqa: F403
