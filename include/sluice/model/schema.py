"""Declared source schemas: a small, validated column model that renders to a Spark DDL string.

A catalog declares a schema as an ordered mapping of column name to type, for example
``{"event_id": "string not null", "amount": "decimal(12,2)"}``. The model is checked without pyspark, so a typo in
a type is reported when the catalog loads, not when Spark analyses the query.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from sluice.errors import CatalogError

_SIMPLE_TYPES = {
    "string": "STRING",
    "int": "INT",
    "integer": "INT",
    "bigint": "BIGINT",
    "long": "BIGINT",
    "double": "DOUBLE",
    "float": "FLOAT",
    "boolean": "BOOLEAN",
    "date": "DATE",
    "timestamp": "TIMESTAMP",
    "binary": "BINARY",
}
_DECIMAL = re.compile(r"^decimal\(\s*(\d{1,3})\s*,\s*(\d{1,3})\s*\)$")
_NOT_NULL = re.compile(r"\s+not\s+null$")
_COLUMN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Column:
    """One declared column: its name, its Spark SQL type, and whether a row may leave it empty."""

    name: str
    sql_type: str
    nullable: bool = True

    def ddl(self) -> str:
        return f"`{self.name}` {self.sql_type}" + ("" if self.nullable else " NOT NULL")


@dataclass(frozen=True)
class Schema:
    """An ordered list of declared columns."""

    columns: tuple[Column, ...]

    @property
    def names(self) -> list[str]:
        return [column.name for column in self.columns]

    @property
    def required(self) -> list[str]:
        """Columns a good record must carry; a record without one of them goes to the dead-letter table."""
        return [column.name for column in self.columns if not column.nullable]

    def ddl(self, *, nullable_only: bool = False) -> str:
        """The schema as a Spark DDL string. ``nullable_only`` drops NOT NULL, which file readers require."""
        if nullable_only:
            return ", ".join(f"`{c.name}` {c.sql_type}" for c in self.columns)
        return ", ".join(column.ddl() for column in self.columns)


def parse_type(spec: str, *, stream: str | None, field: str) -> tuple[str, bool]:
    """Parse ``"decimal(12,2) not null"`` into (``"DECIMAL(12,2)"``, nullable=False)."""
    if not isinstance(spec, str) or not spec.strip():
        raise CatalogError(f"expected a type such as 'string' or 'decimal(12,2) not null', got {spec!r}",
                           stream=stream, field=field)
    text = spec.strip().lower()
    nullable = True
    if _NOT_NULL.search(text):
        nullable = False
        text = _NOT_NULL.sub("", text)
    if text in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[text], nullable
    decimal = _DECIMAL.match(text)
    if decimal:
        precision, scale = int(decimal.group(1)), int(decimal.group(2))
        if not 1 <= precision <= 38 or scale > precision:
            raise CatalogError(f"decimal precision must be 1..38 and scale <= precision, got {spec!r}",
                               stream=stream, field=field)
        return f"DECIMAL({precision},{scale})", nullable
    known = ", ".join(sorted(_SIMPLE_TYPES)) + ", decimal(p,s)"
    raise CatalogError(f"unknown type {spec!r}; expected one of {known}, optionally followed by 'not null'",
                       stream=stream, field=field)


def parse_schema(raw: object, *, stream: str | None, field: str = "source.schema") -> Schema:
    """Validate a declared schema mapping and return the column model."""
    if not isinstance(raw, Mapping) or not raw:
        raise CatalogError("expected a non-empty mapping of column name to type", stream=stream, field=field)
    columns = []
    for name, spec in raw.items():
        if not isinstance(name, str) or not _COLUMN_NAME.match(name):
            raise CatalogError(f"column name {name!r} must match {_COLUMN_NAME.pattern}", stream=stream, field=field)
        if name.startswith("_"):
            raise CatalogError(f"column name {name!r} starts with '_', which is reserved for Sluice's metadata "
                               "columns", stream=stream, field=field)
        sql_type, nullable = parse_type(spec, stream=stream, field=f"{field}.{name}")
        columns.append(Column(name, sql_type, nullable))
    return Schema(tuple(columns))
