"""The ``rs`` Delta engine's streaming source: a Delta table read incrementally by version through its commit log,
without the Delta JVM jars.

The offset is ``{"version": v}``: every version up to ``v`` has been read. A micro-batch reads whole versions
(the data files each one adds), at least one version per batch, as many as the read limit admits
(``maxFilesPerTrigger``, ``maxBytesPerTrigger``). With ``Trigger.AvailableNow`` the query reads exactly the versions
committed before it started. Executors read the Parquet files and yield Arrow batches, with the partition columns
put back from the commit.

Options:

- ``startingVersion``: the first version to read (default 0), or ``latest`` for only what is committed after the
  query starts; ``startingTimestamp``: the first version committed at or after an ISO time.
- ``endingVersion``: the last version to read (a range backfill's bound, :mod:`sluice.operations.delta_range`);
  not a catalog option: a live stream reads on.
- ``maxFilesPerTrigger`` / ``maxBytesPerTrigger``: the rate limit.
- ``skipChangeCommits``: skip versions that remove data (a DELETE, UPDATE or MERGE); without it such a version
  fails the query, as delta-spark's source does, because an append-only reader cannot apply it.
- ``readChangeFeed``: read each version's changes instead of its appends: delta-rs's change data feed
  (``DeltaTable.load_cdf``) of that one version, on an executor, one partition per version. The rows are the
  inserts, the updates' new rows (``update_postimage``; their old rows are left out) and the deletes, with Delta's
  ``_change_type``, ``_commit_version`` and ``_commit_timestamp``. A version committed while the table did not
  record its changes (``delta.enableChangeDataFeed``) fails the query, naming it.

The query reads with the table's schema when it starts. A version of that run with an older schema is read with it
when the change was additive (a file without a column reads it as NULL); any other change (a column dropped,
renamed or retyped since) stops the query, naming the version. A column the table gains after the query started is
read by the next run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from sluice.storage.delta import commit_actions
from sluice.storage.store import folder, is_local

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructField, StructType


class DeltaSourceError(Exception):
    """A Delta table version the source cannot read as appends."""


@dataclass(frozen=True)
class VersionFiles:
    """The data files one version adds, and whether it also removes data."""

    version: int
    files: list[dict[str, Any]] = field(default_factory=list)
    removes_data: bool = False
    schema_string: str | None = None
    # The table's properties when the version sets them (its metaData action), else None.
    configuration: dict[str, str] | None = None
    # It has change files (``cdc`` actions): the changes of an UPDATE, DELETE or MERGE.
    has_change_files: bool = False

    @property
    def size(self) -> int:
        return sum(int(add.get("size", 0)) for add in self.files)


def table_schema(path: str) -> StructType:
    """The Spark schema of a Delta table, from delta-rs."""
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(pa.schema(DeltaTable(path).schema().to_arrow()))


def read_version(table: str, version: int) -> VersionFiles:
    """The actions of one commit, from its JSON file in ``_delta_log``, on a disk or a store."""
    try:
        actions = commit_actions(table, version)
    except FileNotFoundError:
        raise DeltaSourceError(f"{table}: the commit file of version {version} is gone (log cleanup); start the "
                               "stream from a later version (startingVersion) with a new checkpoint") from None
    files, removes, schema, configuration, change_files = [], False, None, None, False
    for action in actions:
        if "add" in action and action["add"].get("dataChange", True):
            if action["add"].get("deletionVector"):
                raise DeltaSourceError(f"{table}: version {version} adds a file with a deletion vector, which this "
                                       "source cannot apply; use the jvm engine")
            files.append(action["add"])
        elif "remove" in action and action["remove"].get("dataChange", True):
            removes = True
        elif "cdc" in action:
            change_files = True
        elif "metaData" in action:
            schema = action["metaData"].get("schemaString")
            configuration = action["metaData"].get("configuration") or {}
            _refuse_column_mapping(table, version, configuration)
    return VersionFiles(version, files, removes, schema, configuration, change_files)


def _refuse_column_mapping(table: str, version: int, configuration: dict[str, str]) -> None:
    """Column mapping names a table's columns apart from their Parquet files: this source reads files by name."""
    mode = configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise DeltaSourceError(f"{table}: version {version} sets column mapping (delta.columnMapping.mode = {mode}), "
                               "which this source cannot read; use the jvm engine")


def latest_version(table: str) -> int:
    from deltalake import DeltaTable

    return DeltaTable(table).version()


def version_at(table: str, moment: str) -> int:
    """The first version committed at or after ``moment`` (ISO 8601); one past the latest when there is none."""
    from deltalake import DeltaTable

    when = datetime.fromisoformat(moment)
    when = when if when.tzinfo else when.replace(tzinfo=timezone.utc)
    wanted = when.timestamp() * 1000
    history = sorted(DeltaTable(table).history(), key=lambda commit: commit["version"])
    return next((commit["version"] for commit in history if commit["timestamp"] >= wanted),
                history[-1]["version"] + 1 if history else 0)


class DeltaRsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads the data files that each new version of a Delta table adds."""

    def __init__(self, schema: StructType, options: dict[str, str]) -> None:
        options = {key.lower(): value for key, value in options.items()}
        if "path" not in options:
            raise DeltaSourceError("the sluice_delta source needs a path: spark.readStream.format(...).load(path)")
        self.path = options["path"]
        self.schema = schema
        self.options = options
        self.max_files = int(options["maxfilespertrigger"]) if "maxfilespertrigger" in options else None
        self.max_bytes = int(options["maxbytespertrigger"]) if "maxbytespertrigger" in options else None
        self.skip_changes = options.get("skipchangecommits", "false").lower() == "true"
        self.changes = reads_changes(options)
        self.ending = int(options["endingversion"]) if "endingversion" in options else None
        self.target: int | None = None
        self.schema_string: str | None = None
        # Whether the table recorded its changes as of the last version planned (``readChangeFeed``).
        self.records_changes: bool | None = None

    def initialOffset(self) -> dict[str, int]:
        if "startingtimestamp" in self.options:
            first = version_at(self.path, self.options["startingtimestamp"])
        elif self.options.get("startingversion", "0") == "latest":
            first = latest_version(self.path) + 1
        else:
            first = int(self.options.get("startingversion", "0"))
        return {"version": first - 1}

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._bounded(latest_version(self.path))

    def _bounded(self, version: int) -> int:
        return version if self.ending is None else min(version, self.ending)

    def getDefaultReadLimit(self) -> ReadLimit:
        return read_limit(self.max_files, self.max_bytes)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        upper = self.target if self.target is not None else self._bounded(latest_version(self.path))
        version = start["version"]
        files = size = 0
        while version < upper:
            candidate = read_version(self.path, version + 1)
            files += len(candidate.files)
            size += candidate.size
            over = (isinstance(limit, ReadMaxFiles) and files > limit.max_files) or (
                isinstance(limit, ReadMaxBytes) and size > limit.max_bytes)
            if over and version > start["version"]:
                break  # whole versions only, and at least one per batch
            version += 1
        return {"version": version}

    def reportLatestOffset(self) -> dict[str, int]:
        return {"version": latest_version(self.path)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        if self.schema_string is None and start["version"] >= 0:
            # The versions before the range may have set the schema its first files were written with.
            self._check_schema(VersionFiles(start["version"], schema_string=_schema_at(self.path, start["version"])))
        if self.changes and self.records_changes is None:
            self.records_changes = start["version"] >= 0 and _records_changes_at(self.path, start["version"])
        parts: list[InputPartition] = []
        for version in range(start["version"] + 1, end["version"] + 1):
            commit = read_version(self.path, version)
            self._check_schema(commit)
            if self.changes:
                parts += self._changes_of(commit)
                continue
            if commit.removes_data:
                if self.skip_changes:
                    continue
                raise DeltaSourceError(
                    f"{self.path}: version {version} removes or rewrites data (a DELETE, UPDATE or MERGE); this "
                    "source reads appends only. Set the source option skipChangeCommits to true to skip such "
                    "versions, or restart the stream after that version (startingVersion) with a new checkpoint")
            parts += [InputPartition((version, add["path"], add.get("partitionValues") or {}))
                      for add in commit.files]
        return parts

    def _changes_of(self, commit: VersionFiles) -> list[InputPartition]:
        """The partition that reads one version's changes on an executor; none for a version without any (a
        property set, a compaction). A version committed while the table did not record its changes fails."""
        if commit.configuration is not None:
            self.records_changes = _change_feed_on(commit.configuration)
        if not (commit.files or commit.removes_data or commit.has_change_files):
            return []
        if not self.records_changes:
            raise DeltaSourceError(
                f"{self.path}: version {commit.version} was committed while the table did not record its changes "
                "(delta.enableChangeDataFeed), so it has no change data to read; start the stream after it "
                "(startingVersion) with a new checkpoint")
        return [InputPartition((commit.version, None, {}))]

    def _check_schema(self, commit: VersionFiles) -> None:
        """Refuse a version whose schema the query's cannot read: one with a column the query's schema lacks or
        types otherwise (the table dropped, renamed or retyped it later, or changed after the query started)."""
        from pyspark.sql.types import StructType

        if commit.schema_string is None or commit.schema_string == self.schema_string:
            return
        ours = {column.name: column.dataType for column in self.schema.fields}
        for column in StructType.fromJson(json.loads(commit.schema_string)).fields:
            if _without_nullability(ours.get(column.name)) != _without_nullability(column.dataType):
                now = ours[column.name].simpleString() if column.name in ours else "no such column"
                raise DeltaSourceError(
                    f"{self.path}: version {commit.version} has the column {column.name!r} as "
                    f"{column.dataType.simpleString()}, and this run reads the table's schema as it started ({now}); "
                    "a run reads additive schema changes only. If the table changed after this run started, the "
                    "next run reads it; otherwise restart the stream after that version (startingVersion) with a "
                    "new checkpoint")
        self.schema_string = commit.schema_string

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        version, relative, partition_values = partition.value
        target = to_arrow_schema(self.schema, timezone="UTC")
        if relative is None:
            yield from _version_changes(self.path, version, target)
            return
        data_file = _data_file(self.path, unquote(relative))
        # A file written before the table gained a column has none: it reads as NULL.
        present = set(data_file.schema_arrow.names)
        table = data_file.read(columns=[name for name in target.names
                                        if name not in partition_values and name in present])
        for name in target.names:
            if name in partition_values:
                column = pa.array([partition_values[name]] * table.num_rows, pa.string())
            elif name not in present:
                column = pa.nulls(table.num_rows, target.field(name).type)
            else:
                continue
            table = table.append_column(name, column.cast(target.field(name).type))
        yield from table.select(target.names).cast(target).to_batches()

    def commit(self, end: dict[str, int]) -> None:
        pass


def read_limit(max_files: int | None, max_bytes: int | None) -> ReadLimit:
    """A source's read limit from its ``maxFilesPerTrigger`` / ``maxBytesPerTrigger`` (files first, as Spark's)."""
    if max_files is not None:
        return ReadMaxFiles(max_files)
    if max_bytes is not None:
        return ReadMaxBytes(max_bytes)
    return ReadAllAvailable()


def reads_changes(options: dict[str, str]) -> bool:
    """Whether the reader's (lower-cased) options ask for the change data feed."""
    return options.get("readchangefeed", "false").lower() == "true"


