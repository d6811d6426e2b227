"""Iceberg data files written without a catalog: on Spark's executors, or on the driver, by pyiceberg's own Parquet
writer (``write_file``: the table's field ids in the Parquet schema, its column statistics in the ``DataFile``).

A writer needs only the table's metadata (its schema, partition spec, location and properties) and a ``FileIO``; the
driver then commits the files in one snapshot (:meth:`sluice.storage.iceberg.IcebergTableFormat.append_files`).
Files written and never committed (a task retried, a run killed before its commit, a replay skipped) are orphans,
which :func:`sluice.storage.iceberg.remove_orphan_files` removes once older than the retention.

Partition transforms (``day(ts)``, ``bucket(16, user_id)``, ...) are computed here with pyarrow: pyiceberg 0.12's
own vectorised transforms need the optional ``pyiceberg-core`` (Rust) package, which Sluice does not install.
Bucket and integer truncate go through pyiceberg's Python transform once per distinct value.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

# ``day(ts)``, ``identity(col)``, a bare ``col``; ``bucket(16, col)``, ``truncate(4, col)``.
_BY_COLUMN = re.compile(r"^\s*(identity|year|month|day|hour)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")
_WITH_WIDTH = re.compile(r"^\s*(bucket|truncate)\s*\(\s*([0-9]+)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")
_BARE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*$")
TRANSFORMS = ("identity", "year", "month", "day", "hour", "bucket", "truncate")


@dataclass(frozen=True)
class PartitionTransform:
    """One field of an Iceberg partition spec as a sink declares it: ``transform`` of ``column`` (with ``width``,
    the bucket count or the truncate width)."""

    transform: str
    column: str
    width: int | None = None

    @property
    def field_name(self) -> str:
        """The partition field's name, as Spark's Iceberg names it (``ts_day``, ``user_id_bucket_16``)."""
        if self.transform == "identity":
            return self.column
        if self.transform == "truncate":
            return f"{self.column}_trunc_{self.width}"
        return f"{self.column}_{self.transform}" + (f"_{self.width}" if self.width is not None else "")

    @property
    def text(self) -> str:
        if self.transform == "identity":
            return self.column
        return f"{self.transform}({self.width}, {self.column})" if self.width is not None else \
            f"{self.transform}({self.column})"

    def iceberg(self) -> Any:
        """pyiceberg's transform."""
        from pyiceberg.transforms import parse_transform

        return parse_transform(self.transform if self.width is None else f"{self.transform}[{self.width}]")


def parse_partition(text: str) -> PartitionTransform:
    """A ``partition_by`` item of an Iceberg sink; ValueError (the reason, one line) when malformed."""
    if not isinstance(text, str):
        raise ValueError(f"expected a column or a transform such as day(ts), got {text!r}")
    if found := _BY_COLUMN.match(text):
        return PartitionTransform(found.group(1), found.group(2))
    if found := _WITH_WIDTH.match(text):
        width = int(found.group(2))
        if width < 1:
            raise ValueError(f"{found.group(1)} needs a width of at least 1, got {text!r}")
        return PartitionTransform(found.group(1), found.group(3), width)
    if found := _BARE.match(text):
        return PartitionTransform("identity", found.group(1))
    raise ValueError(f"expected a column or one of {', '.join(f'{name}(...)' for name in TRANSFORMS)} "
                     f"(day(ts), bucket(16, user_id), truncate(4, name)), got {text!r}")


