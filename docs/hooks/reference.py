"""The docs site's references, generated from the code at build time so that they cannot drift (mkdocs ``hooks:``).

- ``reference/catalog.md``: every catalog key with its type, default and bound (:mod:`sluice.catalog.keys`);
- ``reference/health-codes.md``: the checkpoint health codes (:data:`sluice.constants.FAULT_CODES`);
- ``reference/cli.md``: every command's ``--help``, as ``python -m sluice ...`` prints it;
- ``reference/airflow.md``: the operators', sensors', triggers' and hooks' parameters, read from the classes;
- ``changelog.md`` and ``contributing.md``: the repository's CHANGELOG.md and CONTRIBUTING.md.

A page may also hold ``<!-- sluice:health-codes -->``, replaced by the codes' table. The generated pages are virtual:
nothing is written under docs/.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

PROJECT = Path(__file__).resolve().parents[2]
IMPORT_ROOTS = [PROJECT / "include", PROJECT / "spark_apps", PROJECT / "plugins", PROJECT]
for root in reversed(IMPORT_ROOTS):  # this checkout's code, not an installed copy's
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))

HEALTH_CODES_MARK = "<!-- sluice:health-codes -->"
# Copied into the site as they are: files the pages show that live beside the code.
ASSETS = {"assets/streams_page.png": PROJECT / "plugins" / "sluice_airflow" / "streams_page.png"}


def on_files(files: Files, config: Any) -> Files:
    pages = {
        "reference/catalog.md": catalog_page,
        "reference/health-codes.md": health_codes_page,
        "reference/cli.md": cli_page,
        "reference/airflow.md": airflow_page,
        "changelog.md": lambda: (PROJECT / "CHANGELOG.md").read_text(encoding="utf-8"),
        "contributing.md": lambda: _relinked((PROJECT / "CONTRIBUTING.md").read_text(encoding="utf-8")),
    }
    for uri, build in pages.items():
        files.append(File.generated(config, uri, content=build()))
    for uri, source in ASSETS.items():
        files.append(File.generated(config, uri, abs_src_path=str(source)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    return markdown.replace(HEALTH_CODES_MARK, _health_table())


def _relinked(text: str) -> str:
    """CONTRIBUTING.md links into docs/ for GitHub; on the site those pages sit one level up."""
    return re.sub(r"\]\(docs/", "](", text)


def catalog_page() -> str:
    from sluice.catalog.keys import reference_markdown
    from sluice.catalog.schema import SCHEMA_FILE

    schema = SCHEMA_FILE.relative_to(PROJECT)
    return "\n".join([
        "# Catalog reference",
        "",
        "Generated from `include/sluice/catalog/keys.py`, the table that the JSON Schema is generated from and that a "
        "unit test checks against the loader. A key's default applies when it is absent; a bound is inclusive. The "
        "loader checks more than these (columns a transform names, paths two streams share, WARN above CRITICAL); "
        "every refusal names the stream and the field.",
        "",
        f"Editors that read `# yaml-language-server: $schema=...` check a catalog against `{schema}` as it is typed; "
        "the bundled catalogs name it on their first line. `make schema` (`python -m sluice catalog-schema --write`) "
        "regenerates it. `python -m sluice.catalog validate FILE` runs the loader itself.",
        "",
        reference_markdown(),
    ])


def _health_table() -> str:
    from sluice.constants import fault_code_table

    return fault_code_table()


def health_codes_page() -> str:
    return "\n".join([
        "# Health codes",
        "",
        "The stable codes of the checkpoint health gate (`python -m sluice health`, the DAGs' health task, "
        "`make status`), from `sluice.constants.FAULT_CODES`. A FAIL stops the run before Spark starts; a WARN is "
        "logged. See [Checkpoint health, locks and repair](../guides/checkpoint-health.md) for what to do.",
        "",
        _health_table(),
        "",
    ])


def _help(args: list[str]) -> str:
    # In a scratch home and data root: a command that ignored --help would do its work there, not in the checkout.
    with tempfile.TemporaryDirectory(prefix="sluice-docs-") as scratch:
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join(str(root) for root in IMPORT_ROOTS),
                           COLUMNS="100", PYTHONDONTWRITEBYTECODE="1", AIRFLOW_HOME=f"{scratch}/airflow",
                           SLUICE_DATA_ROOT=f"{scratch}/data")
        done = subprocess.run([sys.executable, "-m", *args, "--help"], capture_output=True, text=True, timeout=120,
                              env=environment, cwd=scratch, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"python -m {' '.join(args)} --help exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout.rstrip()


def cli_page() -> str:
    from sluice.__main__ import COMMANDS

    commands = [["sluice", name] for name in COMMANDS]
    commands += [["sluice.catalog"], ["sluice.cli.devserver"]]
    with ThreadPoolExecutor(max_workers=4) as pool:
        helps = list(pool.map(_help, [["sluice"], *commands]))
    lines = ["# Command line", "",
             "Generated at build time from each command's `--help`. `make run`, `make stop` and `make clean` are "
             "`python -m sluice.cli.devserver`; `make status` is `python -m sluice status`.", "",
             "## python -m sluice", "", "```text", helps[0], "```", ""]
    for command, text in zip(commands, helps[1:], strict=True):
        lines += [f"## python -m {' '.join(command)}", "", "```text", text, "```", ""]
    return "\n".join(lines)


# What each kind of Airflow class is called on the page, in the page's order.
KINDS = ("operator", "sensor", "trigger", "hook")


def _kind(cls: type) -> str | None:
    from airflow.sdk import BaseHook, BaseOperator, BaseSensorOperator
    from airflow.triggers.base import BaseTrigger

    for kind, base in (("sensor", BaseSensorOperator), ("operator", BaseOperator), ("trigger", BaseTrigger),
                       ("hook", BaseHook)):
        if issubclass(cls, base):
            return kind
    return None


def _airflow_classes() -> list[tuple[str, type]]:
    """Every operator, sensor, trigger and hook that the plugins package defines, found by walking it."""
    import sluice_airflow

    found: dict[tuple[int, str], tuple[str, type]] = {}
    for module_info in pkgutil.walk_packages(sluice_airflow.__path__, "sluice_airflow."):
        with warnings.catch_warnings():  # what Airflow's and FastAPI's imports say of their own dependencies
            warnings.simplefilter("ignore", DeprecationWarning)
            module = importlib.import_module(module_info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            kind = _kind(value) if value.__module__ == module.__name__ else None
            if kind is not None:
                found[(KINDS.index(kind), f"{value.__module__}.{value.__qualname__}")] = (kind, value)
    return [found[key] for key in sorted(found)]


def _shown(value: Any) -> str:
    return f"`{value!r}`"  # a pipe inside a code span splits no table cell (Python-Markdown's tables)


def _annotation(parameter: inspect.Parameter) -> str:
    if parameter.annotation is inspect.Parameter.empty:
        return ""
    text = parameter.annotation if isinstance(parameter.annotation, str) else inspect.formatannotation(
        parameter.annotation)
    return f"`{text}`"


def _markdown(text: str) -> str:
    """A docstring's reStructuredText roles and literals as Markdown."""
    text = re.sub(r":(?:class|func|mod|data|meth|attr):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _split_doc(doc: str) -> tuple[str, dict[str, str]]:
    """The docstring's prose, and its ``:param name: meaning`` lines by name."""
    prose: list[str] = []
    params: dict[str, str] = {}
    current: str | None = None
    for line in doc.splitlines():
        found = re.match(r"^:param (\w+):\s*(.*)$", line)
        if found:
            current = found.group(1)
            params[current] = found.group(2)
        elif current is not None and line.strip() and not line.startswith(":"):
            params[current] += " " + line.strip()
        else:
            current = None
            prose.append(line)
    return _markdown("\n".join(prose).strip()), {name: _markdown(text) for name, text in params.items()}


def _parameters(cls: type) -> list[tuple[inspect.Parameter, type]]:
    """The keyword parameters of the class and of its Sluice bases, each where it is declared first."""
    seen: dict[str, tuple[inspect.Parameter, type]] = {}
    for owner in cls.__mro__:
        if not owner.__module__.startswith("sluice_airflow") or "__init__" not in owner.__dict__:
            continue
        for name, parameter in inspect.signature(owner.__dict__["__init__"]).parameters.items():
            if name != "self" and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                         inspect.Parameter.VAR_KEYWORD):
                seen.setdefault(name, (parameter, owner))
    return list(seen.values())


