"""The reading side of the ``sluice_iceberg`` Spark Python Data Source (:mod:`sluice_spark.rs.iceberg`): an Iceberg
table read incrementally by snapshot, without the
Iceberg JVM jars (pyiceberg plans on the driver, pyarrow reads on the executors).

``spark.readStream.format("sluice_iceberg").option("table", "ns.table").option("catalog", name)
.option("lakeRoot", root).load()``. The offset is ``{"snapshot": id, "sequence": n}``: every snapshot of the
table's history up to ``id`` has been read (:mod:`sluice.storage.iceberg_snapshots`). A micro-batch reads whole
snapshots, at least one per batch, as many as the read limit admits (``maxFilesPerTrigger``,
``maxBytesPerTrigger``, counted from the snapshots' summaries); with ``Trigger.AvailableNow`` the query reads
exactly the snapshots committed before it started; a range backfill's, those of sequence numbers
``startingSequence`` to ``endingSequence``. Each data file an append adds is one partition, read on an executor by
pyiceberg's Arrow reader, which matches columns by field id: a column renamed or added since the file was written
reads as the table's schema has it.

The catalog's properties (its address and credentials) are resolved in the planning process from the catalog's
name (:func:`sluice.kinds.iceberg.catalog_properties`), never passed as an option a plan could print; the executors
get the table's metadata and its file-reading properties alone.

The query reads with the table's schema when it starts; a column the table gains later is read by the next run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxBytes, ReadMaxFiles, SupportsTriggerAvailableNow

from sluice.paths import Roots
from sluice.storage.iceberg_snapshots import (
    BEFORE_FIRST,
    added_data_files,
    check_readable,
    file_io_properties,
    history_after,
)
from sluice_spark.rs.source import read_limit

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

ICEBERG_DATA_SOURCE = "sluice_iceberg"
# A range backfill's reader (sluice.operations.iceberg_range): from the snapshot before the first sequence number to
# the snapshot of the last, both of the table's history, instead of from its start to its current snapshot.
STARTING_SEQUENCE, ENDING_SEQUENCE = "startingSequence", "endingSequence"


def _table(options: dict[str, str]) -> Any:
    """The pyiceberg table the (lower-cased) options name, loaded now."""
    from sluice.kinds.iceberg import catalog_properties
    from sluice.storage.iceberg import IcebergTableFormat

    missing = [name for name in ("table", "catalog", "lakeroot") if not options.get(name)]
    if missing:
        raise ValueError(f"the {ICEBERG_DATA_SOURCE} source needs the option(s) {', '.join(missing)}")
    roots = Roots(landing="", lake=options["lakeroot"], checkpoints="")
    return IcebergTableFormat(options["table"], catalog_properties(options["catalog"], roots)).table()


def table_schema(options: Any) -> StructType:
    """The Spark schema of the table the reader's options name: the table's schema as it is now."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(_table(_lowered(options)).schema().as_arrow())


def _lowered(options: Any) -> dict[str, str]:
    return {str(key).lower(): str(value) for key, value in dict(options).items()}


class IcebergStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads the data files each new append snapshot of an Iceberg table adds."""

    def __init__(self, schema: StructType, options: dict[str, str]) -> None:
        self.options = _lowered(options)
        self.identifier = self.options.get("table", "")
        self.schema = schema
        self.max_files = int(self.options["maxfilespertrigger"]) if "maxfilespertrigger" in self.options else None
        self.max_bytes = int(self.options["maxbytespertrigger"]) if "maxbytespertrigger" in self.options else None
        self.target: dict[str, int] | None = None
        self.first, self.last = (int(self.options[key.lower()]) if key.lower() in self.options else None
                                 for key in (STARTING_SEQUENCE, ENDING_SEQUENCE))

    def _current(self) -> Any:
        return _table(self.options)

    def initialOffset(self) -> dict[str, int]:
        if self.first is None:
            return dict(BEFORE_FIRST)
        before = [snapshot for snapshot in history_after(self._current(), None, identifier=self.identifier)
                  if snapshot.sequence < self.first]
        return before[-1].offset if before else dict(BEFORE_FIRST)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._latest()
        if self.last is not None:
            upto = [snapshot for snapshot in history_after(self._current(), None, identifier=self.identifier)
                    if snapshot.sequence <= self.last]
            self.target = upto[-1].offset if upto else dict(BEFORE_FIRST)

    def _latest(self) -> dict[str, int]:
        table = self._current()
        current = table.current_snapshot()
        if current is None:
            return dict(BEFORE_FIRST)
        return {"snapshot": current.snapshot_id, "sequence": int(current.sequence_number or 0)}

    def getDefaultReadLimit(self) -> ReadLimit:
        return read_limit(self.max_files, self.max_bytes)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        table = self._current()
        waiting = history_after(table, start, identifier=self.identifier)
        if self.target is not None:  # AvailableNow: nothing committed after the query started
            upto = [snapshot.snapshot_id for snapshot in waiting].index(self.target["snapshot"]) + 1 if any(
                snapshot.snapshot_id == self.target["snapshot"] for snapshot in waiting) else 0
            waiting = waiting[:upto]
        end, files, size = dict(start), 0, 0
        for position, snapshot in enumerate(waiting):
            files += snapshot.files
            size += snapshot.bytes
            over = (isinstance(limit, ReadMaxFiles) and files > limit.max_files) or (
                isinstance(limit, ReadMaxBytes) and size > limit.max_bytes)
            if over and position > 0:
                break  # whole snapshots only, and at least one per batch
            end = snapshot.offset
        return end

    def reportLatestOffset(self) -> dict[str, int]:
        return self._latest()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        table = self._current()
        # An executor reads a file with the table's metadata as planned (its schemas, by field id) and its FileIO:
        # the reader reaches executors before it plans, so they travel with each partition.
        io_properties = file_io_properties(table)
        parts: list[InputPartition] = []
        for snapshot in history_after(table, start, identifier=self.identifier):
            if snapshot.sequence > end["sequence"]:
                break
            if check_readable(snapshot, self.options, identifier=self.identifier):
                parts += [InputPartition((table.metadata, io_properties, data_file))
                          for data_file in added_data_files(table, snapshot.snapshot_id)]
            if snapshot.snapshot_id == end["snapshot"]:
                break
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io import load_file_io
        from pyiceberg.io.pyarrow import ArrowScan
        from pyiceberg.table import FileScanTask
        from pyspark.sql.pandas.types import to_arrow_schema

        metadata, io_properties, data_file = partition.value
        target = to_arrow_schema(self.schema, timezone="UTC")
        io = load_file_io(io_properties, metadata.location)
        scan = ArrowScan(metadata, io, metadata.schema(), AlwaysTrue())
        for batch in scan.to_record_batches([FileScanTask(data_file)]):
            yield batch.select(target.names).cast(target)

    def commit(self, end: dict[str, int]) -> None:
        pass
