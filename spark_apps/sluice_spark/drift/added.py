"""The drift of a batch at its write: the new fields that stop it under ``fail_on_new_columns``, and the columns
``add_new_columns`` adds to its table, typed from the values that arrived
(:data:`~sluice_spark.targets.NEW_COLUMNS_COLUMN`) or from a typed source's own types
(:data:`~sluice_spark.targets.NEW_TYPES_COLUMN`).

The writers (:class:`sluice_spark.write.batches.BatchRouter`) call these on the persisted batch, before any table
commits: a refusal leaves every table as it was.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sluice.constants import RESCUED_COLUMN, SOURCE_FILE_COLUMN
from sluice.errors import SchemaDriftError
from sluice.model.types import quote
from sluice_spark.targets import (
    GOOD_ROUTE,
    NEW_COLUMNS_COLUMN,
    NEW_FIELDS_COLUMN,
    NEW_TYPES_COLUMN,
    TableTarget,
    drift_failure,
)


def refuse_drift(batch: DataFrame, batch_id: int) -> None:
    """Raise when rows of the batch brought fields the schema does not declare (``fail_on_new_columns``)."""
    drifting = batch.where(F.col(NEW_FIELDS_COLUMN).isNotNull())
    counted = {row[0]: int(row[1]) for row in
               drifting.select(F.explode(NEW_FIELDS_COLUMN)).groupBy("col").count().collect()}
    if counted:
        origins = (drifting.select(SOURCE_FILE_COLUMN).distinct().limit(5).collect()
                   if SOURCE_FILE_COLUMN in batch.columns else [])
        raise drift_failure(batch_id, counted, [str(row[0]) for row in origins])


def add_columns(batch: DataFrame, batch_id: int, *, sink: TableTarget, route_column: str,
                added: Mapping[str, str]) -> tuple[DataFrame, dict[str, str]]:
    """Under ``add_new_columns``: the batch with a typed column per new top-level field that its written rows
    brought (:data:`NEW_COLUMNS_COLUMN`), and those columns' types. A typed source says each one's type
    (:data:`NEW_TYPES_COLUMN`); otherwise a type is the one every value of the field fits (whole numbers widen
    to double beside fractions; an object, an array or a number past 64 bits is kept as its text). A field that
    arrives as two other kinds of value stops the batch, naming it. What cannot become a column joins the row's
    ``_rescued_data``: a name the table has already in another case, a value that does not fit the column an
    earlier batch of this run added (``added``). ``sink`` is the stream's own table, whose rows bring them."""
    written = (F.col(route_column) == GOOD_ROUTE) & F.col(NEW_COLUMNS_COLUMN).isNotNull()
    if sink.flag:  # a backfill writes the rows in its range only
        written = written & F.col(sink.flag)
    new = F.try_parse_json(NEW_COLUMNS_COLUMN)
    values = batch.where(written).select(F.explode(new.try_cast("MAP<STRING, VARIANT>")).alias("name", "value"))
    seen = {row[0]: set(row[1]) for row in values.where(~F.is_variant_null("value")).groupBy("name")
            .agg(F.collect_set(F.schema_of_variant("value"))).collect()}
    declared: dict[str, set[str]] = {}
    if NEW_TYPES_COLUMN in batch.columns:
        hints = batch.where(written).select(F.explode(F.from_json(NEW_TYPES_COLUMN, "MAP<STRING, STRING>")))
        for name, kind in hints.distinct().collect():
            declared.setdefault(name, set()).add(kind)
    taken = {name.casefold(): name for name in sink.table_columns}
    taken.update({name.casefold(): name for name in added})
    types: dict[str, str] = {}
    for name, kinds in sorted(seen.items()):
        owner = taken.get(name.casefold())
        if owner is not None and owner != name:
            continue  # another case of a column's name: rescued
        earlier = added.get(name)  # an earlier batch of this run added it: the table has its type
        types[name] = earlier or (declared_column_type(name, declared[name], batch_id) if name in declared
                                  else new_column_type(name, kinds, batch_id))
        taken[name.casefold()] = name
    if not types:
        return _rescue_new(batch, new, {}), {}
    typed = {name: _typed(new, name, kind, declared=name in declared) for name, kind in types.items()}
    return _rescue_new(batch.withColumns(typed), new, types), types


def _rescue_new(batch: DataFrame, new: Column, columns: Mapping[str, str]) -> DataFrame:
    """Each row's new fields that did not become a column, or whose value its column could not hold, joined to
    its ``_rescued_data``."""
    def left(key: Column, value: Column) -> Column:
        kept = F.lit(False)
        for name in columns:
            kept = kept | ((key == name) & F.col(quote(name)).isNotNull())
        return ~kept & ~F.is_variant_null(value)

    leftovers = F.map_filter(new.try_cast("MAP<STRING, VARIANT>"), left)
    rescued = F.try_parse_json(F.col(RESCUED_COLUMN)).try_cast("MAP<STRING, VARIANT>")
    merged = F.map_concat(F.coalesce(rescued, F.create_map().cast("MAP<STRING, VARIANT>")), leftovers)
    return batch.withColumn(RESCUED_COLUMN, F.when(F.size(leftovers) > 0, F.to_json(merged))
                            .otherwise(F.col(RESCUED_COLUMN)))


