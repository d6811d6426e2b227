"""Bytecode in the zip of PySpark that Spark puts first on the path of its Python processes.

Spark starts each Python process of an application (the executors' workers, and a Python data source's planners: its
reader, its writer, its commit) with ``$SPARK_HOME/python/lib/pyspark.zip`` first on ``PYTHONPATH``. pip installs
that zip as PySpark ships it, with sources only, and Python keeps no bytecode for a zip: every such process compiles
PySpark's modules again, about 0.4 s of a core each. The executors' write path of one stream starts four of them in
turn; measured here, a small run through it took 12.1 s with the zip as shipped and 10.1 s with bytecode in it.

:func:`add_bytecode` rewrites the zip of the installed PySpark with each module's bytecode beside its source, as
pip does for the package's own files at install. The bytecode is for this interpreter and "unchecked" (PEP 552):
the zip is written once from the very sources beside it. Another Python version ignores it (its magic number
differs) and compiles the sources as before. ``make venv`` runs it (``python -m sluice pyspark-bytecode``).
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

# A module every PySpark process imports: its bytecode, for this interpreter, says the zip is done.
MARKER = "pyspark/__init__.pyc"
# PEP 552: a hash-based .pyc that Python does not check against its source.
_UNCHECKED_HASH = (0b01).to_bytes(4, "little")


def installed_zip() -> Path | None:
    """The zip of the installed PySpark (pip's ``SPARK_HOME`` is the package's folder), without importing PySpark;
    None when PySpark is not installed as a package with that zip."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "python" / "lib" / "pyspark.zip"
    return path if path.is_file() else None


def has_bytecode(path: Path) -> bool:
    """Whether the zip holds bytecode for this interpreter."""
    with zipfile.ZipFile(path) as archive:
        try:
            return archive.read(MARKER)[:4] == importlib.util.MAGIC_NUMBER
        except KeyError:
            return False


def add_bytecode(path: Path, probe: tuple[str, ...] = ("pyspark.worker", "pyspark.daemon")) -> int:
    """Rewrite the zip at ``path`` with bytecode beside each module's source, in one atomic replacement once a fresh
    interpreter has imported the ``probe`` modules from the new zip, from their bytecode; the number of modules
    compiled. Raises ``SyntaxError`` or ``OSError`` (the zip is then left as it was)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    compiled = 0
    try:
        with zipfile.ZipFile(path) as source, zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as target:
            for entry in source.infolist():
                if entry.filename.endswith(".pyc"):
                    continue  # written again below, for this interpreter
                data = source.read(entry)
                target.writestr(entry, data)
                if entry.filename.endswith(".py"):
                    # The name zipimport would give the code it compiles itself: tracebacks read the same.
                    code = compile(data, f"{path}{os.sep}{entry.filename}", "exec", dont_inherit=True)
                    pyc = importlib.util.MAGIC_NUMBER + _UNCHECKED_HASH + importlib.util.source_hash(data)
                    target.writestr(zipfile.ZipInfo(entry.filename + "c", entry.date_time),
                                    pyc + marshal.dumps(code), zipfile.ZIP_DEFLATED)
                    compiled += 1
        shutil.copymode(path, temporary)
        _check_imports(temporary, probe)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return compiled


def _check_imports(archive: Path, modules: tuple[str, ...]) -> None:
    """A fresh interpreter imports ``modules`` from the zip, each from its bytecode."""
    probe = ("import importlib, sys\n"
             "sys.path.insert(0, sys.argv[1])\n"
             "for name in sys.argv[2:]:\n"
             "    where = importlib.import_module(name).__file__\n"
             "    assert where.startswith(sys.argv[1]) and where.endswith('.pyc'), where\n")
    done = subprocess.run([sys.executable, "-c", probe, str(archive), *modules], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": ""})
    if done.returncode != 0:
        raise OSError(f"{', '.join(modules)} do not import from the rewritten zip: {done.stderr.strip()[-500:]}")