def partition_values(transform: Any, source_type: Any, column: Any) -> Any:
    """The partition values (Iceberg's representation: days, hours, months, years since 1970, bucket numbers, ...)
    of an Arrow column under a pyiceberg ``transform`` of a field of ``source_type``."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyiceberg.transforms import (
        DayTransform,
        HourTransform,
        IdentityTransform,
        MonthTransform,
        TruncateTransform,
        YearTransform,
    )

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if isinstance(transform, IdentityTransform):
        return column
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("us"))  # the UTC wall clock, without a time zone database
    if isinstance(transform, DayTransform):
        return column.cast(pa.date32()).cast(pa.int32())
    if isinstance(transform, HourTransform):
        micros = column.cast(pa.int64())
        return pc.floor(pc.divide(micros.cast(pa.float64()), 3_600_000_000.0)).cast(pa.int32())
    if isinstance(transform, (YearTransform, MonthTransform)):
        years = pc.subtract(pc.year(column), 1970)
        if isinstance(transform, YearTransform):
            return years.cast(pa.int32())
        return pc.add(pc.multiply(years, 12), pc.subtract(pc.month(column), 1)).cast(pa.int32())
    if isinstance(transform, TruncateTransform) and pa.types.is_string(column.type):
        return pc.utf8_slice_codeunits(column, 0, transform.width)
    # bucket, and truncate of integers and decimals: pyiceberg's Python transform, once per distinct value
    if pa.types.is_date(column.type):
        column = column.cast(pa.int32())
    elif pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    apply = transform.transform(source_type)
    distinct = pc.unique(column)
    mapped = pa.array([apply(value) for value in distinct.to_pylist()])
    return pc.take(mapped, pc.index_in(column, distinct))


def write_data_files(metadata: Any, io: Any, rows: Any, *, write_uuid: uuid.UUID | None = None) -> list[Any]:
    """Write an Arrow table (the table's columns, any order, types castable to its schema) as Parquet data files
    of the table whose pyiceberg ``metadata`` is given, one or more per partition (pyiceberg's target file size);
    pyiceberg's ``DataFile`` of each, to be committed by the driver."""
    import itertools

    import numpy as np
    import pyarrow as pa
    from pyiceberg.io.pyarrow import bin_pack_arrow_table, pyarrow_to_schema, schema_to_pyarrow, write_file
    from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
    from pyiceberg.table import TableProperties, WriteTask
    from pyiceberg.utils.properties import property_as_int

    from sluice.storage.tableformat import conform

    if rows.num_rows == 0:
        return []
    schema = metadata.schema()
    rows = conform(rows, schema_to_pyarrow(schema, include_field_ids=False))
    task_schema = pyarrow_to_schema(rows.schema, name_mapping=schema.name_mapping,
                                    format_version=metadata.format_version)
    target = property_as_int(metadata.properties, TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
                             TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT) or \
        TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT
    write_uuid = write_uuid or uuid.uuid4()
    counter = itertools.count(0)
    spec = metadata.spec()
    if spec.is_unpartitioned():
        tasks = [WriteTask(write_uuid=write_uuid, task_id=next(counter), schema=task_schema, record_batches=batches)
                 for batches in bin_pack_arrow_table(rows, target)]
        return list(write_file(io, metadata, iter(tasks)))
    # One hash grouping of the rows by their partition values, then one take per partition.
    names = [f"_sluice_partition_{index}" for index in range(len(spec.fields))]
    keys = pa.table({name: partition_values(field.transform, schema.find_field(field.source_id).field_type,
                                            rows.column(schema.find_column_name(field.source_id)))
                     for name, field in zip(names, spec.fields, strict=True)})
    positions = keys.append_column("_row", pa.array(np.arange(rows.num_rows)))
    groups = positions.group_by(names, use_threads=False).aggregate([("_row", "list")])
    row_lists = groups.column("_row_list").combine_chunks()
    tasks = []
    for position, values in enumerate(groups.select(names).to_pylist()):
        key = PartitionKey(field_values=[PartitionFieldValue(field, values[name])
                                         for name, field in zip(names, spec.fields, strict=True)],
                           partition_spec=spec, schema=schema)
        part = rows.take(row_lists[position].values)
        tasks += [WriteTask(write_uuid=write_uuid, task_id=next(counter), schema=task_schema, record_batches=batches,
                            partition_key=key) for batches in bin_pack_arrow_table(part, target)]
    return list(write_file(io, metadata, iter(tasks)))


def delete_files(io: Any, files: list[Any]) -> None:
    """Remove data files written and not committed (a replay skipped, a batch aborted)."""
    import contextlib

    for data_file in files:
        with contextlib.suppress(OSError, FileNotFoundError):
            io.delete(data_file.file_path)
