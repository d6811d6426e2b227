"""Iceberg tables through pyiceberg: no JVM, usable from Airflow workers, the runner's driver and tests.

A table lives in an Iceberg catalog. Phase 1 knows one: the default SQL catalog, SQLite at
``<lake root>/iceberg/catalog.db`` with its warehouse (data and metadata files) at ``<lake root>/iceberg/warehouse``,
created on first use. Each batch commit is one snapshot whose summary carries Sluice's keys (``sluice.queryId``,
``sluice.batchId``, ... as in a Delta commit's info): the exactly-once guard reads them back from the current
snapshot's ancestors, so a snapshot rolled back is no longer held.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from sluice.constants import CommitInfo
from sluice.errors import SluiceError
from sluice.model.predicates import RowFilter
from sluice.paths import is_absolute
from sluice.storage.tableformat import TableCommit, TableFormat

# The default catalog's folder under the lake root, its SQLite file and its warehouse.
CATALOG_FOLDER = "iceberg"
CATALOG_NAME = "sluice"
# The table's sequence value of a key, beside a batch's rows while a merge compares them.
_HELD = "_sluice_held_sequence"
log = logging.getLogger(__name__)


def default_catalog_properties(lake_root: str) -> dict[str, str]:
    """The default SQL catalog's pyiceberg properties: SQLite and the warehouse under a local lake root. A lake root
    on an object store needs a catalog of its own (a REST or PostgreSQL catalog through a connection)."""
    if "://" in lake_root and not lake_root.startswith("file://"):
        raise SluiceError(f"the default Iceberg catalog is a SQLite file under a local lake root, and the lake root "
                          f"is {lake_root}; an Iceberg table on an object store needs a catalog of its own: "
                          "catalog: <an Airflow connection> (PostgreSQL or REST; Iceberg guide)")
    root = Path(lake_root.removeprefix("file://"))
    if not is_absolute(str(root)):
        root = root.absolute()
    folder = root / CATALOG_FOLDER
    return {"uri": f"sqlite:///{folder / 'catalog.db'}", "warehouse": (folder / "warehouse").as_uri()}


def open_catalog(properties: dict[str, str]) -> Any:
    """A pyiceberg catalog: a REST catalog (``type: rest``), else a SQL catalog (its tables created on first use),
    its local folders made."""
    from pyiceberg.catalog.sql import SqlCatalog

    if properties.get("type") == "rest":
        from pyiceberg.catalog.rest import RestCatalog

        return RestCatalog(CATALOG_NAME, **properties)
    uri = properties["uri"]
    if uri.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(uri.removeprefix("sqlite:///")), exist_ok=True)
    return SqlCatalog(CATALOG_NAME, **{key: value for key, value in properties.items() if key != "type"})


def _summary(snapshot: Any) -> dict[str, str]:
    return dict(snapshot.summary.additional_properties) if snapshot.summary is not None else {}


class IcebergTableFormat(TableFormat):
    """The Iceberg table ``identifier`` (``namespace.table``) of a catalog given by its pyiceberg properties."""

    format = "iceberg"

    def __init__(self, identifier: str, catalog: dict[str, str]) -> None:
        self.identifier = identifier
        self.catalog_properties = catalog
        self._catalog: Any = None

    @property
    def name(self) -> str:
        return f"Iceberg table {self.identifier}"

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            self._catalog = open_catalog(self.catalog_properties)
        return self._catalog

    def table(self) -> Any:
        """The pyiceberg table, loaded now (its current metadata)."""
        return self.catalog.load_table(self.identifier)

    def exists(self) -> bool:
        return bool(self.catalog.table_exists(self.identifier))

    def ensure(self, schema: Any, partition_by: Iterable[str] | None = None, *, description: str = "") -> bool:
        """Create the table (and its namespace) with ``schema``, every column optional (Spark's nullability of a
        computed column changes with the plan: a required column would refuse a later run's rows), partitioned by
        ``partition_by`` (Iceberg transforms, :func:`sluice.storage.iceberg_files.parse_partition`); an existing
        table gains the columns it lacks (optional too), a column of another type is refused (pyiceberg's own
        message, with the table named), and its partition spec becomes ``partition_by`` when that is given and
        differs (:meth:`_evolve_spec`): an empty ``partition_by`` unpartitions it, None keeps its spec."""
        import pyarrow as pa

        from sluice.storage.iceberg_files import parse_partition

        fields = [parse_partition(text) for text in partition_by or ()]
        namespace = self.identifier.rsplit(".", 1)[0]
        self.catalog.create_namespace_if_not_exists(namespace)
        optional = pa.schema([field.with_nullable(True) for field in schema])
        if not self.exists():
            properties = {"comment": description} if description else {}
            if not fields:
                self.catalog.create_table(self.identifier, schema=optional, properties=properties)
                return True
            with (self.catalog.create_table_transaction(self.identifier, schema=optional,
                                                        properties=properties) as transaction,
                  transaction.update_spec() as spec):
                for field in fields:
                    self._check_partition(field, transaction.table_metadata.schema())
                    spec.add_field(field.column, field.iceberg(), field.field_name)
            return True
        table = self.table()
        have = set(table.schema().as_arrow().names)
        if any(field.name not in have for field in schema):
            try:
                with table.update_schema() as update:
                    update.union_by_name(optional)
            except Exception as error:
                raise SluiceError(f"{self.name} cannot take the stream's columns: {error}") from error
        if partition_by is not None and sorted(field.text for field in fields) != sorted(self.partitioning):
            self._evolve_spec(fields)
        return False

    def _evolve_spec(self, fields: list[Any]) -> None:
        """Make ``fields`` the table's partition spec, in one metadata commit: the fields it no longer declares are
        removed, the new ones added (a field's name says its transform: ``ts_day``, ``id_bucket_16``). Iceberg's
        spec evolution: the data files written so far keep the spec they were written in, and every later file
        (appends, a merge's or a replace's rewrites, a compaction's) is written in the new one."""
        table = self.table()
        wanted = {field.field_name: field for field in fields}
        held = {field.name for field in table.spec().fields}
        for field in fields:
            self._check_partition(field, table.schema())
        with table.update_spec() as update:
            for name in held - set(wanted):
                update.remove_field(name)
            for name, field in wanted.items():
                if name not in held:
                    update.add_field(field.column, field.iceberg(), name)
        log.info("%s: partition spec is now %s", self.name,
                 ", ".join(field.text for field in fields) or "unpartitioned")

    def _check_partition(self, field: Any, schema: Any) -> None:
        """Refuse a transform of a column the rows lack or of a type it does not take (``hour`` of a date)."""
        try:
            source = schema.find_field(field.column)
        except ValueError:
            raise SluiceError(f"sink.partition_by: {field.text} names column {field.column!r}, which the stream "
                              f"does not produce; output columns: {', '.join(schema.column_names)}") from None
        if not field.iceberg().can_transform(source.field_type):
            raise SluiceError(f"sink.partition_by: {field.text}: Iceberg's {field.transform} transform does not take "
                              f"column {field.column!r} of type {source.field_type}")

    @property
    def partitioning(self) -> list[str]:
        """The table's partition spec, as a sink declares it (``day(ts)``, ``bucket(16, id)``)."""
        table = self.table()
        schema = table.schema()
        texts = []
        for field in table.spec().fields:
            column = schema.find_column_name(field.source_id)
            width = getattr(field.transform, "num_buckets", getattr(field.transform, "width", None))
            name = str(field.transform).split("[")[0]
            texts.append(column if name == "identity" else
                         f"{name}({width}, {column})" if width is not None else f"{name}({column})")
        return texts

    def schema(self) -> Any:
        return self.table().schema().as_arrow()

    def _ancestors(self) -> Iterator[Any]:
        """The current snapshot and its ancestors, newest first."""
        from pyiceberg.table.snapshots import ancestors_of

        table = self.table()
        yield from ancestors_of(table.current_snapshot(), table.metadata)

    def recorded_batch(self, query_id: str) -> int | None:
        """A query commits its batches in order: the newest snapshot of the query holds its newest batch."""
        if not self.exists():
            return None
        for snapshot in self._ancestors():
            summary = _summary(snapshot)
            if summary.get(CommitInfo.QUERY) == query_id and CommitInfo.BATCH in summary:
                return int(summary[CommitInfo.BATCH])
        return None

    def snapshot_id(self) -> int | None:
        if not self.exists():
            return None
        current = self.table().current_snapshot()
        return None if current is None else int(current.snapshot_id)

    def commits(self, *, limit: int | None = 50) -> list[TableCommit]:
        if not self.exists():
            return []
        commits: list[TableCommit] = []
        for snapshot in self._ancestors():
            if limit is not None and len(commits) >= limit:
                break
            summary = _summary(snapshot)
            batch = summary.get(CommitInfo.BATCH)
            rows = summary.get(CommitInfo.RECORDS)
            operation = snapshot.summary.operation.value if snapshot.summary is not None else ""
            commits.append(TableCommit(int(snapshot.sequence_number or 0), snapshot.timestamp_ms / 1000, operation,
                                       summary.get(CommitInfo.QUERY), None if batch is None else int(batch),
                                       None if rows is None else int(rows), snapshot.snapshot_id,
                                       summary.get(CommitInfo.STREAM)))
        return commits[::-1]

    def newest_value(self, column: str) -> Any:
        """From the current snapshot's data files' upper bounds (``readable_metrics``)."""
        import pyarrow.compute as pc

        if not self.exists():
            return None
        files = self.table().inspect.data_files()
        if files.num_rows == 0 or "readable_metrics" not in files.column_names:
            return None
        metrics = files.column("readable_metrics").combine_chunks()
        if column not in [metrics.type.field(index).name for index in range(metrics.type.num_fields)]:
            return None
        return pc.max(metrics.field(column).field("upper_bound")).as_py()

    def _commit(self, rows: Any, *, overwrite: bool, properties: dict[str, Any]) -> None:
        """On the driver: the rows written as data files by Sluice's writer (partitioned by the table's spec), then
        one append, or with ``overwrite`` a delete of every file and an append in one transaction."""
        from pyiceberg.expressions import AlwaysTrue

        from sluice.storage.iceberg_files import write_data_files

        summary = {key: str(value) for key, value in properties.items()}
        table = self.table()
        files = write_data_files(table.metadata, table.io, rows)
        with table.transaction() as transaction:
            if overwrite and table.current_snapshot() is not None:
                transaction.delete(AlwaysTrue(), snapshot_properties=summary)
            with transaction.update_snapshot(snapshot_properties=summary).fast_append() as append:
                for data_file in files:
                    append.append_data_file(data_file)

    def writer_state(self) -> tuple[Any, dict[str, str]]:
        """What an executor needs to write the table's data files (:func:`sluice.storage.iceberg_files.
        write_data_files`): its current metadata and the catalog's properties for its ``FileIO``."""
        return self.table().metadata, dict(self.catalog_properties)

    def append_files(self, files: list[Any], *, query_id: str, batch_id: int, metadata: dict[str, Any]) -> bool:
        """Commit data files the executors wrote as one append snapshot carrying the batch's properties, once: False
        when the table already holds the batch (a replay), and then the files are removed, not committed. No
        snapshot for no files."""
        from sluice.storage.iceberg_files import delete_files
        from sluice.storage.tableformat import batch_properties

        table = self.table()
        if self.holds_batch(query_id, batch_id):
            log.warning("Batch %s of %s is already in %s; skipping its replay", batch_id, query_id, self.name)
            delete_files(table.io, files)
            return False
        if not files:
            return True
        rows = sum(int(data_file.record_count) for data_file in files)
        summary = {key: str(value) for key, value in
                   batch_properties(metadata, query_id=query_id, batch_id=batch_id, rows=rows).items()}
        with table.transaction() as transaction, \
                transaction.update_snapshot(snapshot_properties=summary).fast_append() as append:
            for data_file in files:
                append.append_data_file(data_file)
        return True

    def replace_batch(self, rows: Any, row_filter: Any, *, query_id: str, batch_id: int,
                      metadata: dict[str, Any]) -> bool:
        """Overwrite by filter, once: the table's rows that match ``row_filter`` (a backfill's
        :class:`~sluice.model.predicates.RowFilter`, a pyiceberg expression, or its string form such as
        ``_source_file IN ('a.json')``) are replaced by ``rows`` in one overwrite snapshot carrying the batch's
        properties (a backfill's ``replace``). A file all of whose rows match is dropped, a file with some is
        rewritten without them (by Sluice's writer, in the table's partition spec), and the new rows are written
        beside. False, and nothing written, when the table already holds the batch."""
        import pyarrow.compute as pc
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.expressions.visitors import bind
        from pyiceberg.io.pyarrow import ArrowScan, _expression_to_complementary_pyarrow
        from pyiceberg.table import _parse_row_filter

        from sluice.storage.iceberg_files import write_data_files
        from sluice.storage.tableformat import batch_properties

        if self.holds_batch(query_id, batch_id):
            log.warning("Batch %s of %s is already in %s; skipping its replay", batch_id, query_id, self.name)
            return False
        table = self.table()
        schema = table.metadata.schema()
        if isinstance(row_filter, RowFilter) and row_filter.offsets:  # matched exactly here, planned by prefix
            expression = iceberg_filter(row_filter)
            kept_of: Any = lambda held: held.filter(pc.invert(matching(row_filter, held)))  # noqa: E731
        else:
            row_filter = iceberg_filter(row_filter) if isinstance(row_filter, RowFilter) else row_filter
            expression = _parse_row_filter(row_filter) if isinstance(row_filter, str) else row_filter
            keep = _expression_to_complementary_pyarrow(bind(schema, expression, case_sensitive=True), schema)
            kept_of = lambda held: held.filter(keep)  # noqa: E731
        summary = {key: str(value) for key, value in
                   batch_properties(metadata, query_id=query_id, batch_id=batch_id, rows=rows.num_rows).items()}
        with table.transaction() as transaction, \
                transaction.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
            for task in table.scan(row_filter=expression).plan_files():
                held = ArrowScan(table_metadata=table.metadata, io=table.io, projected_schema=schema,
                                 row_filter=AlwaysTrue()).to_table(tasks=[task])
                kept = kept_of(held)
                if kept.num_rows == held.num_rows:
                    continue
                overwrite.delete_data_file(task.file)
                for data_file in write_data_files(table.metadata, table.io, kept):
                    overwrite.append_data_file(data_file)
            for data_file in write_data_files(table.metadata, table.io, rows):
                overwrite.append_data_file(data_file)
        return True

    def distinct(self, column: str, where: RowFilter | None = None) -> set[str]:
        """The column's distinct values (as text) in the rows ``where`` selects (a backfill's plan); none without a
        table or the column."""
        if not self.exists() or column not in self.schema().names:
            return set()
        rows = self._rows(where, (column,)) if where else self.table().scan(selected_fields=(column,)).to_arrow()
        return {str(value) for value in rows.column(column).to_pylist() if value is not None}

    def count(self, where: RowFilter) -> int:
        """The rows ``where`` selects (a backfill's rows to replace); 0 without a table."""
        if not self.exists():
            return 0
        column = where.file_column or where.time_column  # a scan of no column reads no row
        assert column is not None
        return int(self._rows(where, (column,)).num_rows)

    def _rows(self, where: RowFilter, columns: tuple[str, ...]) -> Any:
        """The ``columns`` of the rows ``where`` selects: a scan by its pyiceberg expression, then, for Kafka offset
        ranges (planned by their lineage's prefix), the exact match."""
        present = set(self.schema().names)
        needed = tuple(dict.fromkeys(c for c in (*columns, where.file_column, where.time_column)
                                     if c is not None and c in present))
        rows = self.table().scan(row_filter=iceberg_filter(where), selected_fields=needed).to_arrow()
        return rows.filter(matching(where, rows)).select(list(columns)) if where.offsets else rows.select(
            list(columns))

    def upsert_batch(self, rows: Any, keys: list[str], *, query_id: str, batch_id: int, metadata: dict[str, Any],
                     sequence_by: str | None = None) -> bool:
        """Merge one batch's rows by ``keys`` (one row per key: the caller picks the newest), once: matched rows
        are replaced, new keys inserted; with ``sequence_by``, a row older than the one the table holds for its key
        changes nothing (as a Delta merge's). False when the table already holds the batch."""
        from sluice.storage.tableformat import batch_properties, conform

        if self.holds_batch(query_id, batch_id):
            log.warning("Batch %s of %s is already in %s; skipping its replay", batch_id, query_id, self.name)
            return False
        if rows.num_rows == 0:
            return True
        summary = {key: str(value) for key, value in
                   batch_properties(metadata, query_id=query_id, batch_id=batch_id, rows=rows.num_rows).items()}
        data = conform(rows, self.schema())
        if sequence_by is not None:
            data = self._not_older(data, keys, sequence_by)
        table = self.table()
        if not table.spec().is_unpartitioned():
            self._merge_files(table, data, keys, summary)
        elif data.num_rows == 0:  # every row older than the table's: the batch still commits, to be held
            table.append(data, snapshot_properties=summary)
        else:
            table.upsert(data, join_cols=keys, snapshot_properties=summary)
        return True

    @staticmethod
    def _merge_files(table: Any, rows: Any, keys: list[str], summary: dict[str, str]) -> None:
        """A merge into a partitioned table, as one overwrite snapshot: each data file holding one of the rows' keys
        (planned by the keys' values against the files' statistics, whatever partition it is in) is rewritten
        without those rows by Sluice's writer, and the rows are written beside, each in its partition; a key whose
        row moves to another partition leaves its old one. pyiceberg's ``upsert`` would write the partitioned rows
        with its vectorised transforms, which need ``pyiceberg-core``. Keys match by equality (NULL matches
        nothing), as in the unpartitioned merge."""
        import functools

        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyiceberg.expressions
        from pyiceberg.io.pyarrow import ArrowScan

        from sluice.storage.iceberg_files import write_data_files

        schema = table.metadata.schema()
        incoming = rows.select(keys).drop_null()
        # pyiceberg's predicates take a column name (their pydantic fields, which mypy reads, say a term)
        expressions: Any = pyiceberg.expressions
        planned = [expressions.In(key, set(pc.unique(incoming.column(key)).to_pylist())) for key in keys]
        with table.transaction() as transaction, \
                transaction.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
            if incoming.num_rows:
                for task in table.scan(row_filter=functools.reduce(expressions.And, planned)).plan_files():
                    held = ArrowScan(table_metadata=table.metadata, io=table.io, projected_schema=schema,
                                     row_filter=expressions.AlwaysTrue()).to_table(tasks=[task])
                    positions = held.select(keys).append_column("_sluice_row", pa.array(np.arange(held.num_rows)))
                    matched = positions.join(incoming, keys=keys, join_type="left semi").column("_sluice_row")
                    if len(matched) == 0:
                        continue
                    overwrite.delete_data_file(task.file)
                    kept = pc.invert(pc.is_in(pa.array(np.arange(held.num_rows)), value_set=matched.combine_chunks()))
                    for data_file in write_data_files(table.metadata, table.io, held.filter(kept)):
                        overwrite.append_data_file(data_file)
            for data_file in write_data_files(table.metadata, table.io, rows):
                overwrite.append_data_file(data_file)

    def _not_older(self, rows: Any, keys: list[str], sequence_by: str) -> Any:
        """The rows whose ``sequence_by`` is at least the table's for their key (or whose key is new). Keys match
        by equality: a NULL key matches nothing (phase 1; Delta's merge matches NULL keys too)."""
        import pyarrow.compute as pc

        held = self.table().scan(selected_fields=(*keys, sequence_by)).to_arrow().select([*keys, sequence_by])
        if held.num_rows == 0:
            return rows
        held = held.rename_columns([*keys, _HELD])
        joined = rows.join(held, keys=keys, join_type="left outer")
        keep = pc.fill_null(pc.or_kleene(pc.is_null(joined.column(_HELD)),
                                         pc.greater_equal(joined.column(sequence_by), joined.column(_HELD))), False)
        return joined.filter(keep).select(rows.column_names).cast(rows.schema)


def iceberg_filter(row_filter: RowFilter) -> Any:
    """A backfill's row filter (:class:`sluice.model.predicates.RowFilter`: files, a time range, Kafka offset
    ranges) as a pyiceberg expression, for scans and :meth:`IcebergTableFormat.replace_batch`. Exact for files and a
    time range; for offset ranges a superset, the lineage's ``kafka://<topic>/<partition>/`` prefixes (pyiceberg has
    no string length to compare offsets as numbers by), which :func:`matching` narrows to the offsets."""
    import functools

    import pyiceberg.expressions

    # pyiceberg's predicates take a column name (their pydantic fields, which mypy reads, say a term)
    expressions: Any = pyiceberg.expressions
    AlwaysTrue, And = expressions.AlwaysTrue, expressions.And
    expression: Any = AlwaysTrue()
    if row_filter.time_column is not None and row_filter.start is not None and row_filter.end is not None:
        expression = And(expressions.GreaterThanOrEqual(row_filter.time_column, row_filter.start.isoformat()),
                         expressions.LessThan(row_filter.time_column, row_filter.end.isoformat()))
    if row_filter.file_column is not None:
        files = (functools.reduce(expressions.Or, [expressions.StartsWith(row_filter.file_column, prefix)
                                                   for prefix, _, _ in _offset_ranges(row_filter)])
                 if row_filter.offsets else expressions.In(row_filter.file_column, set(row_filter.files)))
        expression = files if isinstance(expression, AlwaysTrue) else And(expression, files)
    return expression


def _offset_ranges(row_filter: RowFilter) -> list[tuple[str, int, int]]:
    """Each Kafka offset range as its lineage prefix ``kafka://<topic>/<partition>/`` and its first and last offset."""
    return [(f"kafka://{topic}/{partition}/", int(first), int(last))
            for topic, partition, first, last in row_filter.offsets]


def matching(row_filter: RowFilter, rows: Any) -> Any:
    """Which of the Arrow ``rows`` the filter selects, exactly: the lineage of one of its Kafka offset ranges (the
    prefix compared whole, the offset as a number), else one of its files, and its time range. NULL selects
    nothing."""
    import pyarrow as pa
    import pyarrow.compute as pc

    selected = pa.array([True] * rows.num_rows, pa.bool_())
    if row_filter.file_column is not None:
        lineage = rows.column(row_filter.file_column)
        if row_filter.offsets:
            in_ranges = pa.array([False] * rows.num_rows, pa.bool_())
            for prefix, first, last in _offset_ranges(row_filter):
                ours = pc.fill_null(pc.starts_with(lineage, prefix), False)
                tail = pc.utf8_slice_codeunits(lineage, len(prefix))
                digits = pc.fill_null(pc.and_kleene(ours, pc.match_substring_regex(tail, r"^[0-9]{1,18}$")), False)
                offset = pc.cast(pc.if_else(digits, tail, "-1"), pa.int64())
                in_ranges = pc.or_(in_ranges, pc.and_(digits, pc.and_(pc.greater_equal(offset, first),
                                                                      pc.less_equal(offset, last))))
            selected = in_ranges
        else:
            selected = pc.fill_null(pc.is_in(lineage, value_set=pa.array(list(row_filter.files), lineage.type)),
                                    False)
    if row_filter.time_column is not None and row_filter.start is not None and row_filter.end is not None:
        times = rows.column(row_filter.time_column)
        start, end = (pa.scalar(moment, times.type) for moment in (row_filter.start, row_filter.end))
        selected = pc.and_(selected, pc.fill_null(pc.and_(pc.greater_equal(times, start), pc.less(times, end)),
                                                  False))
    return pc.fill_null(selected, False)


# Iceberg's own table property for the age of the snapshots to keep, read by maintenance.
MAX_SNAPSHOT_AGE = "history.expire.max-snapshot-age-ms"


def expire_snapshots(table: IcebergTableFormat, *, older_than: float, query_id: str | None, last_batch: int | None,
                     read_up_to: Iterable[int] = (), dry_run: bool = False) -> list[int]:
    """Expire the snapshots committed before ``older_than`` (epoch seconds), except what a reader and the
    exactly-once guard need: the current snapshot, every snapshot from the oldest one that holds the
    checkpoint's last recorded batch (``last_batch`` of ``query_id``) on, and every snapshot from the oldest one a
    downstream Iceberg-source stream has read up to (``read_up_to``, its checkpoint's snapshot ids; -1 when it has
    read none, and then nothing is expired) on: that stream finds its place by that snapshot, and reads the ones
    after it. pyiceberg 0.12 only drops them from the metadata; their data files no other snapshot keeps are then
    orphans (:func:`remove_orphan_files`). The ids expired (to be expired, under ``dry_run``)."""
    iceberg = table.table()
    snapshots = sorted(iceberg.snapshots(), key=lambda snapshot: snapshot.timestamp_ms)
    current = iceberg.current_snapshot()
    keep_from = next((snapshot.timestamp_ms for snapshot in snapshots
                      if query_id is not None and last_batch is not None
                      and _summary(snapshot).get(CommitInfo.QUERY) == query_id
                      and int(_summary(snapshot).get(CommitInfo.BATCH, -1)) >= last_batch), None)
    cutoff = older_than * 1000 if keep_from is None else min(older_than * 1000, keep_from)
    read = set(read_up_to)
    if -1 in read:
        cutoff = -1
    cutoff = min([cutoff, *(snapshot.timestamp_ms for snapshot in snapshots if snapshot.snapshot_id in read)])
    expired = [snapshot.snapshot_id for snapshot in snapshots
               if snapshot.timestamp_ms < cutoff and (current is None or snapshot.snapshot_id != current.snapshot_id)]
    if expired and not dry_run:
        iceberg.maintenance.expire_snapshots().by_ids(expired).commit()
    return expired


def remove_orphan_files(table: IcebergTableFormat, *, older_than: float, dry_run: bool = False) -> list[str]:
    """Delete the data files under the table's ``data/`` folder that no snapshot it keeps references and that are
    older than ``older_than`` (epoch seconds): a file younger than that may belong to a commit in flight. A local
    warehouse only (the default catalog's); pyiceberg 0.12 has no orphan removal of its own."""
    iceberg = table.table()
    location = iceberg.metadata.location
    if not location.startswith("file:") and "://" in location:
        raise SluiceError(f"{table.name}: orphan removal lists a local warehouse only, not {location}")
    folder = Path(location.removeprefix("file://").removeprefix("file:")) / "data"
    referenced = {path.removeprefix("file://").removeprefix("file:")
                  for path in iceberg.inspect.all_files().column("file_path").to_pylist()}
    orphans = [str(path) for path in folder.rglob("*") if path.is_file() and str(path) not in referenced
               and path.stat().st_mtime < older_than]
    if not dry_run:
        for path in orphans:
            os.remove(path)
    return sorted(orphans)
