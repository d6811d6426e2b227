"""``python -m sluice jars [--force]``: resolve the JVM artifacts of ``include/jvm/pom.xml`` with Maven (see
:mod:`sluice.operations.jars`). ``make venv`` runs it; it does nothing when the jars were resolved from the same
project file already.

Exits 0 when the jars are in place, and also when Maven is not installed (it then says which features need them:
the ``rs`` Delta engine runs without); 1 when Maven fails, with its last lines.
"""

from __future__ import annotations

import argparse
import shutil
import sys

from sluice.errors import SluiceError
from sluice.operations.jars import NEEDS_JARS, installed, jars_home, resolve
from sluice.operations.jvm import spark_home


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice jars", description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="resolve again even when the jars are up to date")
    parser.add_argument("--mvn", default="mvn", help="the Maven command (default: mvn on PATH)")
    parser.add_argument("--with", dest="extra", action="append", default=[], metavar="PROFILE",
                        help="a further profile of include/jvm/pom.xml for Spark's jars (object-stores: abfss, gs)")
    args = parser.parse_args(argv)
    home = jars_home()
    if installed(home, extra_profiles=tuple(args.extra)) and not args.force:
        print(f"sluice: the JVM jars in {home} are up to date")
        return 0
    if shutil.which(args.mvn) is None:
        print(f"sluice: Maven ({args.mvn}) is not installed, so no JVM jars were resolved. Sluice runs on the rs Delta "
              f"engine without them; these need them: {NEEDS_JARS}. Install Maven, then run `make venv` again",
              file=sys.stderr)
        return 0
    try:
        sets = resolve(home, spark_jars_dir=spark_home() / "jars", mvn=args.mvn, extra_profiles=tuple(args.extra))
    except (SluiceError, RuntimeError, OSError) as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    for artifact_set, names in sets.items():
        print(f"sluice: {len(names)} {artifact_set} jars in {home / artifact_set}")
    return 0
