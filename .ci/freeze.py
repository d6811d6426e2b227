"""Rewrite requirements.txt and requirements-dev.txt from the current environment (``make freeze``).

The runtime set is what pyproject.toml's ``[project] dependencies`` need, transitively, as installed now; every other
installed distribution is a development one (``[project.optional-dependencies] dev`` and what those need). The
images install requirements.txt alone, so a package lands there only if something at run time needs it.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the copy pip carries
    from pip._vendor import tomli as tomllib

PROJECT = Path(__file__).resolve().parent.parent
RUNTIME_HEADER = """\
# Pinned, installed and tested together (Python 3.11): what Sluice needs at run time, and all the images install.
# Regenerate with 'make freeze' after an upgrade (the roots are pyproject.toml's [project] dependencies).
# pyspark and pyspark-client must stay on the same version: the client overwrites pyspark's files.
"""
DEV_HEADER = """\
# The development set on top of the runtime one: tests, lint, the docs site. `make venv` installs both.
# Regenerate with 'make freeze' (the roots are pyproject.toml's [project.optional-dependencies] dev).
-r requirements.txt
"""


def closure(roots: list[str], installed: dict[str, importlib.metadata.Distribution]) -> set[str]:
    """Every installed distribution the roots need, with the extras they ask for."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    pending = [(Requirement(root), ()) for root in roots]
    found: set[str] = set()
    while pending:
        requirement, _ = pending.pop()
        name = canonicalize_name(requirement.name)
        key = (name, tuple(sorted(requirement.extras)))
        if key in seen or name not in installed:
            continue
        seen.add(key)
        found.add(name)
        for text in installed[name].requires or []:
            needed = Requirement(text)
            extras = ("", *requirement.extras)
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra}) for extra in extras):
                pending.append((needed, ()))
    return found


def main() -> int:
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    installed = {canonicalize_name(dist.metadata["Name"]): dist for dist in importlib.metadata.distributions()}
    for name in ("sluice", "pip", "setuptools", "wheel"):  # the project itself, and what pip freeze leaves out
        installed.pop(name, None)
    runtime = closure(project["dependencies"], installed)
    missing = [root for root in project["dependencies"] if canonicalize_name(Requirement(root).name) not in runtime]
    if missing:
        sys.exit(f"freeze: not installed: {', '.join(missing)}")

    def pins(names: set[str]) -> str:
        return "".join(f"{installed[name].metadata['Name']}=={installed[name].version}\n"
                       for name in sorted(names, key=lambda name: installed[name].metadata["Name"].lower()))

    (PROJECT / "requirements.txt").write_text(RUNTIME_HEADER + pins(runtime), encoding="utf-8")
    (PROJECT / "requirements-dev.txt").write_text(DEV_HEADER + pins(set(installed) - runtime), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
