"""Schema drift in CSV files with a header: each file's columns taken by the names its own header gives them.

Spark's CSV reader matches a header against the declared schema and fails the run when a file has a column more, a
column less or another order. Under a drift policy a stream with ``header: true`` reads its files as bytes instead
(Spark's ``binaryFile`` source, as for Parquet) and :func:`split_csv_files` splits each one on an executor with
Python's csv module, by its own header:

- the declared columns, matched by name (exactly, else without case when one header name matches), are written
  back as one CSV record in the declared order, which Spark's ``from_csv`` parses with the source's options: the
  values are typed exactly as Spark's reader types them, and a value that does not fit is rescued from that record
  as for any CSV record (:func:`sluice_spark.drift.rescue_csv`);
- a column of the header that the schema does not declare is a new field, in the records that hold a value in it.
- a record whose number of fields is not its header's is malformed: a dead letter, with its fields as read.

A declared column that a file's header lacks is NULL in its records (a required one makes them dead letters). An
empty field and a quoted empty field read alike, as NULL; the record is UTF-8 text.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from sluice.constants import SOURCE_FILE_COLUMN, SchemaEvolution
from sluice.model.types import IDENTIFIER, quote

if TYPE_CHECKING:
    import pyarrow as pa

#: The record in the declared order, as CSV text for ``from_csv`` (NULL for a malformed record).
LINE_COLUMN = "_sluice_line"
#: The record's fields as read, when they do not match its file's header (NULL on every other record).
MALFORMED_COLUMN = "_sluice_malformed"
#: The new fields of a record, as a JSON object (``rescue``, and under ``add_new_columns`` those that cannot be a
#: column), or the list of their names (``fail_on_new_columns``).
NEW_COLUMN = "_sluice_csv_new"
#: Under ``add_new_columns``, the new fields that can be columns, as a JSON object.
COLUMNS_COLUMN = "_sluice_csv_columns"
_BATCH_ROWS = 8192


def output_columns(policy: SchemaEvolution) -> list[tuple[str, str]]:
    """The columns :func:`split_csv_files` gives, with their Spark SQL types."""
    new = "ARRAY<STRING>" if policy is SchemaEvolution.FAIL_ON_NEW_COLUMNS else "STRING"
    columns = [(LINE_COLUMN, "STRING"), (MALFORMED_COLUMN, "STRING"), (NEW_COLUMN, new)]
    if policy is SchemaEvolution.ADD_NEW_COLUMNS:
        columns.append((COLUMNS_COLUMN, "STRING"))
    return [*columns, (SOURCE_FILE_COLUMN, "STRING")]


def split_csv_files(batches: Iterator[pa.RecordBatch], *, names: list[str], policy: SchemaEvolution,
                    options: Mapping[str, str], output: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function: batches of files (``_source_file``, ``content``) to batches of records in
    ``output`` (:func:`output_columns`)."""
    for batch in batches:
        paths, contents = batch.column(0), batch.column(1)
        for index in range(batch.num_rows):
            path = paths[index].as_py()
            text = contents[index].as_py().decode("utf-8", errors="replace").removeprefix("\ufeff")
            rows: list[dict[str, object]] = []
            for row in _records(text, names, policy, options):
                rows.append({**row, SOURCE_FILE_COLUMN: path})
                if len(rows) == _BATCH_ROWS:
                    yield _batch(rows, output)
                    rows = []
            if rows:
                yield _batch(rows, output)


def _batch(rows: list[dict[str, object]], output: pa.Schema) -> pa.RecordBatch:
    import pyarrow as pa

    return pa.RecordBatch.from_pylist(rows, schema=output)


def _records(text: str, names: list[str], policy: SchemaEvolution,
             options: Mapping[str, str]) -> Iterator[dict[str, object]]:
    separator = options.get("sep", options.get("delimiter", ","))
    quote_char = options.get("quote", '"')
    escape = options.get("escape", "\\")
    comment = options.get("comment")
    strip_leading = options.get("ignoreLeadingWhiteSpace", "false").lower() == "true"
    strip_trailing = options.get("ignoreTrailingWhiteSpace", "false").lower() == "true"
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=separator, quotechar=quote_char or None,
                        escapechar=escape or None, doublequote=True, strict=False)
    header: list[str] | None = None
    positions: list[int | None] = []
    new: list[int] = []
    for fields in reader:
        if not fields or fields == [""] or (comment and fields[0].startswith(comment)):
            continue  # a blank line, a comment: no record, as for Spark's reader
        if strip_leading or strip_trailing:
            fields = [_strip(value, strip_leading, strip_trailing) for value in fields]
        if header is None:
            header = fields
            positions = _positions(header, names)
            used = {position for position in positions if position is not None}
            new = [position for position in range(len(header)) if position not in used]
            continue
        if len(fields) != len(header):
            yield {MALFORMED_COLUMN: separator.join(fields)}
            continue
        record: dict[str, object] = {
            LINE_COLUMN: _line([fields[p] if p is not None else "" for p in positions], separator, quote_char, escape)}
        found = {header[p]: fields[p] for p in new if fields[p] != ""}
        if found:
            record.update(_new_fields(found, policy))
        yield record


def _strip(value: str, leading: bool, trailing: bool) -> str:
    value = value.lstrip() if leading else value
    return value.rstrip() if trailing else value


def _positions(header: list[str], names: list[str]) -> list[int | None]:
    """Where each declared column is in a header: its exact name, else the one name equal to it without case."""
    exact = {name: position for position, name in enumerate(header)}
    folded: dict[str, list[int]] = {}
    for position, name in enumerate(header):
        folded.setdefault(name.lower(), []).append(position)
    positions: list[int | None] = []
    for name in names:
        loose = [p for p in folded.get(name.lower(), []) if header[p] not in names]
        positions.append(exact.get(name, loose[0] if len(loose) == 1 else None))
    return positions


def _line(values: list[str], separator: str, quote_char: str, escape: str) -> str:
    """Values as one CSV record that Spark's parser reads back as they are: an empty value unquoted (NULL), any other
    quoted, its quotes escaped."""
    def field(value: str) -> str:
        if value == "":
            return ""
        return f"{quote_char}{value.replace(quote_char, escape + quote_char)}{quote_char}"

    return separator.join(field(value) for value in values)


def _new_fields(found: dict[str, str], policy: SchemaEvolution) -> dict[str, object]:
    keyed = {(name if IDENTIFIER.fullmatch(name) else quote(name)): value for name, value in found.items()}
    if policy is SchemaEvolution.FAIL_ON_NEW_COLUMNS:
        return {NEW_COLUMN: sorted(keyed)}
    if policy is SchemaEvolution.ADD_NEW_COLUMNS:
        columns = {name: value for name, value in found.items() if _column_like(name)}
        rest = {key: value for key, value in keyed.items() if key not in columns}
        return {NEW_COLUMN: json.dumps(rest, ensure_ascii=False) if rest else None,
                COLUMNS_COLUMN: json.dumps(columns, ensure_ascii=False) if columns else None}
    return {NEW_COLUMN: json.dumps(keyed, ensure_ascii=False)}


def _column_like(name: str) -> bool:
    return IDENTIFIER.fullmatch(name) is not None and not name.startswith("_")
