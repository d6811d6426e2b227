"""The catalog's JSON Schema, generated from :mod:`sluice.catalog.keys`, for editors (``yaml-language-server``).

It checks what a schema can: the keys of every block, their types, bounds, choices and required keys, the variants
of a source and a sink. What needs the whole stream (a column a transform names, paths two streams share, WARN above
CRITICAL) stays with the loader: an editor's green is not the loader's. ``python -m sluice catalog-schema --write``
rewrites the shipped file; a unit test keeps it equal to this.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sluice.catalog.keys import (
    BLOCKS,
    SINK_BLOCKS,
    SOURCE_BLOCKS,
    Block,
    Key,
    Type,
)
from sluice.limits import SQL_MAX_CHARS

SCHEMA_FILE = Path(__file__).with_name("streams.schema.json")
SCHEMA_ID = "https://sluice.invalid/streams.schema.json"

_SCALAR = {"type": ["string", "number", "boolean"]}
_NAME_LIST = {"type": "array", "items": {"type": "string", "minLength": 1}, "uniqueItems": True}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/$defs/{_def_name(name)}"}


def _def_name(name: str) -> str:
    return name.replace(" (", "_").replace(", ", "_").replace(")", "").replace(" ", "_")


def _key_schema(key: Key, block: Block) -> dict[str, Any]:
    kind = key.type
    schema: dict[str, Any]
    if kind in (Type.STRING, Type.CRON):
        schema = {"type": "string"}
    elif kind is Type.SQL:
        schema = {"type": "string", "minLength": 1, "maxLength": SQL_MAX_CHARS}
    elif kind is Type.FOLDER:
        schema = {"type": "string", "minLength": 1}
    elif kind is Type.DURATION:
        schema = {"type": "string"}
    elif kind is Type.INTEGER:
        schema = {"type": "integer"}
    elif kind is Type.BOOLEAN:
        schema = {"type": "boolean"}
    elif kind is Type.CHOICE:
        schema = {"enum": list(key.choices)}
    elif kind is Type.NAMES:
        schema = dict(_NAME_LIST, minItems=1) if key.required else dict(_NAME_LIST)
    elif kind is Type.STRINGS:
        schema = {"type": "array", "items": {"type": "string", "minLength": 1}}
    elif kind is Type.EMAILS:
        schema = {"type": "array", "items": {"type": "string", "pattern": "@"}}
    elif kind is Type.SCHEMA:
        schema = {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}}
    elif kind is Type.AVRO:
        schema = {"type": ["string", "object"]}
    elif kind is Type.TRANSFORM:
        schema = {"anyOf": [{"enum": list(key.choices)},
                            {"type": "object", "properties": {"sql": {"type": "string", "minLength": 1}},
                             "required": ["sql"], "additionalProperties": False}]}
    elif kind is Type.OPTIONS:
        values: dict[str, Any] = _SCALAR
        if block.one_option_of:  # Kafka: startingOffsets and assign may be given as mappings
            values = {"type": ["string", "number", "boolean", "object", "null"]}
        schema = {"type": "object", "propertyNames": {"enum": list(key.choices)}, "additionalProperties": values}
        if block.one_option_of:
            schema["oneOf"] = [{"required": [name]} for name in block.one_option_of]
    elif kind is Type.BLOCK:
        assert key.block is not None
        schema = _ref(key.block)
    elif kind is Type.BLOCKS:
        assert key.block is not None
        schema = {"type": "array", "items": _ref(key.block)}
    elif kind is Type.NAMED_BLOCKS:
        assert key.block is not None
        schema = {"type": "object", "additionalProperties": _ref(key.block)}
    elif kind is Type.NAMED_SQL:
        schema = {"type": "object", "minProperties": 1, "propertyNames": {"pattern": "^[A-Za-z][A-Za-z0-9_]*$"},
                  "additionalProperties": {"type": "string", "minLength": 1}}
    else:  # pragma: no cover - every Type is handled above
        raise AssertionError(kind)
    if key.minimum is not None:
        schema["minimum"] = key.minimum
    if key.maximum is not None:
        schema["maximum"] = key.maximum
    if key.pattern is not None:
        schema["pattern"] = key.pattern
    about = key.about + (f" (default: {key.shown_default})" if key.shown_default else "")
    if "$ref" in schema:  # a $ref's siblings are ignored by older drafts' tools; keep the description beside it
        return {"allOf": [schema], "description": about}
    return {"description": about, **schema}


def _block_schema(block: Block) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "description": block.about,
        "properties": {key.name: _key_schema(key, block) for key in block.keys},
        "additionalProperties": False,
    }
    required = [key.name for key in block.keys if key.required]
    if required:
        schema["required"] = required
    if block.exclusive:
        schema["not"] = {"required": list(block.exclusive)}
    return schema


def catalog_schema() -> dict[str, Any]:
    """The JSON Schema of a catalog document."""
    definitions = {_def_name(block.name): _block_schema(block) for block in BLOCKS if block.name != "catalog"}
    definitions["source"] = {"description": "A source; its `type` (and a files source's `format`) selects the kind.",
                             "oneOf": [_ref(block.name) for block in SOURCE_BLOCKS]}
    definitions["sink"] = {"description": "A sink; its `format` (delta unless given) selects the kind.",
                           "oneOf": [_ref(block.name) for block in SINK_BLOCKS]}
    top = _block_schema(next(block for block in BLOCKS if block.name == "catalog"))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "Sluice stream catalog",
        **top,
        "$defs": definitions,
    }


def schema_text() -> str:
    return json.dumps(catalog_schema(), indent=2, ensure_ascii=False) + "\n"
