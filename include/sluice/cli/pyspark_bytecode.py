"""``python -m sluice pyspark-bytecode``: put bytecode into the zip of PySpark that Spark's Python processes import
first (see :mod:`sluice.operations.pyspark_bytecode`). ``make venv`` and the images run it after the install.

Exits 0 when the zip holds bytecode for this interpreter (now or already), 1 with the reason on stderr (Spark's
Python processes then compile PySpark as they start: only slower). Run it again after reinstalling pyspark.
"""

from __future__ import annotations

import argparse
import sys

from sluice.operations.pyspark_bytecode import add_bytecode, has_bytecode, installed_zip


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m sluice pyspark-bytecode", description=__doc__.split("\n\n")[0]) \
        .parse_args(argv)
    path = installed_zip()
    if path is None:
        print("pyspark-bytecode: no installed PySpark with python/lib/pyspark.zip; nothing to do", file=sys.stderr)
        return 1
    try:
        if has_bytecode(path):
            print(f"{path}: holds bytecode for this Python already")
            return 0
        compiled = add_bytecode(path)
    except Exception as exc:  # a zip that is not one, a module that does not compile or import, a full disk
        print(f"pyspark-bytecode: {path} left as it was: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"{path}: bytecode added for {compiled} modules")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
