"""The docs against the code they describe: the README's size and links, the benchmark list against `make bench`,
`make lint`'s description against what it runs, and the generated references (docs/hooks/reference.py)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import yaml

PROJECT = Path(__file__).resolve().parents[2]


def recipe(target: str) -> list[str]:
    """The command lines of a Makefile target."""
    lines = (PROJECT / "Makefile").read_text(encoding="utf-8").splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(f"{target}:"))
    commands = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        commands.append(line.strip())
    return commands


def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sluice_docs_hooks", PROJECT / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_short_and_its_links_lead_somewhere() -> None:
    text = (PROJECT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the docs"
    missing = [link for link in local if not (PROJECT / link).exists()]
    assert missing == [], f"links to nothing: {missing}"


def test_the_benchmarks_page_lists_what_make_bench_runs_in_order() -> None:
    ran = [re.search(r"bench/(\w+\.py)", line).group(1) for line in recipe("bench")]  # type: ignore[union-attr]
    page = (PROJECT / "docs" / "performance" / "benchmarks.md").read_text(encoding="utf-8")
    listed = page.split("<!-- The list of `make bench` scripts")[1].split("<!-- end of the make bench list -->")[0]
    assert re.findall(r"^- `bench/(\w+\.py)`", listed, flags=re.MULTILINE) == ran
    others = {path.name for path in (PROJECT / "bench").glob("bench_*.py")} - set(ran)
    assert all(f"`bench/{name}`" in page for name in others), "every benchmark is on the page"


def test_make_lint_says_what_it_runs() -> None:
    lines = (PROJECT / "Makefile").read_text(encoding="utf-8").splitlines()
    described = next(line for line in lines if line.startswith("lint:")).split("## ", 1)[1]
    for command in recipe("lint"):
        tool, *paths = command.replace("$(BIN)/", "").split()
        assert tool.replace("lint-imports", "import-linter") in described, tool
        if tool in ("ruff", "mypy"):
            paths = [path for path in paths if path != "check"]
            assert f"{tool} ({' '.join(paths)})" in described, f"{tool} {paths} vs {described}"


def test_every_page_is_in_the_nav_and_the_generated_ones_are_made() -> None:
    config = yaml.safe_load((PROJECT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, list):
            return [page for item in nav for page in pages(item)]
        if isinstance(nav, dict):
            return [page for value in nav.values() for page in pages(value)]
        return []

    listed = set(pages(config["nav"]))
    written = {str(path.relative_to(PROJECT / "docs")) for path in (PROJECT / "docs").rglob("*.md")}
    module = hooks()
    generated = {"reference/catalog.md", "reference/health-codes.md", "reference/cli.md", "reference/airflow.md",
                 "changelog.md", "contributing.md"}
    assert listed == written | generated
    assert written.isdisjoint(generated)
    for name in ("catalog_page", "health_codes_page"):
        assert getattr(module, name)().startswith("# ")


def test_the_health_codes_are_generated_into_the_docs() -> None:
    from sluice.constants import fault_code_table

    module = hooks()
    guide = (PROJECT / "docs" / "guides" / "checkpoint-health.md").read_text(encoding="utf-8")
    assert module.HEALTH_CODES_MARK in guide
    assert fault_code_table() in module.on_page_markdown(guide, None, None, None)
    assert fault_code_table() in module.health_codes_page()


def test_the_airflow_reference_documents_every_operator_sensor_trigger_and_hook() -> None:
    """Every class the plugin's packages export (operators and hooks are packages of modules) has its section."""
    import importlib

    from airflow.sdk import BaseHook, BaseOperator
    from airflow.triggers.base import BaseTrigger

    exported = {name for package in ("operators", "hooks", "sensors", "triggers")
                for name, value in vars(importlib.import_module(f"sluice_airflow.{package}")).items()
                if isinstance(value, type) and value.__module__.startswith("sluice_airflow.")
                and issubclass(value, BaseOperator | BaseHook | BaseTrigger)}
    assert {"StreamRunOperator", "CheckpointHealthCheckOperator", "WarmServerHook"} <= exported
    page = hooks().airflow_page()
    assert {name for name in exported if f"\n## {name}\n" not in page} == set()
