"""``python -m sluice``: its help, and its output piped into a reader that stops early."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CLOSED_PIPE = """
import os, sys
read, write = os.pipe()
os.close(read)  # the reader is gone before the first line, like `| head -0`
os.dup2(write, 1)
from sluice.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def run(*args: str, code: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "sluice", *args]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120)


def test_help_goes_to_stdout_and_a_wrong_command_to_stderr() -> None:
    asked = run("--help")
    assert asked.returncode == 0 and "python -m sluice status" in asked.stdout and not asked.stderr
    wrong = run("stauts")
    assert wrong.returncode == 2 and "python -m sluice status" in wrong.stderr and not wrong.stdout


@pytest.mark.parametrize("command", [["health", "--json"], ["health"]])
def test_a_reader_that_stops_early_is_no_error(tmp_path: Path, command: list[str]) -> None:
    done = run(*command, code=CLOSED_PIPE, env={"SLUICE_DATA_ROOT": str(tmp_path)})

    assert "BrokenPipeError" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0
