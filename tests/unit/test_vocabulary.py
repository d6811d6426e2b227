"""One vocabulary: the health codes as an enum, and the docs' table of them generated from it (test_docs.py)."""

from __future__ import annotations


def test_every_health_code_is_documented() -> None:
    from sluice.constants import FAULT_CODES, FaultCode, fault_code_table

    assert set(FAULT_CODES) == set(FaultCode), "every code is documented"
    assert all(f"| `{code}` |" in fault_code_table() for code in FaultCode)


def test_a_source_type_sluice_cannot_read_is_refused_at_load() -> None:
    """``rate`` was accepted and then read as files; a catalog that names it is refused with the field."""
    import pytest

    from sluice.catalog import parse_catalog
    from sluice.errors import CatalogError
    from tests.helpers import events_stream

    stream = events_stream()
    stream["source"]["type"] = "rate"
    with pytest.raises(CatalogError, match=r"source\.type.*unknown value 'rate'"):
        parse_catalog({"streams": [stream]})


def test_commit_info_keys_are_written_only_through_the_enum() -> None:
    """A key of a Delta commit's info is a ``CommitInfo`` member; a bare ``"sluice.<key>"`` literal in the code is a
    second spelling that a reader of the history would miss."""
    import ast
    import re
    from pathlib import Path

    from sluice.constants import CommitInfo

    project = Path(__file__).resolve().parents[2]
    key = re.compile(r"^sluice\.[a-z][A-Za-z]*(\.[a-z][A-Za-z]*)*$")
    found = []
    for folder in ("include", "spark_apps", "plugins", "dags"):
        for path in (project / folder).rglob("*.py"):
            if path.name == "constants.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and key.match(node.value) \
                        and not node.value.startswith(("sluice.cli", "sluice.catalog")):
                    found.append(f"{path.relative_to(project)}:{node.lineno} {node.value}")
    assert found == [], f"spell these with CommitInfo ({', '.join(member.name for member in CommitInfo)})"
    assert str(CommitInfo.BACKFILL_REASON) == f"{CommitInfo.BACKFILL_REASON}" == "sluice.backfill.reason"


def test_backfill_modes_and_alert_channels_are_words_of_the_vocabulary() -> None:
    from sluice.constants import AlertChannel, BackfillMode
    from sluice.operations.backfill import MODES

    assert MODES == ("append", "replace") and BackfillMode("replace") is BackfillMode.REPLACE
    assert [f"{channel}" for channel in AlertChannel] == ["log", "webhook", "email"]
