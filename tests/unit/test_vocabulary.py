"""One vocabulary: the health codes as an enum, and the README's table of them generated from it."""

from __future__ import annotations


def test_the_readmes_table_of_health_codes_is_the_enums() -> None:
    from pathlib import Path

    from sluice.constants import FAULT_CODES, FaultCode, fault_code_table

    assert set(FAULT_CODES) == set(FaultCode), "every code is documented"
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert fault_code_table() in readme


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
