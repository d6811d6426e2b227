"""Column helpers both table writers share (:mod:`sluice_spark.write.tables`, :mod:`sluice_spark.write.cdc`)."""

from __future__ import annotations

from typing import Any


def orderable(data_type: Any) -> bool:
    """Whether Spark can sort by a column of this type: not by a map or a variant, nor by what holds one."""
    from pyspark.sql.types import ArrayType, MapType, StructType, VariantType

    if isinstance(data_type, MapType | VariantType):
        return False
    if isinstance(data_type, StructType):
        return all(orderable(field.dataType) for field in data_type.fields)
    if isinstance(data_type, ArrayType):
        return orderable(data_type.elementType)
    return True


def in_schema(rows: Any, schema: Any) -> Any:
    """An Arrow table's columns in the order and the types of the table's schema (a column added to an existing
    table comes last in it); a column of the table the rows lack (one of Sluice's own the stream no longer writes,
    see :func:`sluice.storage.delta.ensure_table`) is NULL."""
    import pyarrow as pa

    columns = [rows.column(field.name) if field.name in rows.column_names else pa.nulls(rows.num_rows, field.type)
               for field in schema]
    return pa.Table.from_arrays(columns, names=schema.names).cast(schema)
