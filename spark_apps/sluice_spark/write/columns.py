"""Column helpers both table writers share (:mod:`sluice_spark.write.tables`, :mod:`sluice_spark.write.cdc`)."""

from __future__ import annotations

from typing import Any

from sluice.storage.tableformat import conform


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


# An Arrow table in a table's schema: the table-format seam's, shared by every writer.
in_schema = conform
