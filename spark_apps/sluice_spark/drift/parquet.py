"""Schema drift in Parquet files: each file read whole, with its own schema, and compared with the declared one.

Spark's Parquet reader reads the declared columns and leaves any other out without a word, and it fails the query on
a column whose type it cannot convert. Under a drift policy a stream reads its files as bytes instead (Spark's
``binaryFile`` source, so every filesystem Spark reads works the same) and :func:`conform_files` reads each one with
pyarrow on the executors, in the same task, so the schema it compares is the schema of the bytes it reads:

- **new fields**: a column the schema does not declare, or a field of a declared struct it does not declare, at any
  depth (``coupon``, ``actor.site_admin``, ``payload.commits[0].verified``), in the rows that hold a value in it;
- **misfits**: a value its declared type cannot hold (text in an ``int`` column, a number past the declared type's
  range, a struct where a string is declared is not one: a string takes any value as its JSON).

Names match as Spark's reader matches them: exactly, else without case when only one field matches. Timestamps of
any unit read as microseconds (nanoseconds are truncated, INT96 included), as Spark keeps them.

What each policy does with them is :mod:`sluice_spark.drift.fields`'s: ``rescue`` keeps both in ``_rescued_data``
(values as JSON: timestamps and dates in ISO 8601, decimals as text to keep their digits, bytes in base64);
``add_new_columns`` also gives a new top-level column its Parquet type
(:data:`~sluice_spark.targets.NEW_TYPES_COLUMN`); ``fail_on_new_columns`` lists the new fields' paths. A row with a
misfit carries its whole record as JSON in ``_corrupt_record``, which the dead-letter split reads as it reads a JSON
record's text. A file that is no Parquet (its footer does not read) is one dead letter, with the error.

A file crosses to the executor whole (``binaryFile``'s ``content``) and is decoded a row group at a time: an executor
holds each file of its partition in memory once.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.constants import CORRUPT_COLUMN, RESCUED_COLUMN, SOURCE_FILE_COLUMN, SchemaEvolution
from sluice_spark.drift.fields import column_like, field_key
from sluice_spark.drift.typed import column_type
from sluice_spark.targets import NEW_COLUMNS_COLUMN, NEW_FIELDS_COLUMN, NEW_TYPES_COLUMN

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

#: How the one dead letter of a file that is no Parquet starts its ``_corrupt_record`` (and its reason).
UNREADABLE_PARQUET = "unreadable Parquet file: "
# Rows per Arrow batch handed back to Spark.
_BATCH_ROWS = 8192


class ParquetReadError(Exception):
    """A Parquet file whose footer reads but whose data does not."""


@dataclass
class _Found:
    """What the rows of a batch hold that the declared schema does not read, per row: new fields and misfits by
    path, and (``add_new_columns``) the new top-level fields that may become columns."""

    new: dict[int, dict[str, Any]] = field(default_factory=dict)
    misfits: dict[int, dict[str, Any]] = field(default_factory=dict)
    columns: dict[int, dict[str, Any]] = field(default_factory=dict)
    column_types: dict[str, str] = field(default_factory=dict)


def output_columns(policy: SchemaEvolution) -> list[tuple[str, str]]:
    """The columns :func:`conform_files` adds after the declared ones, with their Spark SQL types."""
    columns = [(CORRUPT_COLUMN, "STRING")]
    if policy is SchemaEvolution.FAIL_ON_NEW_COLUMNS:
        columns.append((NEW_FIELDS_COLUMN, "ARRAY<STRING>"))
    else:
        columns.append((RESCUED_COLUMN, "STRING"))
    if policy is SchemaEvolution.ADD_NEW_COLUMNS:
        columns += [(NEW_COLUMNS_COLUMN, "STRING"), (NEW_TYPES_COLUMN, "STRING")]
    return [*columns, (SOURCE_FILE_COLUMN, "STRING")]


def conform_files(batches: Iterator[pa.RecordBatch], *, declared: pa.Schema, output: pa.Schema,
                  policy: SchemaEvolution, required: frozenset[str] | None = None) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function: batches of files (``_source_file``, ``content``) to batches of records in
    ``output`` (the declared columns, then :func:`output_columns`).

    ``required`` (the declared required columns, when no nested field is required and the policy rescues) lets a
    row whose misfits were rescued skip its whole record's JSON when none of them is NULL: only a dead letter reads
    it (:func:`sluice_spark.steps.quality.dead_letter_reason`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for batch in batches:
        paths, contents = batch.column(0), batch.column(1)
        for index in range(batch.num_rows):
            path = paths[index].as_py()
            content = contents[index].as_buffer()
            head, tail = content[:4].to_pybytes(), content[-4:].to_pybytes() if content.size >= 4 else b""
            if head == b"PAR1" and (content.size < 12 or tail != b"PAR1"):
                # No footer yet: a file still being written (land files by rename), or cut short. The run fails and
                # its rerun reads the file again, whole by then.
                raise ParquetReadError(f"{path} is not a whole Parquet file (it does not end with its footer); a "
                                       "file must appear in the landing zone complete (write it elsewhere, then "
                                       "rename it in)")
            try:
                data = pq.ParquetFile(pa.BufferReader(content), coerce_int96_timestamp_unit="us")
            except Exception as error:  # a file that is no Parquet (or whose footer is corrupt) is one dead letter
                yield _unreadable(output, path, f"{UNREADABLE_PARQUET}{type(error).__name__}: {error}")
                continue
            # Row group by row group: a file is decoded a batch at a time. A file that fails past its footer stops the
            # run (its rows so far cannot be taken back), as Spark's reader does.
            try:
                for records in data.iter_batches(batch_size=_BATCH_ROWS):
                    yield _conform_batch(records, declared, output, policy, path, required)
            except (OSError, pa.ArrowException) as error:
                raise ParquetReadError(f"cannot read the Parquet file {path}: {error}") from error


def _unreadable(output: pa.Schema, path: str, reason: str) -> pa.RecordBatch:
    import pyarrow as pa

    columns = [pa.array([reason if name == CORRUPT_COLUMN else path if name == SOURCE_FILE_COLUMN else None],
                        output.field(name).type) for name in output.names]
    return pa.RecordBatch.from_arrays(columns, schema=output)


def _conform_batch(records: pa.RecordBatch, declared: pa.Schema, output: pa.Schema, policy: SchemaEvolution,
                   path: str, required: frozenset[str] | None = None) -> pa.RecordBatch:
    import numpy as np
    import pyarrow as pa

    found = _Found()
    rows = np.arange(records.num_rows)
    whole = pa.StructArray.from_arrays(records.columns, fields=list(records.schema))
    adds = policy is SchemaEvolution.ADD_NEW_COLUMNS
    typed = _struct(whole, pa.struct(list(declared)), lambda _: "", rows, found, root_columns=adds)
    columns: dict[str, pa.Array] = {name: typed.field(index) for index, name in enumerate(declared.names)}
    count = records.num_rows
    misfit_rows = sorted(found.misfits)
    if misfit_rows and required is not None:  # a row whose required columns all hold a value is no dead letter
        complete = np.ones(count, dtype=bool)
        for name in required & set(columns):
            complete &= columns[name].is_valid().to_numpy(zero_copy_only=False)
        misfit_rows = [row for row in misfit_rows if not complete[row]]
    corrupt: list[str | None] = [None] * count
    if misfit_rows:
        originals = _py_values(whole.take(pa.array(misfit_rows)))
        for row, original in zip(misfit_rows, originals, strict=True):
            corrupt[row] = _dumps(_json_value(original))
    columns[CORRUPT_COLUMN] = pa.array(corrupt, pa.string())
    if policy is SchemaEvolution.FAIL_ON_NEW_COLUMNS:
        columns[NEW_FIELDS_COLUMN] = pa.array([sorted(found.new[row]) if row in found.new else None
                                               for row in range(count)], pa.list_(pa.string()))
    else:
        rescued: list[str | None] = [None] * count
        for row in set(found.new) | set(found.misfits):
            rescued[row] = _dumps({**found.new.get(row, {}), **found.misfits.get(row, {})})
        columns[RESCUED_COLUMN] = pa.array(rescued, pa.string())
    if adds:
        kinds = json.dumps(found.column_types)
        columns[NEW_COLUMNS_COLUMN] = pa.array([_dumps(found.columns[row])
                                                if row in found.columns else None for row in range(count)])
        columns[NEW_TYPES_COLUMN] = pa.array([kinds if row in found.columns else None for row in range(count)],
                                             pa.string())
    columns[SOURCE_FILE_COLUMN] = pa.array([path] * count, pa.string())
    return pa.RecordBatch.from_arrays([columns[name] for name in output.names], schema=output)


# -- one array against its declared type ---------------------------------------------------------------------------

PathOf = Callable[[int], str]


def _conform(array: pa.Array, target: pa.DataType, path_of: PathOf, rows: np.ndarray, found: _Found) -> pa.Array:
    """``array`` in the ``target`` type; what it holds beyond it goes to ``found`` (``path_of`` names an element,
    ``rows`` is the record each element belongs to)."""
    import pyarrow as pa

    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if array.type == target:
        return array
    if pa.types.is_struct(target) and pa.types.is_struct(array.type):
        return _struct(array, target, path_of, rows, found)
    if _is_list(target) and _is_list(array.type):
        return _list(array, target, path_of, rows, found)
    if pa.types.is_map(target) and pa.types.is_map(array.type):
        return _map(array, target, path_of, rows, found)
    if pa.types.is_string(target) and pa.types.is_nested(array.type):  # a string takes any value as its JSON
        return pa.array([None if value is None else _dumps(_json_value(value)) for value in _py_values(array)],
                        pa.string())
    if pa.types.is_nested(target) or pa.types.is_nested(array.type):
        return _whole(array, target, path_of, rows, found)
    return _cast(array, target, path_of, rows, found)


def _is_list(data_type: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_list(data_type) or pa.types.is_large_list(data_type)
                or pa.types.is_fixed_size_list(data_type))


def _field_path(path_of: PathOf, name: str) -> PathOf:
    return lambda element: _child_path(path_of(element), name)


def _child_path(parent: str, name: str) -> str:
    key = field_key(name)
    return f"{parent}.{key}" if parent else key


def _struct(array: pa.StructArray, target: pa.StructType, path_of: PathOf, rows: np.ndarray, found: _Found,
            *, root_columns: bool = False) -> pa.StructArray:
    """A struct's declared fields, matched by name (exactly, else without case when one field matches); its other
    fields are new. With ``root_columns`` (the record itself, under ``add_new_columns``), a new field whose name can be
    a column is kept apart for the writer to add."""
    import pyarrow as pa

    source = array.type
    names = [source.field(index).name for index in range(source.num_fields)]
    children = array.flatten()  # each child with its parent's nulls
    exact = {name: index for index, name in enumerate(names)}
    folded: dict[str, list[int]] = {}
    for index, name in enumerate(names):
        folded.setdefault(name.lower(), []).append(index)
    used: set[int] = set()
    conformed = []
    for target_field in target:
        matches = [i for i in folded.get(target_field.name.lower(), []) if names[i] not in target.names]
        found_at = exact.get(target_field.name, matches[0] if len(matches) == 1 else None)
        if found_at is None:
            conformed.append(pa.nulls(len(array), target_field.type))
            continue
        used.add(found_at)
        conformed.append(_conform(children[found_at], target_field.type, _field_path(path_of, target_field.name), rows,
                                  found))
    for index, name in enumerate(names):
        if index in used:
            continue
        child = children[index]
        present = child.is_valid().to_numpy(zero_copy_only=False).nonzero()[0]
        if not len(present):
            continue
        values = _py_values(child.take(present))
        kind = _spark_type(source.field(index).type) if root_columns and _column_like(name, target) else None
        column = kind is not None
        if kind is not None:
            found.column_types[name] = kind
        for element, value in zip(present, values, strict=True):
            into = found.columns if column else found.new
            into.setdefault(int(rows[element]), {})[name if column else _child_path(path_of(element), name)] = \
                _json_value(value)
    mask = array.is_null() if array.null_count else None
    return pa.StructArray.from_arrays(conformed, fields=list(target), mask=mask)


def _column_like(name: str, target: pa.StructType) -> bool:
    """Whether a new top-level field may become a column: a plain identifier that starts with a letter, and no
    declared column's name in another case (Delta's names are case-insensitive)."""
    return column_like(name) and name.lower() not in {field.name.lower() for field in target}


def _spark_type(arrow_type: pa.DataType) -> str | None:
    """A new column's type as the catalog would declare it; None for one Spark cannot hold, or whose values do not
    come back from their JSON as they were (:func:`sluice_spark.drift.typed.column_type`): it is rescued."""
    from pyspark.sql.pandas.types import from_arrow_type

    try:
        spark_type = from_arrow_type(arrow_type)
    except Exception:  # an unsigned 64-bit integer, a time of day...: no column type
        return None
    return column_type(spark_type)


def _flattened(array: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where the values of a list or map array's valid slots are in its (unsliced) values, the slot each belongs to,
    and the offsets of the same lists over those values alone."""
    import numpy as np

    offsets = array.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    lengths = np.where(valid, np.diff(offsets), 0)
    parents = np.repeat(np.arange(len(array)), lengths)
    ends = np.cumsum(lengths)
    index = np.repeat(offsets[:-1], lengths) + np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - lengths,
                                                                                                        lengths)
    return index, parents, np.concatenate([[0], ends])


