"""Bytecode in the zip of PySpark that Spark puts first on the path of its Python processes.

Spark starts each Python process of an application (the executors' workers, and a Python data source's planners: its
reader, its writer, its commit) with ``$SPARK_HOME/python/lib/pyspark.zip`` first on ``PYTHONPATH``. pip installs
that zip as PySpark ships it, with sources only, and Python keeps no bytecode for a zip: every such process compiles
PySpark's modules again, about 0.4 s of a core each. The executors' write path of one stream starts four of them in
turn; measured here, a small run through it took 12.1 s with the zip as shipped and 10.1 s with bytecode in it.

:func:`add_bytecode` adds each module's bytecode to the zip that Spark uses (``$SPARK_HOME``'s, by default the
installed PySpark's), as pip does for the package's own files at install. The bytecode is for this interpreter and
"unchecked" (PEP 552): it is written once from the very sources beside it. Another Python version ignores it (its
magic number differs) and compiles the sources as before. The new entries are appended: every entry of the zip stays
at its offset, so a running Spark application, whose Python processes keep the zip's directory, goes on importing
from it. ``make venv`` and the images run it (``python -m sluice pyspark-bytecode``).
"""

from __future__ import annotations

import copy
import importlib.util
import marshal
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# A module every PySpark process imports: its bytecode, for this interpreter, says the zip is done.
MARKER = "pyspark/__init__.pyc"
# PEP 552: a hash-based .pyc that Python does not check against its source.
_UNCHECKED_HASH = (0b01).to_bytes(4, "little")


def installed_zip() -> Path | None:
    """The zip that Spark puts on its Python processes' path: ``python/lib/pyspark.zip`` under the Spark home that
    spark-submit uses (:func:`sluice.operations.jvm.spark_home`), found without importing PySpark. None when there is
    no such zip."""
    from sluice.operations.jvm import spark_home

    try:
        path = spark_home() / "python" / "lib" / "pyspark.zip"
    except RuntimeError:  # PySpark is not installed
        return None
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
    # A name no one can predict, created with O_EXCL: a link planted beside the zip is never written through.
    descriptor, created = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(descriptor)
    temporary = Path(created)
    try:
        with zipfile.ZipFile(path) as source:
            entries = source.infolist()
            sources = [entry for entry in entries if entry.filename.endswith(".py")]
            stale = {f"{entry.filename}c" for entry in sources} & {entry.filename for entry in entries}
            if stale:  # another Python's bytecode beside the sources: a zip of its own, without it
                with zipfile.ZipFile(temporary, "w") as target:
                    for entry in entries:
                        if entry.filename not in stale:  # a copy: writing moves an entry's offset
                            target.writestr(copy.copy(entry), source.read(entry))
            else:  # the zip as it is, every entry at its offset
                shutil.copyfile(path, temporary)
            with zipfile.ZipFile(temporary, "a") as target:
                for entry in sources:
                    target.writestr(_entry(f"{entry.filename}c", entry.date_time),
                                    _bytecode(source.read(entry), f"{path}{os.sep}{entry.filename}"))
        shutil.copymode(path, temporary)
        _check_imports(temporary, probe)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return len(sources)


def _bytecode(source: bytes, filename: str) -> bytes:
    """An unchecked hash-based .pyc of a module's source, compiled as the interpreter does by default (no -O).
    ``filename`` is the name zipimport gives the code it compiles itself, so tracebacks read the same."""
    code = compile(source, filename, "exec", dont_inherit=True, optimize=0)
    return importlib.util.MAGIC_NUMBER + _UNCHECKED_HASH + importlib.util.source_hash(source) + marshal.dumps(code)


def _entry(name: str, date_time: tuple[int, int, int, int, int, int]) -> zipfile.ZipInfo:
    entry = zipfile.ZipInfo(name, date_time)
    entry.compress_type = zipfile.ZIP_DEFLATED
    entry.external_attr = 0o644 << 16
    return entry


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
