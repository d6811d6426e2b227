"""``python -m sluice.catalog validate [FILE]``: check a catalog without running anything.

Prints each stream with its source, sink, resolved schema (the Spark types it will read) and drift policy, the
columns its transform hands on and its expectations, and exits 0; or prints the first error, with the stream and the
field, and exits 2. FILE defaults to ``SLUICE_CATALOG`` or the bundled catalog.
"""

from __future__ import annotations

import argparse
import sys

from sluice.catalog import load_catalog
from sluice.constants import FileFormat
from sluice.errors import CatalogError
from sluice.kinds.files import names_columns_by_header
from sluice.model.stream import StreamSpec


def describe(stream: StreamSpec) -> str:
    source, sink = stream.source, stream.sink
    lines = [f"{stream.name}: {source.type.value} {source.format.value} {source.origin} -> {sink.format.value} "
             f"{sink.destination} ({sink.mode.value}, {sink.engine.value})"]
    for column in source.schema.columns:
        lines.append(f"    {column.name}: {column.data_type.sql()}{'' if column.nullable else ' NOT NULL'}")
    kept = ("undeclared columns of a file's header, and misfits" if names_columns_by_header(source.options)
            else "misfits") \
        if source.format is FileFormat.CSV else "undeclared fields and misfits"
    lines.append(f"  schema_evolution {source.schema_evolution.value}"
                 + (f" ({kept} in _rescued_data)" if source.rescues else ""))
    lines.append(f"  transform {stream.transform_name} -> {', '.join(stream.output_columns)}")
    lines += [f"  expect {rule.name} ({rule.on_violation.value}): {rule.check}" for rule in stream.expectations]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice.catalog", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    validate = commands.add_parser("validate", help="check a catalog and print its streams")
    validate.add_argument("file", nargs="?", help="default: SLUICE_CATALOG or the bundled catalog")
    args = parser.parse_args(argv)
    try:
        catalog = load_catalog(args.file)
    except CatalogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{catalog.source_file}: {len(catalog)} stream(s)")
    for stream in catalog:
        print(describe(stream))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
