"""Command lines for Sluice's own programs, built so that no value can be read as an option."""

from __future__ import annotations

from collections.abc import Mapping


def option_args(options: Mapping[str, object]) -> list[str]:
    """``--name=value`` for each option, ``--name`` for a true flag; None and false are left out.

    The value is joined to its option: a value that starts with ``-`` (a backfill reason, an Airflow run id) is then
    that option's value, never an option of its own.
    """
    args: list[str] = []
    for name, value in options.items():
        if value is None or value is False:
            continue
        if not name or name.startswith("-") or "=" in name:
            raise ValueError(f"bad option name {name!r}")
        args.append(f"--{name}" if value is True else f"--{name}={value}")
    return args
