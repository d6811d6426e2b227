"""The ``rs`` Delta engine's sink: a Spark Python Data Source that writes Delta tables through delta-rs.

Executors turn Arrow record batches into Parquet files inside the table folders and send the file list back to the
driver. The driver commits every file of a micro-batch in one Delta transaction per table, tagged with the
transaction identifier (app id = the stream's query id, version = the batch id). A replayed batch whose version is
already recorded in a table is skipped there and its new files are removed: this is delta-spark's
``txnAppId``/``txnVersion`` protocol, so a crash at any point followed by a rerun writes each batch exactly once.

One query can feed several tables (the stream's table and its dead-letter table, or a fan-out): each row carries a
route value in a column, and each table declares the route it takes and the columns it keeps.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    WriterCommitMessage,
)

from sluice.constants import COMMIT_INFO_RECORDS, SinkMode
from sluice.delta import commit_metadata, holds_batch
from sluice_spark import faults

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

DATA_SOURCE_NAME = "sluice_delta"
HIVE_NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
# Delta truncates string statistics; a longer string's min/max is left out rather than stored wrong.
_MAX_STRING_STAT = 32


@dataclass(frozen=True)
class TableTarget:
    """One Delta table the sink writes: the rows whose route column equals ``route`` (and, for a fan-out table, whose
    boolean ``flag`` column is true).

    ``columns`` pairs each column of the routed frame with its name in the table. ``mode`` is how a batch reaches
    the table: appended, merged by ``keys`` (the highest ``sequence_by`` wins), or rewritten whole.
    """

    route: int
    path: str
    columns: tuple[tuple[str, str], ...]
    partition_by: tuple[str, ...] = ()
    flag: str | None = None
    mode: SinkMode = SinkMode.APPEND
    keys: tuple[str, ...] = ()
    sequence_by: str | None = None

    def selects(self, route: Any, flag: Any = None) -> Any:
        """The row mask of this table over the Arrow arrays of the route and flag columns."""
        import pyarrow.compute as pc

        mask = pc.equal(route, self.route)
        return mask if self.flag is None else pc.and_(mask, flag)

    @property
    def table_columns(self) -> list[str]:
        return [name for _, name in self.columns]

    def to_dict(self) -> dict[str, Any]:
        return {"route": self.route, "path": self.path, "columns": [list(pair) for pair in self.columns],
                "partition_by": list(self.partition_by), "flag": self.flag, "mode": self.mode.value,
                "keys": list(self.keys), "sequence_by": self.sequence_by}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TableTarget:
        return cls(route=data["route"], path=data["path"],
                   columns=tuple((source, name) for source, name in data["columns"]),
                   partition_by=tuple(data.get("partition_by", ())), flag=data.get("flag"),
                   mode=SinkMode(data.get("mode", SinkMode.APPEND.value)), keys=tuple(data.get("keys", ())),
                   sequence_by=data.get("sequence_by"))


def encode_targets(targets: Sequence[TableTarget]) -> str:
    return json.dumps([target.to_dict() for target in targets])


@dataclass
class AddedFile:
    """A Parquet file an executor wrote, with what the Delta add action needs."""

    table: int
    path: str  # relative to the table root, URL-encoded as the Delta protocol requires
    size: int
    partition_values: dict[str, str | None]
    modification_time: int
    stats: str
    rows: int


@dataclass
class DeltaCommitMessage(WriterCommitMessage):
    files: list[AddedFile] = field(default_factory=list)


class DeltaRsDataSource(DataSource):
    """``df.writeStream.format("sluice_delta")``. Options: ``targets`` (JSON), ``routeColumn``, ``queryId``,
    ``stream``; ``commitInfo`` (JSON object) is added to every commit's metadata.

    ``spark.readStream.format("sluice_delta").load(path)`` reads a table's new versions
    (:mod:`sluice_spark.delta_rs_source`)."""

    @classmethod
    def name(cls) -> str:
        return DATA_SOURCE_NAME

    def schema(self) -> StructType:
        from sluice_spark.delta_rs_source import table_schema

        path = {key.lower(): value for key, value in self.options.items()}.get("path")
        if not path:
            raise ValueError(f"{DATA_SOURCE_NAME} source needs a path: spark.readStream.format(...).load(path)")
        return table_schema(path)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from sluice_spark.delta_rs_source import DeltaRsStreamReader

        return DeltaRsStreamReader(schema, dict(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DeltaRsStreamWriter:
        options = dict(self.options)
        missing = [key for key in ("targets", "routecolumn", "queryid") if key not in {k.lower() for k in options}]
        if missing:
            raise ValueError(f"{DATA_SOURCE_NAME} sink needs the option(s) {', '.join(missing)}")
        lowered = {key.lower(): value for key, value in options.items()}
        targets = [TableTarget.from_dict(item) for item in json.loads(lowered["targets"])]
        routes = [(target.route, target.flag) for target in targets]
        if len(set(routes)) != len(routes):
            raise ValueError(f"{DATA_SOURCE_NAME} sink: each table needs its own route and flag, got {routes}")
        if any(target.mode is not SinkMode.APPEND for target in targets):
            raise ValueError(f"{DATA_SOURCE_NAME} sink appends; merge and overwrite go through foreachBatch")
        return DeltaRsStreamWriter(
            targets=targets,
            route_column=lowered["routecolumn"],
            app_id=lowered["queryid"],
            stream=lowered.get("stream", ""),
            commit_info=json.loads(lowered.get("commitinfo", "{}")),
        )


class DeltaRsStreamWriter(DataSourceStreamArrowWriter):
    """Writes Parquet on executors; commits one Delta transaction per table and batch on the driver."""

    def __init__(self, targets: list[TableTarget], route_column: str, app_id: str, stream: str,
                 commit_info: dict[str, Any]) -> None:
        self.targets = targets
        self.route_column = route_column
        self.app_id = app_id
        self.stream = stream
        self.commit_info = commit_info

    # -- executors -------------------------------------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        import pyarrow.compute as pc

        writers: dict[tuple[int, tuple[str | None, ...]], _PartitionFile] = {}
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                routes = batch.column(self.route_column)
                for index, target in enumerate(self.targets):
                    mask = target.selects(routes, batch.column(target.flag) if target.flag else None)
                    selected_rows = pc.sum(mask).as_py() or 0
                    if selected_rows == batch.num_rows:  # the usual case: the whole batch takes one route
                        self._write_rows(index, target, batch, writers)
                    elif selected_rows:
                        self._write_rows(index, target, batch.filter(mask), writers)
            files = [writer.close() for writer in writers.values()]
        except BaseException:
            for writer in writers.values():
                writer.discard()
            raise
        faults.reach("executor_written")
        return DeltaCommitMessage(files=files)

    def _write_rows(self, index: int, target: TableTarget, rows: pa.RecordBatch,
                    writers: dict[tuple[int, tuple[str | None, ...]], _PartitionFile]) -> None:
        import numpy as np
        import pyarrow as pa

        rows = rows.select([source for source, _ in target.columns]).rename_columns(target.table_columns)
        data_columns = [column for column in target.table_columns if column not in target.partition_by]
        if not target.partition_by:
            key = (index, ())
            if key not in writers:
                writers[key] = _PartitionFile(index, target.path, {}, rows.schema)
            writers[key].write(rows)
            return
        # One hash grouping of the batch by partition tuple, then one take per partition.
        table = pa.Table.from_batches([rows])
        partition_by = list(target.partition_by)
        positions = table.select(partition_by).append_column("_row", pa.array(np.arange(table.num_rows)))
        groups = positions.group_by(partition_by, use_threads=False).aggregate([("_row", "list")])
        row_lists = groups.column("_row_list").combine_chunks()
        data = table.select(data_columns)
        for position, key in enumerate(groups.select(partition_by).to_pylist()):
            values = tuple(_partition_string(key[column]) for column in partition_by)
            rows_of_key = row_lists[position].values
            part = data if len(rows_of_key) == table.num_rows else data.take(rows_of_key)
            writer_key = (index, values)
            if writer_key not in writers:
                partition_values = dict(zip(target.partition_by, values, strict=True))
                writers[writer_key] = _PartitionFile(index, target.path, partition_values, part.schema)
            for batch in part.to_batches():
                writers[writer_key].write(batch)

    # -- driver ----------------------------------------------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction
        from deltalake.transaction import AddAction, PostCommitHookProperties, RemoveAction

        files = [f for message in messages if isinstance(message, DeltaCommitMessage) for f in message.files]
        faults.reach("before_commit", batchId)
        for index, target in enumerate(self.targets):
            table_files = [f for f in files if f.table == index]
            table = DeltaTable(target.path)
            if holds_batch(table, self.app_id, batchId):
                log.warning("Batch %s of %s is already in %s; skipping its replay", batchId, self.app_id,
                            target.path)
                _remove_files(target.path, table_files)
                continue
            if not table_files:
                continue
            actions: list[AddAction | RemoveAction] = [
                AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats) for f in table_files
            ]
            metadata = commit_metadata(
                self.commit_info, stream=self.stream, query_id=self.app_id, batch_id=batchId, route=target.route,
                **{COMMIT_INFO_RECORDS: sum(f.rows for f in table_files)},
            )
            table.create_write_transaction(
                actions,
                mode="append",
                schema=table.schema(),
                partition_by=list(target.partition_by) or None,
                commit_properties=CommitProperties(
                    custom_metadata=metadata, app_transactions=[Transaction(self.app_id, batchId)]
                ),
                post_commithook_properties=PostCommitHookProperties(create_checkpoint=True),
            )
            faults.reach("between_commits", batchId)
        faults.reach("after_commit", batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        for message in messages:
            if isinstance(message, DeltaCommitMessage):
                for index, target in enumerate(self.targets):
                    _remove_files(target.path, [f for f in message.files if f.table == index])


class _PartitionFile:
    """One Parquet file being written into one partition folder of one table."""

    def __init__(self, table: int, table_path: str, partition_values: dict[str, str | None],
                 schema: pa.Schema) -> None:
        import pyarrow.parquet as pq

        self.table = table
        self.partition_values = partition_values
        folder = "/".join(
            f"{quote(column, safe='')}={quote(value if value is not None else HIVE_NULL_PARTITION, safe='')}"
            for column, value in partition_values.items()
        )
        name = f"part-{uuid.uuid4()}.snappy.parquet"
        self.relative_path = f"{folder}/{name}" if folder else name
        self.filesystem, base = _filesystem(table_path)
        # The folder name is percent-encoded in the Delta log; on storage it holds the decoded value.
        self.storage_path = f"{base}/{unquote(self.relative_path)}"
        self.filesystem.create_dir(self.storage_path.rsplit("/", 1)[0], recursive=True)
        self.rows = 0
        self.writer = pq.ParquetWriter(
            self.storage_path, schema, filesystem=self.filesystem, compression="snappy", write_statistics=True
        )

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.write_batch(batch)
        self.rows += batch.num_rows

    def close(self) -> AddedFile:
        self.writer.close()
        size = self.filesystem.get_file_info(self.storage_path).size
        return AddedFile(
            table=self.table,
            path=self.relative_path,
            size=int(size or 0),
            partition_values=self.partition_values,
            modification_time=int(time.time() * 1000),
            stats=_file_stats(self.writer.writer.metadata, self.rows),
            rows=self.rows,
        )

    def discard(self) -> None:
        try:
            self.writer.close()
        finally:
            _delete_quietly(self.filesystem, self.storage_path)


def _filesystem(table_path: str) -> tuple[Any, str]:
    """The Arrow filesystem and the in-filesystem root of a table path or URI."""
    from pyarrow import fs

    filesystem, base = fs.FileSystem.from_uri(table_path if "://" in table_path else os.path.abspath(table_path))
    return filesystem, base.rstrip("/")


def _delete_quietly(filesystem: Any, path: str) -> None:
    with contextlib.suppress(OSError):  # already gone, or never fully created
        filesystem.delete_file(path)


def _remove_files(table_path: str, files: list[AddedFile]) -> None:
    """Remove files this batch wrote but will not commit (a skipped replay, an aborted batch)."""
    if not files:
        return
    filesystem, base = _filesystem(table_path)
    for added in files:
        _delete_quietly(filesystem, f"{base}/{unquote(added.path)}")


def _partition_string(value: object) -> str | None:
    """A partition value as the Delta protocol serialises it."""
    import datetime as dt

    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value.isoformat(sep=" ", timespec="microseconds")
    return str(value)


def _file_stats(metadata: Any, rows: int) -> str:
    """Delta file statistics (numRecords, nullCount, minValues, maxValues) from the Parquet footer.

    A bound that cannot be stored exactly is left out, never stored approximately: a wrong bound would make
    readers skip files that hold matching rows.
    """
    null_count: dict[str, int] = {}
    bounds: dict[str, list[Any]] = {}
    unusable: set[str] = set()
    for group_index in range(metadata.num_row_groups):
        group = metadata.row_group(group_index)
        for column_index in range(group.num_columns):
            chunk = group.column(column_index)
            name = chunk.path_in_schema
            statistics = chunk.statistics
            if "." in name or statistics is None or not statistics.has_null_count:
                unusable.add(name)
                continue
            null_count[name] = null_count.get(name, 0) + statistics.null_count
            if not statistics.has_min_max:
                if statistics.null_count < chunk.num_values:
                    unusable.add(name)  # values without bounds: no bound for the file either
                continue
            low, high = statistics.min, statistics.max
            if name in bounds:
                bounds[name][0] = min(bounds[name][0], low)
                bounds[name][1] = max(bounds[name][1], high)
            else:
                bounds[name] = [low, high]

    stats: dict[str, Any] = {"numRecords": rows, "nullCount": {}, "minValues": {}, "maxValues": {}}
    for name, count in null_count.items():
        if name in unusable:
            continue
        stats["nullCount"][name] = count
        if name not in bounds:
            continue
        low, high = _stat_value(bounds[name][0], round_up=False), _stat_value(bounds[name][1], round_up=True)
        if low is not None and high is not None:
            stats["minValues"][name], stats["maxValues"][name] = low, high
    return json.dumps(stats)


def _stat_value(value: Any, *, round_up: bool) -> Any:
    """A bound as Delta stores it in JSON, or None when it cannot be stored exactly."""
    import datetime as dt
    import decimal
    import math

    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, decimal.Decimal):
        # Up to 15 significant digits survive the trip through a JSON number exactly.
        return float(value) if len(value.as_tuple().digits) <= 15 else None
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        # Delta keeps milliseconds; the upper bound is rounded up so that it still bounds the data.
        if round_up and value.microsecond % 1000:
            value = value + dt.timedelta(microseconds=1000 - value.microsecond % 1000)
        return value.isoformat(timespec="milliseconds") + "Z"
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, str):
        return value if len(value) <= _MAX_STRING_STAT else None
    return None
