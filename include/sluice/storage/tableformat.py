"""One seam for the table format: what the writers and the exactly-once protocol need of one table, whatever format
holds it (Delta here, Iceberg in :mod:`sluice.storage.iceberg`).

A :class:`TableFormat` is one table in one format. It creates the table (or checks an existing one), tells the schema,
lists its commits (Delta versions, Iceberg snapshots) with the query and batch each carries, answers the exactly-once
question (:meth:`TableFormat.holds_batch`) and commits an append or an overwrite that carries its transaction (query
id, batch id), skipping a batch it already holds. A third format adds a module with one subclass; the writers that go
through this seam do not change.

The writers' appends go through it (the rs Delta engine's driver-side append, the Iceberg sink), and so do the
health gate's reads of a stream's tables, the lag's and the Streams page's view of the sink's newest commit
(:func:`sluice.kinds.table_formats`). Repair and Delta maintenance still call :mod:`sluice.storage.delta` directly.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from sluice.constants import CommitInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableCommit:
    """One commit of a table: a Delta version or an Iceberg snapshot, oldest first in :meth:`TableFormat.commits`.

    ``version`` orders the commits (Delta's version, Iceberg's sequence number); ``snapshot_id`` is Iceberg's id of
    it (None on Delta). ``query_id`` and ``batch_id`` are the transaction of a batch commit, None on any other."""

    version: int
    committed_at: float
    operation: str
    query_id: str | None = None
    batch_id: int | None = None
    rows: int | None = None
    snapshot_id: int | None = None
    stream: str | None = None


def conform(rows: Any, schema: Any) -> Any:
    """An Arrow table's columns in the order and the types of the table's schema (a column added to an existing
    table comes last in it); a column of the table the rows lack (one of Sluice's own the stream no longer writes,
    see :func:`sluice.storage.delta.ensure_table`) is NULL."""
    import pyarrow as pa

    columns = [rows.column(field.name) if field.name in rows.column_names else pa.nulls(rows.num_rows, field.type)
               for field in schema]
    return pa.Table.from_arrays(columns, names=schema.names).cast(schema)


def batch_properties(metadata: Mapping[str, Any], *, query_id: str, batch_id: int, rows: int) -> dict[str, Any]:
    """The properties a batch commit carries: the writer's metadata (:func:`sluice.storage.delta.commit_metadata`)
    and the transaction, under the keys health, repair and the run summary read back."""
    return {**metadata, CommitInfo.QUERY: query_id, CommitInfo.BATCH: batch_id, CommitInfo.RECORDS: rows}


class TableFormat(ABC):
    """One table, in one table format."""

    format: ClassVar[str]

    @property
    @abstractmethod
    def name(self) -> str:
        """The table as a log line names it (a path, an identifier)."""

    @abstractmethod
    def exists(self) -> bool:
        """Whether the table exists."""

    @abstractmethod
    def ensure(self, schema: Any, partition_by: Iterable[str] = (), *, description: str = "") -> bool:
        """Create the table with ``schema`` (Arrow) unless it exists; an existing one must take the rows (its schema
        checked, missing nullable columns added, as the format allows). True when created."""

    @abstractmethod
    def schema(self) -> Any:
        """The table's current schema, as Arrow."""

    @abstractmethod
    def recorded_batch(self, query_id: str) -> int | None:
        """The newest batch of query ``query_id`` the table holds; None when it holds none (or does not exist)."""

    @abstractmethod
    def commits(self, *, limit: int | None = 50) -> list[TableCommit]:
        """The table's newest ``limit`` commits (all with None), oldest first; empty when there is no table."""

    @abstractmethod
    def _commit(self, rows: Any, *, overwrite: bool, properties: dict[str, Any]) -> None:
        """Commit Arrow ``rows`` (in the table's schema) as one append, or as one overwrite of the whole table,
        carrying ``properties`` (see :func:`batch_properties`)."""

    def holds_batch(self, query_id: str, batch_id: int) -> bool:
        """The exactly-once guard: True when the table already holds batch ``batch_id`` of query ``query_id`` (or a
        later one), so that a replay of it must write nothing."""
        recorded = self.recorded_batch(query_id)
        return recorded is not None and recorded >= batch_id

    def batches(self, query_id: str, *, limit: int | None = 50) -> list[int]:
        """The batch ids of query ``query_id`` among the newest ``limit`` commits, oldest first, each once (an
        Iceberg upsert commits its batch as two snapshots, a delete and an append, both carrying the batch)."""
        return list(dict.fromkeys(commit.batch_id for commit in self.commits(limit=limit)
                                  if commit.query_id == query_id and commit.batch_id is not None))

    def snapshot_id(self) -> int | None:
        """The id of the table's current snapshot, for a format whose commits have one (Iceberg); None otherwise,
        and when there is no table or no snapshot yet."""
        return None

    def newest_value(self, column: str) -> Any:
        """The largest value of ``column`` in the table by its files' statistics alone (no data read), as Python;
        None when there is no table, no file, or no statistic for the column."""
        return None

    def distinct(self, column: str, where: Any = None) -> set[str]:
        """The column's distinct values (as text) in the rows ``where`` (a backfill's
        :class:`~sluice.model.predicates.RowFilter`) selects: a backfill's plan of an Iceberg sink (a Delta sink's
        plan queries its table with delta-rs SQL)."""
        raise NotImplementedError(f"{self.name}: a backfill plan reads this table format through SQL")

    def count(self, where: Any) -> int:
        """The rows ``where`` selects (see :meth:`distinct`)."""
        raise NotImplementedError(f"{self.name}: a backfill plan reads this table format through SQL")

    def query_ids(self, stream: str, *, limit: int | None = 200) -> list[str]:
        """The query ids that committed batches of ``stream`` to the table, newest first (from the newest ``limit``
        commits): the health gate's test of a checkpoint the table does not know."""
        return list(dict.fromkeys(commit.query_id for commit in reversed(self.commits(limit=limit))
                                  if commit.stream == stream and commit.query_id is not None))

    def version_holding(self, query_id: str, batch_id: int) -> int | None:
        """The newest commit (Delta's version, Iceberg's snapshot id) at which the table held no batch of query
        ``query_id`` past ``batch_id``: where to roll a table back that is ahead of its checkpoint. None when every
        commit the table keeps is past it."""
        held, found = -1, None
        for commit in self.commits(limit=None):
            if commit.query_id == query_id and commit.batch_id is not None:
                held = commit.batch_id
            if held <= batch_id:
                found = commit.snapshot_id if commit.snapshot_id is not None else commit.version
        return found

    def commit_batch(self, rows: Any, *, query_id: str, batch_id: int, metadata: Mapping[str, Any],
                     overwrite: bool = False) -> bool:
        """Commit one batch's Arrow ``rows`` once: an append (no commit for no rows), or with ``overwrite`` a
        rewrite of the whole table. False when the table already holds the batch (a replay): nothing is written."""
        if self.holds_batch(query_id, batch_id):
            log.warning("Batch %s of %s is already in %s; skipping its replay", batch_id, query_id, self.name)
            return False
        if rows.num_rows == 0 and not overwrite:
            return True
        self._commit(conform(rows, self.schema()), overwrite=overwrite,
                     properties=batch_properties(metadata, query_id=query_id, batch_id=batch_id, rows=rows.num_rows))
        return True


