"""Declared source schemas: a validated column model that renders to a Spark DDL string.

A catalog declares a schema as an ordered mapping of column name to type, for example
``{"event_id": "string not null", "amount": "decimal(12,2)", "actor": "struct<id: bigint, login: string>"}``. Types
are Spark SQL's, nested to any depth (:mod:`sluice.model.types`). A column name that is not a plain identifier (a
JSON key with dots, spaces or dashes) is quoted with backticks. The model is checked without pyspark, so a typo in a
type is reported when the catalog loads, not when Spark analyses the query.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sluice.errors import CatalogError
from sluice.model.types import IDENTIFIER, DataType, Primitive, TypeSyntaxError, dotted, parse, quote


@dataclass(frozen=True)
class Column:
    """One declared column: its name, its Spark SQL type, and whether a row may leave it empty."""

    name: str
    sql_type: str
    nullable: bool = True
    data_type: DataType = field(default_factory=lambda: Primitive("STRING"), compare=False)

    @property
    def complex(self) -> bool:
        """A struct, an array or a map."""
        return not isinstance(self.data_type, Primitive)

    def ddl(self, *, nullable_only: bool = False) -> str:
        return (f"{quote(self.name)} {self.data_type.sql(nullable_only=nullable_only)}"
                + ("" if self.nullable or nullable_only else " NOT NULL"))


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

    @property
    def required_fields(self) -> list[tuple[str, ...]]:
        """Every ``not null`` field inside the columns, as a path of field names (``("payload", "commits", "[]",
        "sha")``: ``[]`` steps into an array's elements). Top-level columns are :attr:`required`."""
        return [path for column in self.columns for path in column.data_type.required_fields((column.name,))]

    @property
    def required_paths(self) -> list[str]:
        """Every ``not null`` field as a message names it: ``event_id``, ``actor.id``, ``payload.commits[].sha``."""
        return [*self.required, *(dotted(path) for path in self.required_fields)]

    def ddl(self, *, nullable_only: bool = False) -> str:
        """The schema as a Spark DDL string. ``nullable_only`` drops NOT NULL at every depth, which file readers
        require (a record without the field is a dead letter, not a failed batch)."""
        return ", ".join(column.ddl(nullable_only=nullable_only) for column in self.columns)


def parse_type(spec: str, *, stream: str | None, field: str) -> tuple[DataType, bool]:
    """Parse ``"decimal(12,2) not null"`` into (its type, nullable=False)."""
    if not isinstance(spec, str) or not spec.strip():
        raise CatalogError(f"expected a type such as 'string', 'decimal(12,2) not null' or 'struct<id: bigint>', "
                           f"got {spec!r}", stream=stream, field=field)
    try:
        return parse(spec)
    except TypeSyntaxError as exc:
        raise CatalogError(str(exc), stream=stream, field=field) from None


def _column_name(raw: object, *, stream: str | None, field: str) -> str:
    if isinstance(raw, str) and len(raw) > 2 and raw.startswith("`") and raw.endswith("`"):
        name = raw[1:-1].replace("``", "`")
        if "`" in name.replace("``", ""):
            raise CatalogError(f"column name {raw!r}: a backtick inside a quoted name is written twice",
                               stream=stream, field=field)
        return name
    if not isinstance(raw, str) or not IDENTIFIER.fullmatch(raw):
        raise CatalogError(f"column name {raw!r} must match {IDENTIFIER.pattern}, or be quoted with backticks "
                           "(`user-agent`)", stream=stream, field=field)
    return raw


def parse_schema(raw: object, *, stream: str | None, field: str = "source.schema") -> Schema:
    """Validate a declared schema mapping and return the column model."""
    if not isinstance(raw, Mapping) or not raw:
        raise CatalogError("expected a non-empty mapping of column name to type", stream=stream, field=field)
    columns: list[Column] = []
    for key, spec in raw.items():
        name = _column_name(key, stream=stream, field=field)
        if "." in name:
            raise CatalogError(f"column name {name!r}: a top-level column cannot contain '.', which Spark reads as a "
                               "nested field; declare it inside a struct (`struct<`a.b`: string>`) or rename it",
                               stream=stream, field=field)
        if name.startswith("_"):
            raise CatalogError(f"column name {name!r} starts with '_', which is reserved for Sluice's metadata "
                               "columns", stream=stream, field=field)
        if name.casefold() in (column.name.casefold() for column in columns):
            raise CatalogError(f"column {name!r} is declared twice (names are case-insensitive)", stream=stream,
                               field=field)
        data_type, nullable = parse_type(spec, stream=stream, field=f"{field}.{name}")
        # sql_type is what Spark reads and casts to; nested NOT NULLs are checked by the dead-letter split.
        columns.append(Column(name, data_type.sql(nullable_only=True), nullable, data_type))
    return Schema(tuple(columns))
