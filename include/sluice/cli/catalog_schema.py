"""``python -m sluice catalog-schema [--write | --check]``: the catalog's JSON Schema, generated from the code.

Prints it; ``--write`` rewrites the file shipped with the package (include/sluice/catalog/streams.schema.json, which
the bundled catalogs name on their first line for editors); ``--check`` exits 1 when that file is out of date.
"""

from __future__ import annotations

import argparse
import sys

from sluice.catalog.schema import SCHEMA_FILE, schema_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice catalog-schema", description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help=f"rewrite {SCHEMA_FILE.name} beside the catalog package")
    what.add_argument("--check", action="store_true", help=f"exit 1 if {SCHEMA_FILE.name} differs from the code's")
    args = parser.parse_args(argv)
    text = schema_text()
    if args.write:
        SCHEMA_FILE.write_text(text, encoding="utf-8")
        print(f"wrote {SCHEMA_FILE}")
    elif args.check:
        current = SCHEMA_FILE.read_text(encoding="utf-8") if SCHEMA_FILE.exists() else ""
        if current != text:
            print(f"{SCHEMA_FILE} is out of date: run `make schema`", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0
