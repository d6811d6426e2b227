"""``python -m sluice jvm-classes``: compile Sluice's own JVM classes (``include/jvm/drift``) against pyspark's jars
into the jar every Sluice Spark application gets (see :func:`sluice.operations.jars.compile_classes`). ``make venv``
runs it when a source changes.

Exits 0 when the jar is built, and also when no ``javac`` is installed (it then says that the JSON drift check and
every micro-batch run without it, slower); 1 when javac fails, with its last lines.
"""

from __future__ import annotations

import argparse
import shutil
import sys

from sluice.errors import SluiceError
from sluice.operations.jars import compile_classes, jars_home
from sluice.operations.jvm import spark_home


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice jvm-classes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--javac", default="javac", help="the Java compiler (default: javac on PATH)")
    args = parser.parse_args(argv)
    if shutil.which(args.javac) is None:
        print(f"sluice: no Java compiler ({args.javac}), so Sluice's JVM classes were not built: the JSON drift check "
              "runs as column expressions and every micro-batch compiles its generated code again, slower. Install a "
              "JDK 17+, then run `make venv` again", file=sys.stderr)
        return 0
    try:
        jar = compile_classes(jars_home(), spark_jars_dir=spark_home() / "jars", javac=args.javac)
    except (SluiceError, OSError) as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    print(f"sluice: Sluice's JVM classes in {jar}")
    return 0
