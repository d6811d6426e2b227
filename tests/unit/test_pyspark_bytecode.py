"""Bytecode in the zip of PySpark that Spark's Python processes import first: written whole or not at all."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sluice.operations.pyspark_bytecode import add_bytecode, has_bytecode, installed_zip


def small_zip(folder: Path, **modules: str) -> Path:
    path = folder / "pyspark.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for name, source in modules.items():
            archive.writestr(name, source)
    return path


def test_the_installed_pyspark_zip_imports_from_its_bytecode(tmp_path: Path) -> None:
    installed = installed_zip()
    assert installed is not None, "pip installs PySpark with python/lib/pyspark.zip"
    copy = tmp_path / "pyspark.zip"
    copy.write_bytes(installed.read_bytes())

    compiled = add_bytecode(copy)  # the installed zip may hold bytecode already: it is written again

    with zipfile.ZipFile(copy) as archive:
        names = archive.namelist()
    sources = [name for name in names if name.endswith(".py")]
    assert compiled == len(sources) > 500 and all(f"{name}c" in names for name in sources)
    assert has_bytecode(copy)
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import pyspark.worker as w; "
             "print(w.__file__, w.__spec__.loader.get_code('pyspark.worker').co_filename)")
    done = subprocess.run([sys.executable, "-c", probe, str(copy)], capture_output=True, text=True, check=True)
    # Loaded from its bytecode, under the name zipimport gives the source it compiles: tracebacks read the same.
    assert done.stdout.split() == [f"{copy}/pyspark/worker.pyc", f"{copy}/pyspark/worker.py"]


def test_a_process_importing_from_the_zip_goes_on_importing_after_the_rewrite(tmp_path: Path) -> None:
    """Python keeps a zip's directory (offsets included) once it imported from it: a running Spark application's
    processes must not find other entries at those offsets afterwards."""
    path = small_zip(tmp_path, **{"pkg/__init__.py": "", **{f"pkg/m{index}.py": f"VALUE = {index}\n"
                                                           for index in range(50)}})
    running = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import pkg.m0; sys.stdin.readline(); "
                               "import pkg.m49; print(pkg.m49.VALUE)", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        add_bytecode(path, probe=("pkg.m1",))
        out, err = running.communicate("go\n", timeout=60)
    finally:
        running.kill()
    assert (running.returncode, out.strip()) == (0, "49"), err


def test_bytecode_for_another_python_is_ignored_and_the_source_compiled(tmp_path: Path) -> None:
    path = small_zip(tmp_path, **{"pkg/__init__.py": "VALUE = 'from source'\n"})
    add_bytecode(path, probe=("pkg",))
    with zipfile.ZipFile(path) as archive:
        pyc = archive.read("pkg/__init__.pyc")
    assert pyc[:4] == importlib.util.MAGIC_NUMBER
    other = tmp_path / "other" / "pyspark.zip"  # the same zip, its bytecode stamped for another interpreter
    other.parent.mkdir()
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(other, "w") as target:
        for entry in source.infolist():
            data = source.read(entry)
            target.writestr(entry, b"\x00\x00\r\n" + data[4:] if entry.filename.endswith(".pyc") else data)
    probe = "import sys; sys.path.insert(0, sys.argv[1]); import pkg; print(pkg.VALUE, pkg.__file__)"
    done = subprocess.run([sys.executable, "-c", probe, str(other)], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["from", "source", f"{other}/pkg/__init__.py"]
    assert not has_bytecode(other)


@pytest.mark.parametrize(("source", "error"), [("def broken(:\n", SyntaxError),
                                                ("raise ImportError('no such thing')\n", OSError)])
def test_a_zip_that_would_not_import_is_left_as_it_was(tmp_path: Path, source: str, error: type[Exception]) -> None:
    path = small_zip(tmp_path, **{"pkg/__init__.py": source})
    before = path.read_bytes()

    with pytest.raises(error):
        add_bytecode(path, probe=("pkg",))

    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["pyspark.zip"]


def test_the_rewrite_never_goes_through_a_link_planted_at_a_temporary_name(tmp_path: Path) -> None:
    import os

    path = small_zip(tmp_path, **{"pyspark/__init__.py": "", "pyspark/worker.py": "x = 1\n"})
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / f".pyspark.zip.{os.getpid()}.tmp").symlink_to(victim)
    add_bytecode(path, probe=("pyspark.worker",))
    assert victim.read_text() == "keep me" and has_bytecode(path)