def airflow_page() -> str:
    lines = ["# Airflow operators, sensors, triggers and hooks", "",
             "Generated at build time from the classes of `plugins/sluice_airflow`: each one's docstring and the "
             "keyword parameters of its `__init__` and of its Sluice bases'. Every operator and sensor also takes "
             "Airflow's `BaseOperator` arguments (`task_id`, `retries`, ...).", ""]
    for kind, cls in _airflow_classes():
        what = f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"
        bases = ", ".join(f"`{base.__name__}`" for base in cls.__bases__)
        lines += [f"## {cls.__name__}", "", f"`{cls.__module__}.{cls.__name__}`, {what} (bases: {bases}).", ""]
        prose, meanings = _split_doc(inspect.getdoc(cls) or "")
        if prose:
            lines += [prose, ""]
        parameters = _parameters(cls)
        if parameters:
            lines += ["| parameter | type | default | meaning |", "| --- | --- | --- | --- |"]
            for parameter, owner in parameters:
                default = "required" if parameter.default is inspect.Parameter.empty else _shown(parameter.default)
                meaning = meanings.get(parameter.name) or _split_doc(inspect.getdoc(owner) or "")[1].get(
                    parameter.name, "")
                if owner is not cls:
                    meaning = f"{meaning} (from `{owner.__name__}`)".strip()
                lines.append(f"| `{parameter.name}` | {_annotation(parameter)} | {default} | "
                             f"{meaning.replace('|', '&#124;')} |")
            lines.append("")
        templated = getattr(cls, "template_fields", ())
        if templated:
            lines += [f"Templated: {', '.join(f'`{name}`' for name in templated)}.", ""]
    return "\n".join(lines)
