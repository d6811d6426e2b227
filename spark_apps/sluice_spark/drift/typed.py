"""Schema drift of a typed source (a Delta table): no text to parse, so its columns are compared with the declared
ones. Its new fields are the columns the schema does not declare, and its misfits the values a declared type cannot
hold; ``add_new_columns`` gives a new column the source's own type (:data:`~sluice_spark.targets.NEW_TYPES_COLUMN`).
What each policy keeps is as for text (:mod:`sluice_spark.drift.fields`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BinaryType, StringType, StructType
from pyspark.sql.types import MapType as SparkMap

from sluice.constants import CORRUPT_COLUMN, RESCUED_COLUMN, SchemaEvolution
from sluice.errors import SluiceError
from sluice.model.schema import Schema
from sluice.model.types import (
    Array,
    DataType,
    Field,
    MapType,
    Struct,
    TypeSyntaxError,
    parse,
    quote,
)
from sluice_spark.drift.fields import column_like, field_key, json_object
from sluice_spark.targets import NEW_COLUMNS_COLUMN, NEW_FIELDS_COLUMN, NEW_TYPES_COLUMN


def typed_drift(frame: DataFrame, schema: Schema, policy: SchemaEvolution, keep: Mapping[str, Column],
                ignored: Collection[str] = ()) -> DataFrame:
    """A typed source's rows (``frame``, every column of a Delta table) as the declared columns, ``_corrupt_record``
    (NULL: a typed row always parses) and the policy's columns, as :func:`~sluice_spark.drift.fields.parse_json_text`
    gives them; ``keep`` are carried along, and the ``ignored`` columns are the source's bookkeeping, no data (an
    upstream stream's ingest time). Names match without case, as Delta's do.

    - new fields: the columns the schema does not declare, in the rows that hold a value in them;
    - misfits (``rescue`` and ``add_new_columns``): a value that its declared type cannot hold as it is (a cast that
      gives NULL, or loses something: 1.5 as an int), and a struct, array or map whose shape is not the declared one
      (a field more or less, another order), which is kept whole. Under ``fail_on_new_columns`` and ``none`` a
      value is cast as Spark casts it, and a shape that is not the declared one is refused before the run starts.
    """
    skipped = {name.lower() for name in ignored}
    actual = {name.lower(): name for name in frame.columns}
    declared = {name.lower() for name in schema.names}
    extras = [field for field in frame.schema.fields if field.name.lower() not in declared | skipped]
    types = {field.name.lower(): field.dataType for field in frame.schema.fields}
    rescue = policy in (SchemaEvolution.RESCUE, SchemaEvolution.ADD_NEW_COLUMNS)
    columns: list[Column] = []
    misfits: list[tuple[str, Column]] = []
    for column in schema.columns:
        value = F.col(quote(actual[column.name.lower()]))
        source_type = types[column.name.lower()]
        shaped = not (column.complex or _is_complex(source_type))
        fits = _declared_sql(source_type) == column.data_type.sql(nullable_only=True)
        if not rescue or fits:
            if not (fits or shaped):
                raise SluiceError(f"the column '{column.name}' is {source_type.simpleString()} in the source, declared "
                                  f"{column.sql_type}: declare it as the source has it, or choose schema_evolution "
                                  "rescue to keep what does not fit in _rescued_data")
            columns.append(value.cast(column.sql_type).alias(column.name))
            continue
        if not shaped:  # another shape: kept whole
            typed, misfit = F.lit(None).cast(column.sql_type), value
        else:
            typed = value.try_cast(column.sql_type)
            lost = typed.isNull() if isinstance(source_type, StringType) else \
                typed.isNull() | ~F.equal_null(typed.cast(source_type), value)
            misfit = F.when(lost, value)
            typed = F.when(~lost, typed)
        columns.append(typed.alias(column.name))
        misfits.append((field_key(column.name), misfit))
    kept = [column.alias(name) for name, column in keep.items()]
    corrupt = F.lit(None).cast("string").alias(CORRUPT_COLUMN)
    if policy is SchemaEvolution.FAIL_ON_NEW_COLUMNS:
        found = F.array_compact(F.array(*[F.when(F.col(quote(field.name)).isNotNull(), F.lit(field_key(field.name)))
                                          for field in extras]))
        new_fields = F.when(F.size(found) > 0, found) if extras else F.lit(None).cast("array<string>")
        return frame.select(*columns, corrupt, new_fields.alias(NEW_FIELDS_COLUMN), *kept)
    if policy is SchemaEvolution.NONE:
        return frame.select(*columns, corrupt, *kept)
    added = [field for field in extras if policy is SchemaEvolution.ADD_NEW_COLUMNS and column_like(field.name)
             and column_type(field.dataType) is not None]
    rest = [(field_key(field.name), F.col(quote(field.name))) for field in extras if field not in added]
    policy_columns = [json_object([*rest, *misfits]).alias(RESCUED_COLUMN)]
    if policy is SchemaEvolution.ADD_NEW_COLUMNS:
        new = json_object([(field.name, F.col(quote(field.name))) for field in added])
        kinds = json.dumps({field.name: column_type(field.dataType) for field in added})
        policy_columns += [new.alias(NEW_COLUMNS_COLUMN), F.when(new.isNotNull(), F.lit(kinds)).alias(NEW_TYPES_COLUMN)]
    return frame.select(*columns, corrupt, *policy_columns, *kept)


def as_declared(data_type: Any) -> DataType:
    """A Spark type as the catalog declares it (every nested field nullable)."""
    if isinstance(data_type, StructType):
        return Struct(tuple(Field(field.name, as_declared(field.dataType)) for field in data_type.fields))
    if isinstance(data_type, ArrayType):
        return Array(as_declared(data_type.elementType))
    if isinstance(data_type, SparkMap):
        return MapType(as_declared(data_type.keyType), as_declared(data_type.valueType))
    return parse(data_type.simpleString())[0]


def column_type(data_type: Any) -> str | None:
    """The type a new column takes under ``add_new_columns`` (its source's, as the catalog declares it), or None for
    one whose values do not come back from their JSON as they were: bytes inside a struct, an array or a map (JSON
    holds them as base64 text), a map whose keys are not strings, a type the catalog cannot declare (a variant).
    Such a field is rescued instead."""
    def round_trips(inner: Any, nested: bool) -> bool:
        if isinstance(inner, StructType):
            return all(round_trips(field.dataType, True) for field in inner.fields)
        if isinstance(inner, ArrayType):
            return round_trips(inner.elementType, True)
        if isinstance(inner, SparkMap):
            return isinstance(inner.keyType, StringType) and round_trips(inner.valueType, True)
        return not (nested and isinstance(inner, BinaryType))

    if not round_trips(data_type, False):
        return None
    try:
        return as_declared(data_type).sql()
    except TypeSyntaxError:
        return None


def _is_complex(data_type: Any) -> bool:
    return isinstance(data_type, (StructType, ArrayType, SparkMap))


def _declared_sql(data_type: Any) -> str | None:
    """:func:`as_declared` as DDL, or None for a type the catalog cannot declare (a variant)."""
    try:
        return as_declared(data_type).sql(nullable_only=True)
    except TypeSyntaxError:
        return None
