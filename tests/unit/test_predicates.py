"""Row filters written per SQL dialect: a quote or a backslash in a file name stays inside its literal."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from sluice.model.predicates import DATAFUSION, SPARK_SQL, RowFilter, render
from sluice.operations.backfill import count_rows

UTC = dt.timezone.utc
NAMES = ["plain.json", "report'2026-11-23T10:00:00Z'.json", "back\\slash'.json", "it''s.json"]


def test_each_dialect_quotes_its_own_way() -> None:
    row_filter = RowFilter(file_column="_source file", files=("a'b\\c",), time_column="t`s",
                           start=dt.datetime(2026, 11, 1, tzinfo=UTC), end=dt.datetime(2026, 11, 2, tzinfo=UTC))
    assert render(row_filter, SPARK_SQL) == (
        "`t``s` >= '2026-11-01T00:00:00.000000Z' AND `t``s` < '2026-11-02T00:00:00.000000Z' AND "
        "`_source file` IN ('a\\'b\\\\c')")
    assert render(row_filter, DATAFUSION) == (
        '"t`s" >= \'2026-11-01T00:00:00.000000Z\' AND "t`s" < \'2026-11-02T00:00:00.000000Z\' AND '
        '"_source file" IN (\'a\'\'b\\c\')')


def test_a_filter_survives_the_frozen_plan() -> None:
    row_filter = RowFilter(file_column="f", files=("x",), time_column="t", start=dt.datetime(2026, 1, 1, tzinfo=UTC),
                           end=dt.datetime(2026, 1, 2, tzinfo=UTC))
    assert RowFilter.from_dict(row_filter.to_dict()) == row_filter


@pytest.mark.parametrize("parts", [{}, {"file_column": "f"}, {"files": ("x",)},
                                   {"time_column": "t", "start": dt.datetime(2026, 1, 1, tzinfo=UTC)}])
def test_an_incomplete_filter_is_refused(parts: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RowFilter(**parts)  # type: ignore[arg-type]


def test_delta_rs_counts_and_replaces_exactly_the_named_files(tmp_path: Path) -> None:
    """DataFusion reads the filter both in a query (the plan's count) and as delta-rs's overwrite predicate."""
    table = str(tmp_path / "t")
    times = pa.array([dt.datetime(2026, 11, 1, 1, tzinfo=UTC)] * len(NAMES), pa.timestamp("us", tz="UTC"))
    write_deltalake(table, pa.table({"f": NAMES, "t": times}))
    wanted = RowFilter(file_column="f", files=tuple(NAMES[1:]), time_column="t",
                       start=dt.datetime(2026, 11, 1, tzinfo=UTC), end=dt.datetime(2026, 11, 2, tzinfo=UTC))
    assert count_rows(table, wanted) == 3
    write_deltalake(table, pa.table({"f": pa.array([], pa.string()), "t": pa.array([], times.type)}),
                    mode="overwrite", predicate=render(wanted, DATAFUSION))
    from sluice.storage.delta import read_table

    assert read_table(table, ["f"]).column("f").to_pylist() == ["plain.json"]
