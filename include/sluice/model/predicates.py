"""Row filters built from typed parts, and written out for each SQL dialect that reads them.

A backfill's ``replace`` swaps the rows of the files it reads (and, by event time, of its range). Those rows are
selected by a predicate that two engines read: Spark SQL (delta-spark's ``replaceWhere``) and DataFusion (delta-rs's
overwrite predicate and its SQL queries). File names are user data: a quote in one must stay inside its literal.
Each dialect has one function that quotes a name and one that quotes a string, and a predicate is only ever
written from the typed parts, never by rewriting the text of another dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any


@dataclass(frozen=True)
class RowFilter:
    """Rows whose ``file_column`` is one of ``files`` (when given), or names a Kafka record of one of ``offsets``
    (``(topic, partition, first, last)``, the column holding ``kafka://<topic>/<partition>/<offset>``), and whose
    ``time_column`` is in [start, end) (when given)."""

    file_column: str | None = None
    files: tuple[str, ...] = ()
    time_column: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    offsets: tuple[tuple[str, int, int, int], ...] = ()

    def __post_init__(self) -> None:
        if (self.file_column is None) != (not self.files and not self.offsets) or (self.files and self.offsets):
            raise ValueError("a file filter needs both its column and at least one file (or Kafka offset range)")
        if (self.time_column is None) != (self.start is None) or (self.start is None) != (self.end is None):
            raise ValueError("a time range needs its column, its start and its end")
        if self.file_column is None and self.time_column is None:
            raise ValueError("a row filter needs files or a time range")

    def to_dict(self) -> dict[str, Any]:
        return {"file_column": self.file_column, "files": list(self.files), "time_column": self.time_column,
                "start": _utc(self.start) if self.start else None, "end": _utc(self.end) if self.end else None,
                "offsets": [list(part) for part in self.offsets]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RowFilter:
        def moment(value: str | None) -> datetime | None:
            return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None

        return cls(file_column=data.get("file_column"), files=tuple(data.get("files") or ()),
                   time_column=data.get("time_column"), start=moment(data.get("start")), end=moment(data.get("end")),
                   offsets=tuple((str(t), int(p), int(a), int(b)) for t, p, a, b in data.get("offsets") or ()))


@dataclass(frozen=True)
class Dialect:
    """How one SQL dialect quotes a column name and a string literal."""

    name: str
    identifier: Callable[[str], str]
    string: Callable[[str], str]


def _utc(moment: datetime) -> str:
    """A UTC instant as ISO text that both dialects cast to a timestamp when compared with one."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _spark_string(value: str) -> str:
    # Spark SQL reads backslash escapes inside literals; two quotes in a row are two literals, concatenated.
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _standard_string(value: str) -> str:
    # ANSI SQL, as DataFusion reads it: a quote is doubled, a backslash is itself.
    return "'" + value.replace("'", "''") + "'"


SPARK_SQL = Dialect("spark", identifier=lambda name: "`" + name.replace("`", "``") + "`", string=_spark_string)
DATAFUSION = Dialect("datafusion", identifier=lambda name: '"' + name.replace('"', '""') + '"',
                     string=_standard_string)


def render(row_filter: RowFilter, dialect: Dialect) -> str:
    """The filter as one boolean SQL expression of ``dialect``."""
    parts: list[str] = []
    if row_filter.time_column is not None and row_filter.start is not None and row_filter.end is not None:
        column = dialect.identifier(row_filter.time_column)
        parts += [f"{column} >= {dialect.string(_utc(row_filter.start))}",
                  f"{column} < {dialect.string(_utc(row_filter.end))}"]
    if row_filter.file_column is not None and row_filter.offsets:
        parts.append(_offsets(row_filter.file_column, row_filter.offsets, dialect))
    elif row_filter.file_column is not None:
        files = ", ".join(dialect.string(name) for name in row_filter.files)
        parts.append(f"{dialect.identifier(row_filter.file_column)} IN ({files})")
    return " AND ".join(parts)


def _offsets(column: str, offsets: tuple[tuple[str, int, int, int], ...], dialect: Dialect) -> str:
    """Rows whose lineage ``kafka://<topic>/<partition>/<offset>`` is in one of the offset ranges: the prefix up to the
    partition's slash compared whole (a topic name holds no slash), the offset compared as digits, by length first
    (no leading zeros). No cast: another topic's row leaves text that is no number, which ANSI Spark's CAST fails on,
    and delta-rs cannot record a TRY_CAST in its commit."""
    name = dialect.identifier(column)
    size = f"character_length({name})"  # the one spelling delta-rs can also record in its commit
    ranges = []
    for topic, partition, first, last in offsets:
        prefix = f"kafka://{topic}/{partition}/"
        low, high = f"{prefix}{int(first)}", f"{prefix}{int(last)}"
        ranges.append(f"(substr({name}, 1, {len(prefix)}) = {dialect.string(prefix)} AND "
                      f"({size} > {len(low)} OR ({size} = {len(low)} AND {name} >= {dialect.string(low)})) AND "
                      f"({size} < {len(high)} OR ({size} = {len(high)} AND {name} <= {dialect.string(high)})))")
    return "(" + " OR ".join(ranges) + ")"