def _list(array: pa.Array, target: pa.ListType, path_of: PathOf, rows: np.ndarray, found: _Found) -> pa.Array:
    import pyarrow as pa

    if pa.types.is_fixed_size_list(array.type):
        array = array.cast(pa.list_(array.type.value_field))
    index, parents, offsets = _flattened(array)
    values = array.values.take(pa.array(index, pa.int64()))

    def element_path(position: int) -> str:
        parent = int(parents[position])
        return f"{path_of(parent)}[{position - int(offsets[parent])}]"

    elements = _conform(values, target.value_type, element_path, rows[parents], found)
    mask = array.is_null() if array.null_count else None
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), elements, type=target, mask=mask)


def _map(array: pa.MapArray, target: pa.MapType, path_of: PathOf, rows: np.ndarray, found: _Found) -> pa.Array:
    """A map's values against the declared value type, each named by its key; a map whose keys are of another type
    is kept whole (a key that does not fit has no place to go in its map)."""
    import pyarrow as pa

    key_type = array.type.key_type.value_type if pa.types.is_dictionary(array.type.key_type) else array.type.key_type
    if key_type != target.key_type:
        return _whole(array, target, path_of, rows, found)
    index, parents, offsets = _flattened(array)
    take = pa.array(index, pa.int64())
    keys, items = array.keys.take(take), array.items.take(take)
    if pa.types.is_dictionary(keys.type):
        keys = keys.dictionary_decode()
    key_texts = keys.cast(pa.string()).to_pylist() if len(keys) else []

    def item_path(position: int) -> str:
        return _child_path(path_of(int(parents[position])), str(key_texts[position]))

    conformed = _conform(items, target.item_type, item_path, rows[parents], found)
    mask = array.is_null() if array.null_count else None
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), keys, conformed, type=target, mask=mask)