class DeltaTableFormat(TableFormat):
    """A Delta table at ``path``, through delta-rs and :mod:`sluice.storage.delta` (whose ``holds_batch`` reads
    Delta's own transaction ids, ``txn`` actions, rather than the commit infos)."""

    format = "delta"

    def __init__(self, path: str, *, partition_by: Iterable[str] = (), table_name: str | None = None,
                 loaded: Any = None) -> None:
        """``loaded``: the delta-rs table at ``path`` as this run loaded it before (when it created the table), to be
        brought up to date on first use instead of loaded again."""
        self.path = path
        self.partition_by = tuple(partition_by)
        self.table_name = table_name or path.rstrip("/").rsplit("/", 1)[-1]
        self._table: Any = None
        self._loaded = loaded

    def _open(self) -> Any:
        """The delta-rs table, current as of this object's first use and kept for its check and commit (as one
        writer's batch is: the commit's conflict check covers what changed since); TableNotFoundError when there is
        none."""
        if self._table is None:
            from sluice.storage.delta import brought_up_to_date, open_table

            self._table = (open_table(self.path) if self._loaded is None
                           else brought_up_to_date(self.path, self._loaded))
        return self._table

    @property
    def name(self) -> str:
        return self.path

    def exists(self) -> bool:
        from sluice.storage.delta import table_version

        return table_version(self.path) is not None

    def ensure(self, schema: Any, partition_by: Iterable[str] = (), *, description: str = "") -> bool:
        from sluice.storage.delta import ensure_table

        self._table = self._loaded = None
        return ensure_table(self.path, schema, partition_by or self.partition_by, name=self.table_name,
                            description=description)

    def schema(self) -> Any:
        import pyarrow as pa

        return pa.schema(self._open().schema().to_arrow())

    def recorded_batch(self, query_id: str) -> int | None:
        from deltalake.exceptions import TableNotFoundError

        from sluice.storage.delta import recorded_batch

        try:
            return recorded_batch(self._open(), query_id)
        except TableNotFoundError:
            return None

    def commits(self, *, limit: int | None = 50) -> list[TableCommit]:
        from deltalake.exceptions import TableNotFoundError

        from sluice.storage.delta import _batch_commit

        try:
            history = self._open().history(limit=limit)
        except TableNotFoundError:
            return []
        commits = []
        for info in reversed(history):
            batch = _batch_commit(info)
            commits.append(TableCommit(int(info["version"]), int(info["timestamp"]) / 1000,
                                       str(info.get("operation", "")), batch.query_id if batch else None,
                                       batch.batch_id if batch else None, batch.rows if batch else None,
                                       stream=batch.stream if batch else None))
        return commits

    def newest_value(self, column: str) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc
        from deltalake.exceptions import TableNotFoundError

        try:
            actions = pa.table(self._open().get_add_actions(flatten=True))
        except TableNotFoundError:
            return None
        if f"max.{column}" not in actions.column_names or actions.num_rows == 0:
            return None
        return pc.max(actions.column(f"max.{column}")).as_py()

    def version_holding(self, query_id: str, batch_id: int) -> int | None:
        """From the transaction timeline, which counts ``repair reset`` commits too; 0 when no version is."""
        from sluice.storage.delta import txn_timeline

        return max((at for at, txn in txn_timeline(self.path, query_id) if txn <= batch_id), default=0)

    def _commit(self, rows: Any, *, overwrite: bool, properties: dict[str, Any]) -> None:
        from deltalake import CommitProperties, Transaction, write_deltalake

        from sluice.storage.delta import commit_hooks

        table = self._open()
        write_deltalake(table, rows, mode="overwrite" if overwrite else "append",
                        partition_by=list(self.partition_by) or None,
                        commit_properties=CommitProperties(
                            custom_metadata=properties,
                            app_transactions=[Transaction(properties[CommitInfo.QUERY],
                                                          int(properties[CommitInfo.BATCH]))]),
                        post_commithook_properties=commit_hooks(table))
