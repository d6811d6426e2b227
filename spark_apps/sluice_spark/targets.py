"""The tables a routed micro-batch writes: one :class:`TableTarget` per Delta table, shared by every writer."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sluice.constants import INGEST_TIME_COLUMN, SinkMode
from sluice.errors import ExpectationFailed, SchemaDriftError
from sluice.model.patterns import FanOutSpec
from sluice.model.sinks import CdcSpec

# The routed frame's column that says where a row goes, and its values.
ROUTE_COLUMN = "_sluice_route"
GOOD_ROUTE = 0
DEAD_LETTER_ROUTE = 1
# Why a row is rejected (NULL on good rows), and the record it came from: the dead-letter table's reason and raw
# record.
REASON_COLUMN = "_dead_letter_reason"
RAW_COLUMN = "_dead_letter_raw"
# The record as the source read it (its declared fields, and what the drift policy kept beside them), carried past the
# transform so that a row a rule quarantines keeps the record it arrived as, which a redrive reads again.
RECORD_COLUMN = "_sluice_record"
# A row that broke an expectation whose action is ``fail``: no table takes it, and its batch commits nowhere.
FAILED_ROUTE = 2
# The names of the ``fail`` rules such a row broke (NULL on every other row); only streams with such rules have it.
FAILED_COLUMN = "_sluice_failed"
# Under ``fail_on_new_columns``, the paths of a row's fields the schema does not declare (NULL on most rows): no table
# takes such a row, and its batch commits nowhere (:mod:`sluice_spark.drift.fields`).
NEW_FIELDS_COLUMN = "_sluice_new_fields"
# Under ``add_new_columns``, a row's new top-level fields as a JSON object (NULL on most rows): the writer adds them to
# its table as columns, in the commit of their batch.
NEW_COLUMNS_COLUMN = "_sluice_new_columns"
# Beside it, for a typed source (a Delta table): the new columns' types in the source, as a JSON object of Spark SQL
# types; the writer gives each added column its type instead of one read from the JSON values.
NEW_TYPES_COLUMN = "_sluice_new_types"
# A CSV record read by its file's header: its declared fields as text (NULL when it is malformed), for the reasons of
# its dead letter (:mod:`sluice_spark.drift.csv`); dropped once they are made.
CSV_FIELDS_COLUMN = "_sluice_csv_fields"
_MAX_EXAMPLE = 500
_MAX_ORIGINS = 5


def tally_failures(counted: Mapping[str | None, int], into: dict[str, int]) -> dict[str, int]:
    """Add rows per ``fail`` rule, from rows counted per value of :data:`FAILED_COLUMN` (``"a, b"`` counts under
    both), to ``into``."""
    for names, rows in counted.items():
        for name in (names or "").split(", "):
            if name:
                into[name] = into.get(name, 0) + rows
    return into


def failed_in(rows: Any, failed_column: str, example_column: str | None, into: dict[str, int]
              ) -> str | None:
    """Add the ``fail`` rules the rows of an Arrow batch or table broke to ``into`` (see :func:`tally_failures`);
    the first such row's ``example_column`` value, or None when no row broke one."""
    import pyarrow.compute as pc

    names = rows.column(failed_column)
    if names.null_count == len(names):
        return None
    counts = pc.value_counts(names.drop_null())
    tally_failures({item["values"]: item["counts"] for item in counts.to_pylist()}, into)
    if example_column is None:
        return None
    first = pc.index(pc.is_valid(names), True).as_py()
    return str(rows.column(example_column)[first].as_py())


def expectation_failure(batch_id: int, failed: Mapping[str, int], example: str | None) -> ExpectationFailed:
    """The error that stops a batch with rows that broke a ``fail`` rule, before it commits anywhere."""
    rules = ", ".join(f"'{name}' ({rows} row{'s' if rows != 1 else ''})" for name, rows in sorted(failed.items()))
    shown = (example or "")[:_MAX_EXAMPLE]
    return ExpectationFailed(f"expectation(s) failed in batch {batch_id}: {rules}; nothing of this batch was "
                             f"committed. First such row: {shown}")