def _whole(array: pa.Array, target: pa.DataType, path_of: PathOf, rows: np.ndarray, found: _Found) -> pa.Array:
    """Every value of ``array`` is a misfit, kept whole: its type has another shape than the declared one."""
    import pyarrow as pa

    for position, value in enumerate(_py_values(array)):
        if value is not None:
            found.misfits.setdefault(int(rows[position]), {})[path_of(position)] = _json_value(value)
    return pa.nulls(len(array), target)


def _cast(array: pa.Array, target: pa.DataType, path_of: PathOf, rows: np.ndarray, found: _Found) -> pa.Array:
    """A primitive cast; each value it cannot hold as it is (the cast fails, or the value cast back is another:
    1.5 as an int, 5 as a boolean) is a misfit, NULL and kept in ``found``. Timestamps truncate to the target's unit;
    a timestamp without a time zone is read as UTC, Sluice's session time zone."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    safe = not (pa.types.is_timestamp(array.type) and pa.types.is_timestamp(target))
    if not safe and array.type.tz is None and target.tz is not None:
        array = array.cast(pa.timestamp(array.type.unit, tz="UTC"))
    cast, failed = _screened_cast(array, target, safe)
    if safe and not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)
                     or pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
        try:
            back = cast.cast(array.type, safe=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            back = None
        if back is not None:
            same = pc.equal(back, array)
            if pa.types.is_floating(array.type):
                same = pc.or_(same, pc.and_(pc.is_nan(back), pc.is_nan(array)))
            lost = pc.and_(cast.is_valid(), pc.invert(pc.fill_null(same, False)))
            if pc.any(lost).as_py():
                failed = sorted({*failed, *np.flatnonzero(lost.to_numpy(zero_copy_only=False)).tolist()})
                cast = pc.if_else(lost, pa.scalar(None, target), cast)
    if failed:
        values = _py_values(array.take(pa.array(failed, pa.int64())))
        for position, value in zip(failed, values, strict=True):
            found.misfits.setdefault(int(rows[position]), {})[path_of(position)] = _json_value(value)
    return cast


# Every character Arrow's parsers of a number may accept, with room to spare (signs, digits, hex, exponents, NaN,
# infinity, blanks): a text with another character cannot be that number.
_INTEGER_TEXT = r"^[\s0-9a-fA-FxX+_-]*$"
_REAL_TEXT = r"^[\s0-9.eE+_nNaAiIfFtTyY-]*$"


def _screened_cast(array: pa.Array, target: pa.DataType, safe: bool) -> tuple[pa.Array, list[int]]:
    """:func:`_cast_or_bisect`, with text that cannot be the target number set aside first in one pass (a column of
    words where a number is declared would otherwise be halved down to each word)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    texts = pa.types.is_string(array.type) or pa.types.is_large_string(array.type)
    pattern = (_INTEGER_TEXT if pa.types.is_integer(target) else
               _REAL_TEXT if pa.types.is_floating(target) or pa.types.is_decimal(target) else None)
    if not texts or pattern is None:
        return _cast_or_bisect(array, target, safe)
    try:
        return array.cast(target, safe=safe), []
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        pass
    possible = pc.fill_null(pc.match_substring_regex(array, pattern), True)
    if pc.all(possible).as_py():
        return _cast_or_bisect(array, target, safe)
    cast, failed = _cast_or_bisect(pc.if_else(possible, array, pa.scalar(None, array.type)), target, safe)
    impossible = np.flatnonzero(~possible.to_numpy(zero_copy_only=False)).tolist()
    return cast, sorted([*failed, *impossible])


