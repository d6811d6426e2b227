"""Runtime pins apart from development ones: the images install requirements.txt alone, so nothing that only tests,
lint or the docs need may be in it, and every pin is exact."""

from __future__ import annotations

import re
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
# What only development needs: the test runner, the linters, the browser driver, the docs site.
DEVELOPMENT = {"pytest", "pytest-timeout", "ruff", "mypy", "import-linter", "playwright", "mkdocs", "mkdocs-material",
               "pymdown-extensions", "moto"}


def pins(name: str) -> dict[str, str]:
    found = {}
    for line in (PROJECT / name).read_text(encoding="utf-8").splitlines():
        if line.startswith(("#", "-r")) or not line.strip():
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s=]+)", line)
        assert match, f"{name}: not an exact pin: {line!r}"
        found[match.group(1).lower().replace("_", "-")] = match.group(2)
    return found


def test_runtime_and_development_pins_are_apart_and_exact() -> None:
    runtime, development = pins("requirements.txt"), pins("requirements-dev.txt")
    assert DEVELOPMENT & set(runtime) == set(), "development tools in the runtime pins the images install"
    assert DEVELOPMENT - {"moto"} <= set(development)
    assert set(runtime).isdisjoint(development), "a package pinned twice"
    assert "-r requirements.txt" in (PROJECT / "requirements-dev.txt").read_text(encoding="utf-8").splitlines()
    for needed in ("apache-airflow", "pyspark", "delta-spark", "deltalake", "confluent-kafka", "obstore", "pyyaml"):
        assert needed in runtime, needed


def test_the_images_install_the_runtime_pins_only() -> None:
    for path in (PROJECT / "include" / "docker").glob("*.Dockerfile"):
        text = path.read_text(encoding="utf-8")
        instructions = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
        assert not any("requirements-dev" in line for line in instructions), f"{path.name} installs development tools"
        assert "-r /opt/sluice/requirements.txt" in text, path.name
