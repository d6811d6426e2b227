"""The pip-only Iceberg sink's append path: the ``sluice_iceberg`` Spark Python Data Source, the rs Delta engine's
shape (:mod:`sluice_spark.rs.sink`) for an Iceberg table.

Executors write each task's good rows as Iceberg data files (Parquet with the table's field ids, partitioned by its
spec: :func:`sluice.storage.iceberg_files.write_data_files`) and its dead letters as Parquet files of the Delta
dead-letter table, and send the files back. The driver commits the Iceberg files as one append snapshot carrying the
batch's query id and batch id (skipped, its files removed, when the table holds the batch already), then the dead
letters in one Delta transaction: a kill between the two replays the batch, which the Iceberg table skips and the
dead-letter table takes. A kill after the files are written and before the commit leaves orphan files only, which
maintenance removes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, WriterCommitMessage

from sluice.storage.delta import commit_metadata
from sluice_spark import faults
from sluice_spark.rs.iceberg_source import ICEBERG_DATA_SOURCE, IcebergStreamReader, table_schema
from sluice_spark.rs.sink import DeltaCommitMessage, DeltaRsStreamWriter, _remove_files
from sluice_spark.targets import GOOD_ROUTE, TableTarget

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType



@dataclass
class IcebergCommitMessage(DeltaCommitMessage):
    """A task's dead-letter files (as the rs Delta sink's) and its Iceberg data files (pyiceberg ``DataFile``)."""

    data_files: list[Any] = field(default_factory=list)


class IcebergStreamWriter(DeltaRsStreamWriter):
    """Writes the good rows' Iceberg data files and the dead letters' Delta files on executors; commits one Iceberg
    snapshot and one Delta transaction per batch on the driver."""

    def __init__(self, *, identifier: str, catalog: dict[str, str], metadata: Any, columns: list[str],
                 **delta: Any) -> None:
        super().__init__(**delta)
        self.identifier = identifier
        self.catalog = catalog
        self.metadata = metadata
        self.columns = columns

    def _io(self) -> Any:
        from pyiceberg.io import load_file_io

        return load_file_io(self.catalog, self.metadata.location)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> IcebergCommitMessage:
        import pyarrow as pa
        import pyarrow.compute as pc

        from sluice.storage.iceberg_files import write_data_files

        good: list[pa.RecordBatch] = []

        def routed() -> Iterator[pa.RecordBatch]:
            for batch in iterator:
                mask = pc.equal(batch.column(self.route_column), GOOD_ROUTE)
                rows = batch.filter(mask).select(self.columns)
                if rows.num_rows:
                    good.append(rows)
                yield batch

        delta = super().write(routed())
        message = IcebergCommitMessage(files=delta.files, failed=delta.failed, example=delta.example,
                                       new_fields=delta.new_fields, origins=delta.origins)
        try:
            if good and not delta.failed and not delta.new_fields:
                message.data_files = write_data_files(self.metadata, self._io(), pa.Table.from_batches(good))
        except BaseException:
            self._remove_delta_files(message)
            raise
        return message

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        from sluice.storage.iceberg import IcebergTableFormat

        files = self.refuse_broken(messages, batchId)
        data_files = [f for message in messages if isinstance(message, IcebergCommitMessage)
                      for f in message.data_files]
        faults.reach("before_commit", batchId)
        metadata = commit_metadata(self.commit_info, stream=self.stream, query_id=self.app_id, batch_id=batchId,
                                   route=GOOD_ROUTE)
        IcebergTableFormat(self.identifier, self.catalog).append_files(data_files, query_id=self.app_id,
                                                                        batch_id=batchId, metadata=metadata)
        faults.reach("between_commits", batchId)
        self.commit_tables(files, batchId)
        faults.reach("after_commit", batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        from sluice.storage.iceberg_files import delete_files

        super().abort(messages, batchId)
        delete_files(self._io(), [f for message in messages if isinstance(message, IcebergCommitMessage)
                                  for f in message.data_files])

    def _remove_delta_files(self, message: DeltaCommitMessage) -> None:
        for index, target in enumerate(self.targets):
            _remove_files(target.path, [f for f in message.files if f.table == index])


class IcebergDataSource(DataSource):
    """``sluice_iceberg``, both ways. Read (:mod:`sluice_spark.rs.iceberg_source`): ``spark.readStream`` with the
    options ``table``, ``catalog`` (the catalog's name, resolved where the query is planned), ``lakeRoot``, the read
    limits and the skip options. Write: ``df.writeStream`` with the options of ``sluice_delta``'s sink (``targets``:
    the Delta tables, the dead-letter table; ``routeColumn``, ``queryId``, ``stream``, ``commitInfo``,
    ``failedColumn``, ...) and ``table`` (the Iceberg identifier), ``catalog`` (its pyiceberg properties, JSON),
    ``columns`` (the good rows' columns, JSON)."""

    @classmethod
    def name(cls) -> str:
        return ICEBERG_DATA_SOURCE

    def schema(self) -> StructType:
        return table_schema(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return IcebergStreamReader(schema, dict(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> IcebergStreamWriter:
        from sluice.storage.iceberg import IcebergTableFormat

        options = {key.lower(): value for key, value in self.options.items()}
        missing = [key for key in ("table", "catalog", "columns", "targets", "routecolumn", "queryid")
                   if key not in options]
        if missing:
            raise ValueError(f"{ICEBERG_DATA_SOURCE} sink needs the option(s) {', '.join(missing)}")
        catalog = json.loads(options["catalog"])
        metadata, _ = IcebergTableFormat(options["table"], catalog).writer_state()
        return IcebergStreamWriter(
            identifier=options["table"], catalog=catalog, metadata=metadata, columns=json.loads(options["columns"]),
            targets=[TableTarget.from_dict(item) for item in json.loads(options["targets"])],
            route_column=options["routecolumn"], app_id=options["queryid"], stream=options.get("stream", ""),
            commit_info=json.loads(options.get("commitinfo", "{}")), failed_column=options.get("failedcolumn"),
            example_column=options.get("examplecolumn"), new_fields_column=options.get("newfieldscolumn"),
            origin_column=options.get("origincolumn"))