def _cast_or_bisect(array: pa.Array, target: pa.DataType, safe: bool) -> tuple[pa.Array, list[int]]:
    """The cast, and the positions of the values it could not make (NULL in it): the array is halved until each
    failing value stands alone, so a column with a few misfits costs a few casts."""
    import pyarrow as pa

    try:
        return array.cast(target, safe=safe), []
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        if len(array) <= 1:
            return pa.nulls(len(array), target), [0] if len(array) and array.is_valid().to_pylist()[0] else []
    middle = len(array) // 2
    left, left_failed = _cast_or_bisect(array.slice(0, middle), target, safe)
    right, right_failed = _cast_or_bisect(array.slice(middle), target, safe)
    return pa.concat_arrays([left, right]), [*left_failed, *(middle + position for position in right_failed)]


def _py_values(array: pa.Array) -> list[Any]:
    """An array's values as Python's, a value Python cannot hold (a date past year 9999) as Arrow's text of it."""
    try:
        return list(array.to_pylist())
    except (OverflowError, ValueError):
        values = []
        for scalar in array:
            try:
                values.append(scalar.as_py())
            except (OverflowError, ValueError):
                values.append(str(scalar))
        return values


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _json_value(value: Any) -> Any:
    """A value pyarrow read, as JSON can hold it (Spark's ``to_json`` writes a NaN or an infinity as text too)."""
    if isinstance(value, dict):
        return {str(key): _json_value(item) for key, item in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(item, tuple) and len(item) == 2 for item in value):  # a map's (key, value)s
            return {_json_key(key): _json_value(item) for key, item in value}
        return [_json_value(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.timedelta):
        return str(value)
    return value


def _json_key(key: Any) -> str:
    value = _json_value(key)
    return value if isinstance(value, str) else _dumps(value)