def change_columns() -> list[StructField]:
    """The columns a change feed read adds to the table's (delta-spark's types)."""
    from pyspark.sql.types import LongType, StringType, StructField, TimestampType

    return [StructField("_change_type", StringType()), StructField("_commit_version", LongType()),
            StructField("_commit_timestamp", TimestampType())]


def _version_changes(table: str, version: int, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    """One version's changes from delta-rs's change data feed, without the updates' old rows, in ``target``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from sluice.storage.delta import open_table

    changes = pa.table(open_table(table).load_cdf(starting_version=version, ending_version=version))
    # In the target's types first: delta-rs gives strings as string_view, which Arrow cannot filter yet.
    columns = [changes.column(field.name).cast(field.type) if field.name in changes.column_names
               else pa.nulls(changes.num_rows, field.type) for field in target]
    typed = pa.Table.from_arrays(columns, schema=target)
    yield from typed.filter(pc.not_equal(typed.column("_change_type"), "update_preimage")).to_batches()


def _change_feed_on(configuration: dict[str, str]) -> bool:
    return str(configuration.get("delta.enableChangeDataFeed", "false")).lower() == "true"


def _records_changes_at(table: str, version: int) -> bool:
    """Whether the table recorded its changes at ``version``; False when its log no longer reaches that far back
    (the versions after carry their own properties when they change them)."""
    from deltalake import DeltaTable

    try:
        return _change_feed_on(DeltaTable(table, version=version).metadata().configuration)
    except Exception:  # cleaned up past it
        return False


def _data_file(table: str, path: str) -> Any:
    """A data file of the table (its path relative to the table, or absolute): opened in place on a disk, read whole
    from a store."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = path if "://" in path or os.path.isabs(path) else f"{table.rstrip('/')}/{path}"
    if is_local(where):
        return pq.ParquetFile(where.removeprefix("file://"))
    parent, _, name = where.rpartition("/")
    return pq.ParquetFile(pa.BufferReader(folder(parent).read_bytes(name)))


def _schema_at(table: str, version: int) -> str | None:
    """The table's schema (Delta's JSON) at ``version``; None when its log no longer reaches that far back."""
    from deltalake import DeltaTable

    try:
        snapshot = DeltaTable(table, version=version)
    except Exception:  # cleaned up past it: the versions the run reads carry their own metaData or none changed
        return None
    _refuse_column_mapping(table, version, snapshot.metadata().configuration)
    return str(snapshot.schema().to_json())


def _without_nullability(data_type: Any) -> Any:
    """A Spark type with every nested field nullable and no metadata: what two schemas must share for one to
    read the other's files."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(data_type, StructType):
        return StructType([StructField(field.name, _without_nullability(field.dataType)) for field in data_type])
    if isinstance(data_type, ArrayType):
        return ArrayType(_without_nullability(data_type.elementType))
    if isinstance(data_type, MapType):
        return MapType(_without_nullability(data_type.keyType), _without_nullability(data_type.valueType))
    return data_type
