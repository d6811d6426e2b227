"""One version: pyproject.toml's, as the installed package's metadata records it."""

from __future__ import annotations

from pathlib import Path

import pytest

import sluice
from sluice.__main__ import main

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

PROJECT = Path(__file__).resolve().parents[2]


def test_the_version_is_the_projects(capsys: pytest.CaptureFixture[str]) -> None:
    declared = tomllib.loads((PROJECT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert sluice.__version__ == declared
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"sluice {declared}\n"
