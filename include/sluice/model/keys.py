"""The vocabulary of the catalog's key table: what a key holds, its default and bound, and the blocks of keys.

The table itself is :mod:`sluice.catalog.keys`; each kind declares the blocks of its own source or sink section
(:meth:`sluice.kinds.base.SourceKind.catalog_blocks`), so a new kind's keys live in its own module. The JSON Schema
(:mod:`sluice.catalog.schema`) and the docs site's catalog reference are generated from the table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from sluice.constants import SchemaEvolution
from sluice.limits import MAX_DURATION_SECONDS
from sluice.times import INTERVAL

# A duration in the catalog's grammar (sluice.times.parse_interval: "10 minutes", "1 hour", "30s"), its letters made
# case-insensitive for a JSON Schema regex, which takes no flags.
DURATION_PATTERN = re.sub(r"(?<!\\)[a-z]", lambda letter: f"[{letter[0]}{letter[0].upper()}]", INTERVAL.pattern)


class Type(str, Enum):
    """What a key holds, as the reference names it; each maps to one JSON Schema fragment."""

    STRING = "string"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    CHOICE = "one of"
    DURATION = "duration"
    FOLDER = "folder"
    CRON = "cron"
    NAMES = "list of column names"
    STRINGS = "list of strings"
    EMAILS = "list of email addresses"
    SCHEMA = "schema"
    OPTIONS = "reader options"
    SQL = "SQL"
    TRANSFORM = "transform"
    AVRO = "Avro schema"
    BLOCK = "mapping"
    BLOCKS = "list of mappings"
    NAMED_BLOCKS = "mapping of names"
    NAMED_SQL = "mapping of names to SQL"


@dataclass(frozen=True)
class Key:
    """One key of a block. ``default`` None with ``required`` False: absent means "not set"."""

    name: str
    type: Type
    about: str
    default: object = None
    required: bool = False
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    # The block a mapping (or each mapping of a list) is read as.
    block: str | None = None
    # When the default is a rule, not a value ("the sink's path + _dead_letter").
    default_text: str | None = None

    @property
    def shown_default(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if self.default is None or self.default == ():
            return ""
        if isinstance(self.default, bool):
            return str(self.default).lower()
        if isinstance(self.default, Enum):
            return str(self.default.value)
        return f"{self.default:,}" if isinstance(self.default, int) else str(self.default)

    @property
    def bound(self) -> str:
        parts = []
        if self.minimum is not None:
            parts.append(f">= {self.minimum:,}")
        if self.maximum is not None:
            parts.append(f"<= {self.maximum:,}")
        if self.choices and self.type is not Type.OPTIONS:
            parts.append(", ".join(self.choices))
        if self.pattern is not None and self.type is not Type.DURATION:
            parts.append(f"`{self.pattern}`")
        if self.type is Type.DURATION:
            parts.append(f"<= {MAX_DURATION_SECONDS // 86_400:,} days")
        return "; ".join(parts)


@dataclass(frozen=True)
class Block:
    """A mapping of the catalog: its keys, where it sits (``path``, as refusals name it) and, for a block of one
    variant (a source of one type), the key and value that select it."""

    name: str
    path: str
    about: str
    keys: tuple[Key, ...]
    # (key, value): this block applies when the mapping's ``key`` is ``value`` (a source's type, a sink's format).
    when: tuple[str, str] | None = None
    # Keys of which at most one may be set.
    exclusive: tuple[str, ...] = ()
    # Option names of which exactly one must be set (a Kafka source's subscription).
    one_option_of: tuple[str, ...] = ()

    def key(self, name: str) -> Key:
        return next(key for key in self.keys if key.name == name)


def choices(values: Iterable[Enum]) -> tuple[str, ...]:
    return tuple(str(value.value) for value in values)


def positive(name: str, about: str, maximum: int, default: int | None = None) -> Key:
    return Key(name, Type.INTEGER, about, default=default, minimum=1, maximum=maximum)


SCHEMA = Key("schema", Type.SCHEMA, "the declared columns: name to Spark SQL type (`decimal(12,2)`, "
              "`string not null`, `struct<...>`); inferring one from whatever arrives first is not reproducible",
              required=True)


def evolution(policies: Iterable[SchemaEvolution], default: SchemaEvolution, what: str) -> Key:
    return Key("schema_evolution", Type.CHOICE, f"what the stream does with fields the schema does not declare "
               f"({what})", default=default, choices=choices(policies))
