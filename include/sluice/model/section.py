"""A mapping read from the catalog: typed access by key, bounds, enums, and a refusal of keys nobody asked for.

Every part of the catalog (the stream's own keys, a source kind's section, a pattern) is read through one of these,
so every refusal names the stream and the field the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluice.errors import CatalogError, SluiceError
from sluice.paths import check_relative_path
from sluice.times import parse_interval


class Section:
    """A mapping from the catalog being read: typed access by key, and a refusal of keys nobody asked for."""

    def __init__(self, raw: object, *, stream: str | None, path: str) -> None:
        if not isinstance(raw, Mapping):
            raise CatalogError(f"expected a mapping, got {type(raw).__name__}", stream=stream, field=path or None)
        self.raw = raw
        self.stream = stream
        self.path = path
        self.allowed: set[str] = set()

    def field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, message: str) -> CatalogError:
        return CatalogError(message, stream=self.stream, field=self.field(key))

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None, *, required: bool = False) -> Any:
        self.allowed.add(key)
        if key not in self.raw or self.raw[key] is None:
            if required:
                raise self.error(key, "is required")
            return default
        value = self.raw[key]
        # bool is an int in Python; a catalog that says `max_files_per_trigger: true` is wrong.
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.error(key, f"expected {_type_name(kind)}, got a boolean")
        if not isinstance(value, kind):
            raise self.error(key, f"expected {_type_name(kind)}, got {type(value).__name__} {value!r}")
        return value

    def section(self, key: str, *, required: bool = False) -> Section:
        raw = self.get(key, Mapping, {}, required=required)
        return Section(raw, stream=self.stream, path=self.field(key))

    def positive_int(self, key: str, *, maximum: int) -> int | None:
        value = self.get(key, int)
        if value is not None and value <= 0:
            raise self.error(key, f"must be a positive integer, got {value}")
        return self._at_most(key, value, maximum)

    def bounded_int(self, key: str, default: int, *, minimum: int, maximum: int) -> int:
        value: int = self.get(key, int, default)
        if value < minimum:
            raise self.error(key, f"must be at least {minimum}, got {value}")
        return self._at_most(key, value, maximum)

    def _at_most(self, key: str, value: Any, maximum: int) -> Any:
        # Every catalog number ends in a timedelta, a Spark interval or a SQLite integer: bound it here, where the
        # message can still name the field.
        if value is not None and value > maximum:
            raise self.error(key, f"must be at most {maximum:,} (Sluice's bound for this field), got {value:,}")
        return value

    def enum(self, key: str, kind: type[Any], default: Any = None, *, required: bool = False) -> Any:
        value = self.get(key, str, None, required=required)
        if value is None:
            return default
        try:
            return kind(value)
        except ValueError:
            choices = ", ".join(member.value for member in kind)
            raise self.error(key, f"unknown value {value!r}; expected one of {choices}") from None

    def interval(self, key: str, *, required: bool = False) -> int | None:
        """A duration in the catalog's grammar (``10 minutes``), in whole seconds."""
        value = self.get(key, str, required=required)
        if value is None:
            return None
        try:
            return parse_interval(value)
        except SluiceError as exc:
            raise self.error(key, str(exc)) from None

    def folder(self, key: str, default: str | None = None) -> str:
        """A folder under its root (or an absolute path or URI), normalized; required unless given a default."""
        value = self.get(key, str, default, required=default is None)
        return check_relative_path(value, stream=self.stream or "", field=self.field(key))

    def names(self, key: str, *, required: bool = False) -> tuple[str, ...]:
        """A list of distinct column names."""
        values = self.get(key, list, [], required=required)
        if required and not values:
            raise self.error(key, "must name at least one column")
        if not all(isinstance(value, str) and value for value in values):
            raise self.error(key, f"expected a list of column names, got {values!r}")
        if len(set(values)) != len(values):
            raise self.error(key, f"lists a column twice: {values}")
        return tuple(values)

    def items(self, key: str) -> list[Section]:
        """A list of mappings, each read as its own section (``fan_out[0]``, ``lookup[1]``...)."""
        return [Section(raw, stream=self.stream, path=f"{self.field(key)}[{index}]")
                for index, raw in enumerate(self.get(key, list, []))]

    def done(self) -> None:
        unknown = sorted(str(key) for key in self.raw if key not in self.allowed)
        if unknown:
            allowed = ", ".join(sorted(self.allowed))
            raise CatalogError(
                f"unknown key(s) {', '.join(unknown)}; allowed here: {allowed}",
                stream=self.stream,
                field=self.path or None,
            )


def _type_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {Mapping: "a mapping", str: "a string", int: "an integer", list: "a list", bool: "a boolean"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)

