"""``python -m sluice``: its help, and its output piped into a reader that stops early."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Runs the command ``fake`` with its stdout a pipe whose reader is gone before the first line, like ``| head -0``:
# it prints ``sys.argv[1]`` bytes, then returns ``sys.argv[2]``. With a third argument stdout stays readable, and the
# command raises the error a broken stderr gives instead.
CLOSED_PIPE = """
import os, sys, types
if len(sys.argv) < 4:
    read, write = os.pipe()
    os.close(read)
    os.dup2(write, 1)

def fake_main(args):
    if len(sys.argv) > 3:
        raise BrokenPipeError("stderr")
    sys.stdout.write("x" * int(sys.argv[1]))
    return int(sys.argv[2])

import sluice.__main__ as cli
sys.modules["fake_command"] = types.SimpleNamespace(main=fake_main)
cli.COMMANDS["fake"] = "fake_command"
sys.exit(cli.main(["fake"]))
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}  # stdout buffers
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=environment, timeout=120)


def test_help_goes_to_stdout_and_a_wrong_command_to_stderr() -> None:
    asked = run("-m", "sluice", "--help")
    assert asked.returncode == 0 and "python -m sluice status" in asked.stdout and not asked.stderr
    wrong = run("-m", "sluice", "stauts")
    assert wrong.returncode == 2 and "python -m sluice status" in wrong.stderr and not wrong.stdout


@pytest.mark.parametrize(("size", "code", "expected"), [
    (100, 0, 0),  # all of it in the buffer: the pipe breaks at the last flush, and the command's outcome stands
    (100, 1, 1),  # e.g. `sluice health | head` of a FAIL
    (1_000_000, 0, 141),  # more than a pipe holds: the command was cut short, as by SIGPIPE
])
def test_a_reader_that_stops_early_is_no_traceback(size: int, code: int, expected: int) -> None:
    done = run("-c", CLOSED_PIPE, str(size), str(code))

    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == expected


def test_a_broken_stderr_is_still_an_error() -> None:
    done = run("-c", CLOSED_PIPE, "0", "0", "stderr")

    assert done.returncode == 1 and "BrokenPipeError: stderr" in done.stderr
