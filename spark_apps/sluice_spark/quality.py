"""The quality split: every parsed record is either good or dead-lettered with a reason. Nothing is dropped.

A record goes to the dead-letter table when the reader could not parse it (``_corrupt_record`` is set) or when a
column declared ``not null`` is missing. The reason names the first offending field and its raw value, computed
with column expressions only (no Python UDF), so the split costs no extra pass over the data.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sluice.constants import CORRUPT_COLUMN, FileFormat
from sluice.model.stream import StreamSpec
from sluice.model.types import dotted, quote

REASON_COLUMN = "_dead_letter_reason"
RAW_COLUMN = "_dead_letter_raw"
_MAX_VALUE_IN_REASON = 120


def _string_schema(stream: StreamSpec) -> str:
    columns = ", ".join(f"{quote(name)} STRING" for name in stream.source.schema.names)
    return f"{columns}, `{CORRUPT_COLUMN}` STRING"


def _reparse(stream: StreamSpec) -> Column | None:
    """The corrupt record parsed again with every field as a string: what each field held before the cast."""
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN, **stream.source.record_options}
    if stream.source.format is FileFormat.JSON:
        return F.from_json(F.col(CORRUPT_COLUMN), _string_schema(stream), options)
    if stream.source.format is FileFormat.CSV:
        csv_options = {k: v for k, v in options.items() if k not in {"header", "pathGlobFilter"}}
        return F.from_csv(F.col(CORRUPT_COLUMN), F.lit(_string_schema(stream)), csv_options)
    return None


def dead_letter_reason(stream: StreamSpec) -> Column:
    """Why a parsed record is rejected, or NULL when it is good."""
    schema = stream.source.schema
    kind = stream.source.format.value.upper()
    reparsed = _reparse(stream)
    cast_failures: list[Column] = []
    if reparsed is not None:
        cast_failures.append(F.when(reparsed[CORRUPT_COLUMN].isNotNull() | reparsed.isNull(),
                                    F.lit(f"malformed {kind} record")))
        for column in schema.columns:
            raw_value = reparsed[column.name]
            cast_failures.append(
                F.when(
                    raw_value.isNotNull() & F.col(column.name).isNull(),
                    F.concat(
                        F.lit(f"field '{column.name}': cannot parse '"),
                        F.substring(raw_value, 1, _MAX_VALUE_IN_REASON),
                        F.lit(f"' as {column.sql_type}"),
                    ),
                )
            )
    corrupt = F.when(
        F.col(CORRUPT_COLUMN).isNotNull(),
        F.coalesce(*cast_failures, F.lit(f"malformed {kind} record")),
    )
    missing = [
        F.when(F.col(quote(name)).isNull(), F.lit(f"missing required field '{name}'")) for name in schema.required
    ]
    missing += [F.when(_lacks(F.col(quote(path[0])), path[1:]), F.lit(f"missing required field '{dotted(path)}'"))
                for path in schema.required_fields]
    return F.coalesce(corrupt, *missing) if missing else corrupt


def _lacks(parent: Column, rest: tuple[str, ...]) -> Column:
    """True when ``parent`` is there and lacks the ``not null`` field at ``rest`` (in any of its elements, across an
    array): Spark's and Delta's meaning of a NOT NULL field in a nullable struct."""
    step, tail = rest[0], rest[1:]
    if step == "[]":
        inner = F.exists(parent, lambda element: _lacks(element, tail))
    else:
        child = parent.getField(step)
        inner = child.isNull() if not tail else _lacks(child, tail)
    return parent.isNotNull() & F.coalesce(inner, F.lit(False))


def flag_dead_letters(frame: DataFrame, stream: StreamSpec) -> DataFrame:
    """Add the reason (NULL for a good record) and, for rejected records only, the raw record.

    Both are NULL for good records, which costs next to nothing to carry; the raw record is taken before any
    transform can rewrite the fields it is rebuilt from.
    """
    flagged = frame.withColumn(REASON_COLUMN, dead_letter_reason(stream))
    return flagged.withColumn(RAW_COLUMN, F.when(F.col(REASON_COLUMN).isNotNull(), _raw_record(stream)))


def _raw_record(stream: StreamSpec) -> Column:
    """The record as it arrived when the reader kept it, else the parsed fields as JSON."""
    fields = F.struct(*[F.col(name) for name in stream.source.schema.names])
    return F.coalesce(F.col(CORRUPT_COLUMN), F.to_json(fields))
