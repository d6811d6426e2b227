"""Maintenance's rules without Spark: the Delta retention properties, the least retention, and which readers hold a
vacuum back."""

from __future__ import annotations

import pytest

from sluice.operations.maintenance import MaintenanceError, Reader, _behind, check_retention, retention_hours


@pytest.mark.parametrize(("configured", "hours"), [
    (None, 168), ("", 168), ("interval 7 days", 168), ("interval 1 week", 168), ("168 hours", 168),
    ("INTERVAL 30 MINUTES", 0.5), ("interval 0 hours", 0), ("interval 2 day", 48),
])
def test_delta_retention_properties_in_hours(configured: str | None, hours: float) -> None:
    assert retention_hours(configured, 168) == hours


@pytest.mark.parametrize("configured", ["7 fortnights", "interval seven days", "interval 7", "days"])
def test_an_unreadable_retention_is_refused_with_its_text(configured: str) -> None:
    with pytest.raises(MaintenanceError, match="cannot read the Delta retention"):
        retention_hours(configured, 168)


def test_the_vacuum_retention_is_the_tables_unless_more_is_asked() -> None:
    assert check_retention(None, 168, table="t") == 168
    assert check_retention(200, 168, table="t") == 200
    with pytest.raises(MaintenanceError, match=r"vacuum_retention_hours: 24 hours is under the retention of t "
                                               r"\(delta.deletedFileRetentionDuration: 168 hours\)"):
        check_retention(24, 168, table="t")
    with pytest.raises(MaintenanceError, match="vacuum_retention_hours: expected 0 to"):
        check_retention(-1, 0, table="t")


def test_a_reader_holds_a_vacuum_back_only_while_its_next_version_is_older_than_the_cutoff() -> None:
    times = {0: 100.0, 1: 200.0, 2: 300.0}
    readers = [Reader("silver", 1), Reader("caught_up", 3)]
    assert _behind(readers, times, cutoff=250.0) == ["silver"]  # version 1 is older than the cutoff
    assert _behind(readers, times, cutoff=150.0) == []  # what silver still reads is newer than the cutoff