def new_column_type(name: str, kinds: set[str], batch_id: int) -> str:
    """The Spark SQL type of a new column from the variant types of its values (``schema_of_variant``): BIGINT for
    whole numbers, DOUBLE once a fraction is among them, BOOLEAN, STRING for text, for objects and arrays (their
    JSON text) and for numbers past 64 bits (their digits). Two other kinds of value are refused, naming the
    column: the catalog can declare its type."""
    found = set()
    for kind in kinds:
        whole = re.fullmatch(r"DECIMAL\((\d+),0\)", kind)
        if kind in ("BIGINT", "INT", "SMALLINT", "TINYINT") or (whole and int(whole.group(1)) <= 18):
            found.add("BIGINT")
        elif whole:  # past 64 bits (an unsigned id, a hash): its digits as text
            found.add("BIG")
        elif kind in ("DOUBLE", "FLOAT") or (kind.startswith("DECIMAL") and not whole):
            found.add("DOUBLE")
        elif kind in ("BOOLEAN", "STRING"):
            found.add(kind)
        elif kind.startswith(("OBJECT", "ARRAY")):
            found.add("JSON")
        else:
            found.add(kind)
    if found <= {"BIGINT", "DOUBLE"}:
        return "DOUBLE" if "DOUBLE" in found else "BIGINT"
    if "BIG" in found and found <= {"BIGINT", "DOUBLE", "BIG"}:
        return "STRING"
    if len(found) == 1 and found <= {"BOOLEAN", "STRING", "JSON"}:
        return "STRING" if found == {"JSON"} else found.pop()
    raise drift_error(batch_id, f"the new field '{name}' arrives as {', '.join(sorted(found))}: one column cannot "
                                "hold them all; declare its type in source.schema (a string holds any of them)")


def declared_column_type(name: str, kinds: set[str], batch_id: int) -> str:
    """The type of a new column a typed source declares (:data:`NEW_TYPES_COLUMN`): its type there, the wider one
    when its rows came from files or versions that typed it apart (int and bigint, float and double, two decimals)."""
    if len(kinds) == 1:
        return next(iter(kinds))
    decimals = [re.fullmatch(r"DECIMAL\((\d+),(\d+)\)", kind) for kind in kinds]
    if all(decimals):  # files that inferred their decimals apart: the digits of each, before and after the point
        scale = max(int(match.group(2)) for match in decimals if match)
        digits = max(int(match.group(1)) - int(match.group(2)) for match in decimals if match)
        if digits + scale <= 38:
            return f"DECIMAL({digits + scale},{scale})"
    for wider, narrower in (("BIGINT", {"TINYINT", "SMALLINT", "INT"}), ("INT", {"TINYINT", "SMALLINT"}),
                            ("DOUBLE", {"FLOAT"})):
        if wider in kinds and kinds - {wider} <= narrower:
            return wider
    raise drift_error(batch_id, f"the new column '{name}' arrives as {', '.join(sorted(kinds))}: one column cannot "
                                "hold them all; declare its type in source.schema")


def drift_error(batch_id: int, reason: str) -> SchemaDriftError:
    return SchemaDriftError(f"cannot add new columns in batch {batch_id}: {reason}; nothing of this batch was "
                            "committed")


# The variant types of the values a new column of each type takes as they are (a cast would truncate 1.5 to 1).
_FITS = {"BIGINT": r"^(BIGINT|INT|SMALLINT|TINYINT|DECIMAL\((1[0-8]|[1-9]),0\))$",
         "DOUBLE": r"^(BIGINT|INT|SMALLINT|TINYINT|DOUBLE|FLOAT|DECIMAL\(\d+,\d+\))$", "BOOLEAN": r"^BOOLEAN$"}


def _typed(new: Any, name: str, kind: str, *, declared: bool = False) -> Any:
    """A new field's value in its column's type: NULL when the value is not of a kind the type takes as it is (it is
    rescued instead). A text column takes anything: a string as it is, anything else as its JSON. The value of a
    column a typed source ``declared`` is its JSON (Spark's ``to_json``), cast back to its type."""
    value = F.try_variant_get(new, f"$.{name}", "VARIANT")
    if declared:
        if kind == "BINARY":  # to_json writes bytes as base64
            return F.try_to_binary(F.try_variant_get(value, "$", "STRING"), F.lit("base64"))
        return F.try_variant_get(value, "$", kind)
    if kind == "STRING":
        return F.coalesce(F.try_variant_get(value, "$", "STRING"), F.to_json(value))
    return F.when(F.schema_of_variant(value).rlike(_FITS[kind]), F.try_variant_get(value, "$", kind))