def new_fields_in(rows: Any, fields_column: str, origin_column: str | None, into: dict[str, int],
                  origins: dict[str, None]) -> None:
    """Add the rows per new field of an Arrow batch's ``fields_column`` (a list of paths per row, NULL on most) to
    ``into``, and the first origins (files, Kafka offsets) of such rows to ``origins``."""
    import pyarrow.compute as pc

    fields = rows.column(fields_column)
    if fields.null_count == len(fields):
        return
    counts = pc.value_counts(pc.list_flatten(fields))
    for item in counts.to_pylist():
        into[item["values"]] = into.get(item["values"], 0) + item["counts"]
    if origin_column is not None:
        with_fields = pc.filter(rows.column(origin_column), pc.is_valid(fields))
        for origin in with_fields.unique().to_pylist()[:_MAX_ORIGINS]:
            origins.setdefault(str(origin), None)


def drift_failure(batch_id: int, fields: Mapping[str, int], origins: Sequence[str]) -> SchemaDriftError:
    """The error that stops a batch with new fields under ``fail_on_new_columns``, before it commits anywhere."""
    listed = ", ".join(f"'{name}' ({rows} row{'s' if rows != 1 else ''})" for name, rows in sorted(fields.items()))
    shown = ", ".join(list(origins)[:_MAX_ORIGINS])
    return SchemaDriftError(f"new field(s) not in the declared schema in batch {batch_id}: {listed}; from {shown}; "
                       "nothing of this batch was committed. Declare them in source.schema, or choose another "
                       "source.schema_evolution, and run again")


@dataclass(frozen=True)
class TableTarget:
    """One Delta table the sink writes: the rows whose route column equals ``route`` (and, for a fan-out table, whose
    boolean ``flag`` column is true).

    ``columns`` pairs each column of the routed frame with its name in the table. ``mode`` is how a batch reaches
    the table: appended, merged by ``keys`` (the highest ``sequence_by`` wins), or rewritten whole.
    """

    route: int
    path: str
    columns: tuple[tuple[str, str], ...]
    partition_by: tuple[str, ...] = ()
    flag: str | None = None
    mode: SinkMode = SinkMode.APPEND
    keys: tuple[str, ...] = ()
    sequence_by: str | None = None
    #: Under mode cdc: how the changes are applied, its ``delete_when`` resolved (a Debezium envelope's default).
    cdc: CdcSpec | None = None

    def selects(self, route: Any, flag: Any = None) -> Any:
        """The row mask of this table over the Arrow arrays of the route and flag columns."""
        import pyarrow.compute as pc

        mask = pc.equal(route, self.route)
        return mask if self.flag is None else pc.and_(mask, flag)

    @property
    def table_columns(self) -> list[str]:
        return [name for _, name in self.columns]

    def to_dict(self) -> dict[str, Any]:
        return {"route": self.route, "path": self.path, "columns": [list(pair) for pair in self.columns],
                "partition_by": list(self.partition_by), "flag": self.flag, "mode": self.mode.value,
                "keys": list(self.keys), "sequence_by": self.sequence_by,
                "cdc": None if self.cdc is None else self.cdc.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TableTarget:
        return cls(route=data["route"], path=data["path"],
                   columns=tuple((source, name) for source, name in data["columns"]),
                   partition_by=tuple(data.get("partition_by", ())), flag=data.get("flag"),
                   mode=SinkMode(data.get("mode", SinkMode.APPEND.value)), keys=tuple(data.get("keys", ())),
                   sequence_by=data.get("sequence_by"),
                   cdc=None if data.get("cdc") is None else CdcSpec.from_dict(data["cdc"]))


def encode_targets(targets: Sequence[TableTarget]) -> str:
    return json.dumps([target.to_dict() for target in targets])


def fan_out_column(index: int) -> str:
    """The routed frame's flag of the fan-out table at ``index``: whether a good row goes there too."""
    return f"_sluice_fan_out_{index}"


def fan_out_columns(spec: FanOutSpec, data_columns: Sequence[str]) -> list[str]:
    """A fan-out table's columns: those it names (else the stream's own), and the ingest time."""
    output = [name for name in data_columns if name != INGEST_TIME_COLUMN]
    return [*(spec.columns or output), INGEST_TIME_COLUMN]
