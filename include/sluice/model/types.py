"""The catalog's type language: Spark SQL's types, nested to any depth, parsed without pyspark.

    string  int  bigint  smallint  tinyint  double  float  boolean  date  timestamp  timestamp_ntz  binary
    decimal(12,2)
    struct<id: bigint, login: string not null, `head.sha`: string>
    array<struct<sha: string>>
    map<string, bigint>

A struct's field is ``name: type`` (the colon may be a space, as in Spark's DDL) with an optional ``not null``; a
name that is not a plain identifier (a JSON key with dots, spaces or dashes) is quoted with backticks. A mistake is
reported with the position and the part of the type that is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sluice.limits import TYPE_MAX_CHARS, TYPE_MAX_DEPTH

SIMPLE_TYPES = {
    "string": "STRING", "int": "INT", "integer": "INT", "bigint": "BIGINT", "long": "BIGINT", "smallint": "SMALLINT",
    "short": "SMALLINT", "tinyint": "TINYINT", "byte": "TINYINT", "double": "DOUBLE", "float": "FLOAT",
    "real": "FLOAT", "boolean": "BOOLEAN", "date": "DATE", "timestamp": "TIMESTAMP",
    "timestamp_ntz": "TIMESTAMP_NTZ", "binary": "BINARY",
}
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOKEN = re.compile(r"\s*(?:(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<number>\d+)|(?P<quoted>`(?:[^`]|``)*`)"
                    r"|(?P<symbol>[<>(),:]))")


# How much of the type a message shows on each side of the place it points at.
_SHOWN = 80


class TypeSyntaxError(ValueError):
    """A type that does not parse; the message shows where."""


@dataclass(frozen=True)
class DataType:
    """A parsed type; :meth:`sql` renders it as Spark DDL."""

    def sql(self, *, nullable_only: bool = False) -> str:
        raise NotImplementedError

    def required_fields(self, prefix: tuple[str, ...]) -> list[tuple[str, ...]]:
        """The ``not null`` struct fields inside this type, as paths of field names after ``prefix`` (``[]`` steps
        into an array's elements)."""
        return []


@dataclass(frozen=True)
class Primitive(DataType):
    name: str  # Spark's name: STRING, DECIMAL(12,2)...

    def sql(self, *, nullable_only: bool = False) -> str:
        return self.name


@dataclass(frozen=True)
class Field:
    name: str
    type: DataType
    nullable: bool = True


def quote(name: str) -> str:
    return f"`{name.replace('`', '``')}`"


def dotted(path: tuple[str, ...]) -> str:
    """How a message names a nested field: ``actor.id``, ``payload.commits[].sha``."""
    return ".".join(path).replace(".[]", "[]")


@dataclass(frozen=True)
class Struct(DataType):
    fields: tuple[Field, ...]

    def sql(self, *, nullable_only: bool = False) -> str:
        inner = ", ".join(f"{quote(f.name)}: {f.type.sql(nullable_only=nullable_only)}"
                          + ("" if f.nullable or nullable_only else " NOT NULL") for f in self.fields)
        return f"STRUCT<{inner}>"

    def required_fields(self, prefix: tuple[str, ...]) -> list[tuple[str, ...]]:
        paths = []
        for field in self.fields:
            path = (*prefix, field.name)
            if not field.nullable:
                paths.append(path)
            paths += field.type.required_fields(path)
        return paths


@dataclass(frozen=True)
class Array(DataType):
    element: DataType

    def sql(self, *, nullable_only: bool = False) -> str:
        return f"ARRAY<{self.element.sql(nullable_only=nullable_only)}>"

    def required_fields(self, prefix: tuple[str, ...]) -> list[tuple[str, ...]]:
        return self.element.required_fields((*prefix, "[]"))


@dataclass(frozen=True)
class MapType(DataType):
    key: DataType
    value: DataType

    def sql(self, *, nullable_only: bool = False) -> str:
        return f"MAP<{self.key.sql(nullable_only=nullable_only)}, {self.value.sql(nullable_only=nullable_only)}>"


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.position = 0
        self.depth = 0

    def fail(self, message: str) -> TypeSyntaxError:
        before, after = self.text[:self.position], self.text[self.position:]
        # A long type is shown around the place only, so that the message stays one readable line.
        if len(before) > _SHOWN:
            before = "..." + before[-_SHOWN:]
        if len(after) > _SHOWN:
            after = after[:_SHOWN] + "..."
        shown = f"{before}⟨here⟩{after}".strip()
        return TypeSyntaxError(f"{message} at position {self.position}: {shown}")

    def peek(self) -> tuple[str, str] | None:
        match = _TOKEN.match(self.text, self.position)
        if match is None or match.end() == self.position:
            return None
        kind = match.lastgroup or ""
        return kind, match.group(kind)

    def take(self) -> tuple[str, str]:
        match = _TOKEN.match(self.text, self.position)
        if match is None or match.lastgroup is None:
            rest = self.text[self.position:].strip()
            raise self.fail(f"unexpected {rest[:1]!r}" if rest else "the type ends too early")
        self.position = match.end()
        return match.lastgroup, match.group(match.lastgroup)

    def expect(self, symbol: str, what: str) -> None:
        found = self.peek()
        if found is None or found != ("symbol", symbol):
            raise self.fail(f"expected {symbol!r} {what}")
        self.take()

    def done(self) -> bool:
        return not self.text[self.position:].strip()

    def type(self) -> DataType:
        self.depth += 1
        try:
            if self.depth > TYPE_MAX_DEPTH:
                raise self.fail(f"types nest more than {TYPE_MAX_DEPTH} levels deep")
            return self.nested_type()
        finally:
            self.depth -= 1

    def nested_type(self) -> DataType:
        found = self.peek()
        if found is None or found[0] != "word":
            raise self.fail("expected a type")
        self.take()
        word = found[1].lower()
        if word in SIMPLE_TYPES:
            return Primitive(SIMPLE_TYPES[word])
        if word == "decimal":
            self.expect("(", "after decimal")
            precision = self.number("a precision")
            self.expect(",", "between the precision and the scale")
            scale = self.number("a scale")
            self.expect(")", "after the scale")
            if not 1 <= precision <= 38 or scale > precision:
                raise self.fail("decimal precision must be 1..38 and scale <= precision")
            return Primitive(f"DECIMAL({precision},{scale})")
        if word == "array":
            self.expect("<", "after array")
            element = self.type()
            self.expect(">", "to close array<...>")
            return Array(element)
        if word == "map":
            self.expect("<", "after map")
            key = self.type()
            self.expect(",", "between a map's key type and its value type")
            value = self.type()
            self.expect(">", "to close map<...>")
            if key.required_fields(()) or value.required_fields(()):
                raise self.fail("a 'not null' inside a map's keys or values is not checked; declare the field "
                                "nullable")
            return MapType(key, value)
        if word == "struct":
            self.expect("<", "after struct")
            fields: list[Field] = []
            names: set[str] = set()
            while True:
                field = self.field()
                # Spark resolves names case-insensitively: `id` and `ID` would be one field to it.
                if field.name.casefold() in names:
                    raise self.fail(f"field {field.name!r} is declared twice (names are case-insensitive)")
                names.add(field.name.casefold())
                fields.append(field)
                found = self.peek()
                if found == ("symbol", ","):
                    self.take()
                    continue
                self.expect(">", "to close struct<...> (or ',' before the next field)")
                return Struct(tuple(fields))
        raise self.fail(f"unknown type {found[1]!r}; expected one of {', '.join(sorted(SIMPLE_TYPES))}, "
                        "decimal(p,s), struct<...>, array<...>, map<...>")

    def number(self, what: str) -> int:
        found = self.peek()
        if found is None or found[0] != "number":
            raise self.fail(f"expected {what}")
        if len(found[1]) > 3:
            raise self.fail(f"{what} of at most 3 digits, got {len(found[1])}")
        self.take()
        return int(found[1])

    def field(self) -> Field:
        found = self.peek()
        if found is None or found[0] not in ("word", "quoted"):
            raise self.fail("expected a field name (quote one that is not a plain identifier with backticks)")
        self.take()
        name = found[1][1:-1].replace("``", "`") if found[0] == "quoted" else found[1]
        if not name or name == "[]":
            raise self.fail(f"a field name cannot be {name!r}")
        if self.peek() == ("symbol", ":"):
            self.take()
        data_type = self.type()
        return Field(name, data_type, self.not_null())

    def not_null(self) -> bool:
        """True (nullable) unless ``not null`` follows."""
        found = self.peek()
        if found is None or found[0] != "word" or found[1].lower() != "not":
            return True
        self.take()
        after = self.peek()
        if after is None or after[0] != "word" or after[1].lower() != "null":
            raise self.fail("expected 'null' after 'not'")
        self.take()
        return False


def parse(text: str) -> tuple[DataType, bool]:
    """A column's type and whether it is nullable (``... not null``)."""
    if len(text) > TYPE_MAX_CHARS:
        raise TypeSyntaxError(f"a type of {len(text):,} characters; at most {TYPE_MAX_CHARS:,}")
    parser = _Parser(text)
    data_type = parser.type()
    nullable = parser.not_null()
    if not parser.done():
        raise parser.fail("unexpected text after the type")
    return data_type, nullable
