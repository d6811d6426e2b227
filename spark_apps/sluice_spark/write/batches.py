"""One write path for every micro-batch Sluice commits: the stream runner's, the backfill's and the Kafka sink's.

A routed batch carries a route value per row (good rows, dead letters) and, for fan-out tables, a flag column.
:class:`BatchRouter` is the ``foreachBatch`` function of every query that does not take the rs engine's append-only
data source: it selects each :class:`TableTarget`'s rows and hands them to the engine's idempotent writer.

The writers know append, merge (upsert by keys, newest ``sequence_by`` wins), complete (rewrite) and replace (swap
the rows a :class:`~sluice.model.predicates.RowFilter` selects). Each commit carries the batch's transaction identifier
(app id = query id, version = batch id), so a replayed batch is skipped table by table:

- ``jvm``: delta-spark with ``txnAppId``/``txnVersion`` on writes and the same two SQL settings around a MERGE
  (delta-spark's documented idempotent writes); delta-spark itself skips a replay.
- ``rs``: delta-rs with ``app_transactions``, after :func:`sluice.storage.delta.holds_batch`, the one place that decides
  whether a table already holds a batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sluice.constants import (
    ADDED_COLUMN_KEY,
    RESCUED_COLUMN,
    SOURCE_FILE_COLUMN,
    CommitInfo,
    DeltaEngine,
    SinkMode,
)
from sluice.errors import SchemaDriftError
from sluice.model.predicates import DATAFUSION, SPARK_SQL, RowFilter, render
from sluice.model.stream import StreamSpec
from sluice.model.types import quote
from sluice.storage.delta import commit_metadata, holds_batch
from sluice_spark import faults
from sluice_spark.targets import (
    DEAD_LETTER_ROUTE,
    FAILED_COLUMN,
    GOOD_ROUTE,
    NEW_COLUMNS_COLUMN,
    NEW_FIELDS_COLUMN,
    NEW_TYPES_COLUMN,
    TableTarget,
    drift_failure,
    expectation_failure,
    failed_in,
    new_fields_in,
    tally_failures,
)

log = logging.getLogger(__name__)


class DeltaTableWriter(ABC):
    """Writes one batch's rows into one table, once."""

    engine: DeltaEngine

    @abstractmethod
    def write(self, rows: DataFrame, target: TableTarget, *, query_id: str, batch_id: int, metadata: dict[str, Any],
              replace: RowFilter | None = None, staging: Path | None = None,
              added: Mapping[str, str] | None = None) -> bool:
        """Commit ``rows`` to ``target`` as its mode says, or as a replace of the rows ``replace`` selects. False when
        the table already holds this batch (a replay). ``staging``, when given, is a folder on storage the executors
        share, where appended rows are staged as Parquet instead of crossing to the driver. ``added`` are columns of
        ``rows`` (name: Spark SQL type) that the table gains in the same commit, marked as added by this batch
        (:data:`~sluice.constants.ADDED_COLUMN_KEY`)."""


def latest_per_key(rows: DataFrame, keys: Sequence[str], sequence_by: str | None) -> DataFrame:
    """One row per key: the one with the highest ``sequence_by``. A MERGE fails when two source rows match one
    target row, and a batch may carry several versions of a key. Versions with the same sequence are told apart by
    their other columns, so that a replay picks the same one; across batches, the later batch wins a tie."""
    if sequence_by is None:
        return rows  # an aggregate's update output has one row per key already
    others = [F.col(f"`{field.name}`").desc_nulls_last() for field in rows.schema.fields
              if field.name not in (*keys, sequence_by) and _orderable(field.dataType)]
    order = Window.partitionBy(*keys).orderBy(F.col(sequence_by).desc_nulls_last(), *others)
    return rows.withColumn("_sluice_rank", F.row_number().over(order)).where("_sluice_rank = 1").drop("_sluice_rank")


def _orderable(data_type: Any) -> bool:
    """Whether Spark can sort by a column of this type: not by a map or a variant, nor by what holds one."""
    from pyspark.sql.types import ArrayType, MapType, StructType, VariantType

    if isinstance(data_type, MapType | VariantType):
        return False
    if isinstance(data_type, StructType):
        return all(_orderable(field.dataType) for field in data_type.fields)
    if isinstance(data_type, ArrayType):
        return _orderable(data_type.elementType)
    return True


def _merge_condition(keys: Sequence[str], equal_null_safe: str) -> str:
    """Keys match when equal or both NULL (an aggregate's group may be NULL)."""
    # A declared name may hold a backtick (`a``b`): quoted, it stays a name and cannot end the condition's.
    return " AND ".join(f"(t.{quote(key)} {equal_null_safe} s.{quote(key)})" for key in keys)


def _newer(sequence_by: str | None) -> str | None:
    """A matched row is replaced only by a newer or equal version: a late, older version changes nothing."""
    if sequence_by is None:
        return None
    column = quote(sequence_by)
    return f"s.{column} >= t.{column} OR t.{column} IS NULL"


class RsTableWriter(DeltaTableWriter):
    """delta-rs on the driver: appends, rewrites and replaces with ``write_deltalake``, upserts with ``merge``."""

    engine = DeltaEngine.RS

    def write(self, rows: DataFrame, target: TableTarget, *, query_id: str, batch_id: int, metadata: dict[str, Any],
              replace: RowFilter | None = None, staging: Path | None = None,
              added: Mapping[str, str] | None = None) -> bool:
        import pyarrow as pa
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        table = DeltaTable(target.path)
        if holds_batch(table, query_id, batch_id):
            log.warning("Batch %s of %s is already in %s; skipping its replay", batch_id, query_id, target.path)
            return False
        offered = rows.count()  # a merge's superseded versions count as processed, for the row reconciliation
        if offered == 0 and target.mode is SinkMode.APPEND and replace is None:
            return True  # nothing to append: no empty commit
        schema = pa.schema(table.schema().to_arrow())
        if added:
            schema = _with_added(schema, added, f"{query_id}:{batch_id}", rows)
        properties = CommitProperties(custom_metadata={**metadata, CommitInfo.RECORDS: offered},
                                      app_transactions=[Transaction(query_id, batch_id)])
        if target.mode is SinkMode.MERGE:
            # Spark's Arrow types as the table has them.
            data = _in_schema(latest_per_key(rows, target.keys, target.sequence_by).toArrow(), schema)
            merger = table.merge(data, _merge_condition(target.keys, "IS NOT DISTINCT FROM"), source_alias="s",
                                 target_alias="t", commit_properties=properties)
            merger.when_matched_update_all(predicate=_newer(target.sequence_by)).when_not_matched_insert_all().execute()
            return True
        data = _staged(rows, schema, staging) if staging is not None else _in_schema(rows.toArrow(), schema)
        partition_by = list(target.partition_by) or None
        if replace is not None or target.mode is SinkMode.COMPLETE:
            write_deltalake(table, data, mode="overwrite", partition_by=partition_by, commit_properties=properties,
                            predicate=render(replace, DATAFUSION) if replace is not None else None,
                            schema_mode="merge" if added else None)
        else:
            write_deltalake(table, data, mode="append", partition_by=partition_by, commit_properties=properties,
                            schema_mode="merge" if added else None)
        return True

    @staticmethod
    def append_arrow(rows: Any, target: TableTarget, *, query_id: str, batch_id: int,
                     metadata: dict[str, Any]) -> bool:
        """Append an Arrow table already on the driver (a small batch collected once, see :class:`BatchRouter`),
        with the same once-only transaction as :meth:`write`. False when the table already held the batch."""
        import pyarrow as pa
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        table = DeltaTable(target.path)
        if holds_batch(table, query_id, batch_id):
            log.warning("Batch %s of %s is already in %s; skipping its replay", batch_id, query_id, target.path)
            return False
        if rows.num_rows == 0:
            return True
        properties = CommitProperties(custom_metadata={**metadata, CommitInfo.RECORDS: rows.num_rows},
                                      app_transactions=[Transaction(query_id, batch_id)])
        write_deltalake(table, _in_schema(rows, pa.schema(table.schema().to_arrow())), mode="append",
                        partition_by=list(target.partition_by) or None, commit_properties=properties)
        return True


def _with_added(schema: Any, added: Mapping[str, str], marker: str, rows: DataFrame) -> Any:
    """The table's Arrow schema and the ``added`` columns (in their Arrow types as Spark gives them), each marked
    with the batch that adds it; a column the table has already (an earlier batch of this run added it) keeps its
    place."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    types = {field.name: field.dataType for field in rows.schema.fields}
    fields = [pa.field(name, to_arrow_type(types[name], timezone="UTC"), metadata={ADDED_COLUMN_KEY: marker})
              for name in added if name not in schema.names]
    return pa.schema([*schema, *fields])


def _in_schema(rows: Any, schema: Any) -> Any:
    """An Arrow table's columns in the order and the types of the table's schema (a column added to an existing
    table comes last in it); a column of the table the rows lack (one of Sluice's own the stream no longer writes,
    see :func:`sluice.storage.delta.ensure_table`) is NULL."""
    import pyarrow as pa

    columns = [rows.column(field.name) if field.name in rows.column_names else pa.nulls(rows.num_rows, field.type)
               for field in schema]
    return pa.Table.from_arrays(columns, names=schema.names).cast(schema)


def _staged(rows: DataFrame, schema: Any, staging: Path) -> Any:
    """Rows written as Parquet by the executors into ``staging``, read back as one Arrow stream in the table's
    schema: a large batch never has to fit in the driver's memory."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    rows.write.mode("overwrite").parquet(str(staging))
    parts = sorted(str(path) for path in staging.glob("*.parquet"))
    scanner = ds.dataset(parts, format="parquet").scanner() if parts else None

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in scanner.to_batches() if scanner is not None else []:
            yield from _in_schema(pa.Table.from_batches([batch]), schema).to_batches()

    return pa.RecordBatchReader.from_batches(schema, batches())


class JvmTableWriter(DeltaTableWriter):
    """delta-spark: idempotent writes by ``txnAppId``/``txnVersion``, ``replaceWhere`` for a replace."""

    engine = DeltaEngine.JVM

    def write(self, rows: DataFrame, target: TableTarget, *, query_id: str, batch_id: int, metadata: dict[str, Any],
              replace: RowFilter | None = None, staging: Path | None = None,
              added: Mapping[str, str] | None = None) -> bool:
        faults.reach("before_commit", batch_id)
        if target.mode is SinkMode.MERGE:
            return self._merge(rows, target, query_id=query_id, batch_id=batch_id, metadata=metadata)
        overwrite = replace is not None or target.mode is SinkMode.COMPLETE
        if added:  # Delta keeps a column's metadata: the mark of the batch that added it
            marker = {ADDED_COLUMN_KEY: f"{query_id}:{batch_id}"}
            rows = rows.withColumns({name: F.col(name).alias(name, metadata=marker) for name in added})
        writer = (
            rows.write.format("delta")
            .mode("overwrite" if overwrite else "append")
            .option("txnAppId", query_id)
            .option("txnVersion", batch_id)
            .option("userMetadata", json.dumps(metadata))
        )
        if added:
            writer = writer.option("mergeSchema", "true")
        if replace is not None:
            writer = writer.option("replaceWhere", render(replace, SPARK_SQL))
        if target.partition_by:
            writer = writer.partitionBy(*target.partition_by)
        writer.save(target.path)
        return True

    @staticmethod
    def _merge(rows: DataFrame, target: TableTarget, *, query_id: str, batch_id: int,
               metadata: dict[str, Any]) -> bool:
        from delta.tables import DeltaTable

        spark = rows.sparkSession
        offered = rows.count()
        if offered == 0:
            return True
        settings = {"spark.databricks.delta.write.txnAppId": query_id,
                    "spark.databricks.delta.write.txnVersion": str(batch_id),
                    "spark.databricks.delta.commitInfo.userMetadata": json.dumps(
                        {**metadata, CommitInfo.RECORDS: offered})}
        for key, value in settings.items():
            spark.conf.set(key, value)
        try:
            source = latest_per_key(rows, target.keys, target.sequence_by)
            target_table = DeltaTable.forPath(spark, target.path).alias("t")
            (target_table.merge(source.alias("s"), _merge_condition(target.keys, "<=>"))
             .whenMatchedUpdateAll(condition=_newer(target.sequence_by)).whenNotMatchedInsertAll().execute())
        finally:
            for key in settings:
                spark.conf.unset(key)
        return True


_WRITERS: dict[DeltaEngine, DeltaTableWriter] = {DeltaEngine.RS: RsTableWriter(), DeltaEngine.JVM: JvmTableWriter()}


def table_writer(engine: DeltaEngine) -> DeltaTableWriter:
    """The idempotent writer of a resolved engine (``rs`` or ``jvm``)."""
    try:
        return _WRITERS[engine]
    except KeyError:
        raise ValueError(f"no Delta writer for engine {engine.value!r}; resolve 'auto' first") from None


CommitInfoOf = Callable[[int, int], dict[str, Any]]


@dataclass
class SinkRequest:
    """What a sink kind's writer (:mod:`sluice_spark.kinds`) is given to build a stream query's sink: the routed
    frame, the stream, its Delta tables (:func:`sluice_spark.runner.sink_targets`), the good rows' columns, the
    engine, the pinned query id, the commit info of its run, and where to count what it sends to a sink that has no
    commit log to count from (Kafka)."""

    frame: DataFrame
    stream: StreamSpec
    targets: list[TableTarget]
    data_columns: list[str]
    engine: DeltaEngine
    query_id: str
    commit_info: dict[str, Any]
    sent: dict[int, int] = field(default_factory=dict)
    # A small run (:func:`sluice_spark.runner.collects_on_driver`): its batches are collected to the driver.
    collect: bool = False
    # Where the writer records the columns ``add_new_columns`` added, with their types.
    added_columns: dict[str, str] = field(default_factory=dict)


def sink_and_dead_letter(targets: Sequence[TableTarget]) -> tuple[TableTarget | None, TableTarget]:
    """The stream's own table (None for a sink that is not a Delta table) and its dead-letter table, among its
    targets."""
    by_role = {(target.route, target.flag is None): target for target in targets}
    return by_role.get((GOOD_ROUTE, True)), by_role[(DEAD_LETTER_ROUTE, True)]


def stream_commit_info(base: Mapping[str, Any], *, stream: str, query_id: str) -> CommitInfoOf:
    """The commit info of a stream's batch (by batch id and route), with the keys that tie it to the stream's query
    (:func:`sluice.storage.delta.commit_metadata`): health, repair and the run summary read them."""
    return lambda batch_id, route: commit_metadata(dict(base), stream=stream, query_id=query_id, batch_id=batch_id,
                                                   route=route)


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


class BatchStopped(Exception):
    """A batch's Spark job was cancelled because its query is stopping (a warm run whose client went away)."""


# Spark's words when it cancels a stopping query's jobs, and the interruptions it counts as a stop (the end of
# StreamExecution.PROXY_ERROR).
_STOPPED_JOB = re.compile(r"\[SPARK_JOB_CANCELLED\][^\n]*")
_INTERRUPTED = re.compile(r"java\.lang\.InterruptedException|java\.io\.InterruptedIOException|"
                          r"java\.nio\.channels\.ClosedByInterruptException")


@contextlib.contextmanager
def briefly_stopped() -> Iterator[None]:
    """Raise a stopping query's cancelled job as one short line. A foreachBatch error goes back to the JVM as its
    Python traceback, chained Py4J errors and their Java stack traces included (tens of KB), and Spark first matches
    it against a regex that recurses once per character (StreamExecution.PROXY_ERROR, ``(.|\\r\\n|\\r|\\n)*``): the
    stream thread's stack overflows, and the thread dies with a StackOverflowError instead of stopping. One line that
    names Spark's exception, the cancel and the query's run id (its job group) is what Spark's check reads as a stop.
    """
    try:
        yield
    except Exception as exc:
        text = str(exc)
        stopped, interrupted = _STOPPED_JOB.search(text), _INTERRUPTED.search(text)
        if stopped is not None:
            raise BatchStopped(f"org.apache.spark.SparkException: {stopped.group(0)}") from None
        if interrupted is not None and "py4j" in type(exc).__module__:
            raise BatchStopped("py4j.protocol.Py4JJavaError: An error occurred while calling the JVM: "
                               f"{interrupted.group(0)}") from None
        raise


class BatchRouter:
    """The ``foreachBatch`` function that writes each micro-batch into its tables, table by table, once.

    ``before`` sees the persisted batch first (the Kafka sink sends its good rows, the backfill counts); when it
    returns False the batch writes nothing (a dry run). ``replace`` maps a route to the rows its table gives up in
    the same commit. ``commit_info`` gives each commit's metadata by batch id and route (see
    :func:`stream_commit_info`). Batches a table already held are listed in ``replayed``. A batch with rows that
    broke a ``fail`` expectation (:data:`~sluice_spark.targets.FAILED_COLUMN`) raises before anything is written;
    ``example_column`` holds what the error shows of the first such row. With ``collect`` (the rs engine, appends
    only, a small batch), the batch is collected to the driver once and cut into its tables there.
    """

    def __init__(self, targets: Sequence[TableTarget], *, engine: DeltaEngine, route_column: str, query_id: str,
                 commit_info: CommitInfoOf, replace: Mapping[int, RowFilter | None] | None = None,
                 staging: Path | None = None, before: Callable[[DataFrame, int], bool] | None = None,
                 example_column: str | None = None, collect: bool = False,
                 added: dict[str, str] | None = None) -> None:
        self.targets = list(targets)
        self.added = added
        self.collect = collect
        self.example_column = example_column
        self.writer = table_writer(engine)
        self.route_column = route_column
        self.query_id = query_id
        self.commit_info = commit_info
        self.replace = dict(replace or {})
        self.staging = staging
        self.before = before
        self.replayed: list[int] = []

    def rows_of(self, batch: DataFrame, target: TableTarget) -> DataFrame:
        """The rows of a routed batch that go to ``target``, with the table's column names."""
        selected = F.col(self.route_column) == target.route
        if target.flag:
            selected = selected & F.col(target.flag)
        return batch.where(selected).select(*[F.col(source).alias(name) for source, name in target.columns])

    def refuse_failed(self, batch: DataFrame, batch_id: int) -> None:
        """Raise when rows of the batch broke a ``fail`` expectation: it must commit nowhere."""
        failed = batch.where(F.col(FAILED_COLUMN).isNotNull())
        counted = {row[0]: int(row[1]) for row in failed.groupBy(FAILED_COLUMN).count().collect()}
        if counted:
            example = failed.select(self.example_column).first() if self.example_column else None
            raise expectation_failure(batch_id, tally_failures(counted, {}), example[0] if example else None)

    @staticmethod
    def refuse_drift(batch: DataFrame, batch_id: int) -> None:
        """Raise when rows of the batch brought fields the schema does not declare (``fail_on_new_columns``)."""
        drifting = batch.where(F.col(NEW_FIELDS_COLUMN).isNotNull())
        counted = {row[0]: int(row[1]) for row in
                   drifting.select(F.explode(NEW_FIELDS_COLUMN)).groupBy("col").count().collect()}
        if counted:
            origins = (drifting.select(SOURCE_FILE_COLUMN).distinct().limit(5).collect()
                       if SOURCE_FILE_COLUMN in batch.columns else [])
            raise drift_failure(batch_id, counted, [str(row[0]) for row in origins])

    def add_columns(self, batch: DataFrame, batch_id: int) -> tuple[DataFrame, dict[str, str]]:
        """Under ``add_new_columns``: the batch with a typed column per new top-level field that its written rows
        brought (:data:`NEW_COLUMNS_COLUMN`), and those columns' types. A typed source says each one's type
        (:data:`NEW_TYPES_COLUMN`); otherwise a type is the one every value of the field fits (whole numbers widen
        to double beside fractions; an object, an array or a number past 64 bits is kept as its text). A field that
        arrives as two other kinds of value stops the batch, naming it. What cannot become a column joins the row's
        ``_rescued_data``: a name the table has already in another case, a value that does not fit the column an
        earlier batch of this run added."""
        assert self.added is not None
        sink = next(target for target in self.targets if target.route == GOOD_ROUTE)
        written = (F.col(self.route_column) == GOOD_ROUTE) & F.col(NEW_COLUMNS_COLUMN).isNotNull()
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
        taken.update({name.casefold(): name for name in self.added})
        types: dict[str, str] = {}
        for name, kinds in sorted(seen.items()):
            owner = taken.get(name.casefold())
            if owner is not None and owner != name:
                continue  # another case of a column's name: rescued
            earlier = self.added.get(name)  # an earlier batch of this run added it: the table has its type
            types[name] = earlier or (declared_column_type(name, declared[name], batch_id) if name in declared
                                      else new_column_type(name, kinds, batch_id))
            taken[name.casefold()] = name
        if not types:
            return self._rescue_new(batch, new, {}), {}
        typed = {name: _typed(new, name, kind, declared=name in declared) for name, kind in types.items()}
        return self._rescue_new(batch.withColumns(typed), new, types), types

    @staticmethod
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

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        with briefly_stopped():
            self._write(batch, batch_id)

    def _write(self, batch: DataFrame, batch_id: int) -> None:
        if self.collect:
            self._write_collected(batch, batch_id)
            return
        batch.persist()
        try:
            if NEW_FIELDS_COLUMN in batch.columns:
                self.refuse_drift(batch, batch_id)
            if FAILED_COLUMN in batch.columns:
                self.refuse_failed(batch, batch_id)
            if self.before is not None and not self.before(batch, batch_id):
                return
            added: dict[str, str] = {}
            if self.added is not None and NEW_COLUMNS_COLUMN in batch.columns:
                batch, added = self.add_columns(batch, batch_id)
            replayed = False
            for target in self.targets:
                metadata = self.commit_info(batch_id, target.route)
                staging = self.staging / f"{batch_id}-{target.route}" if self.staging is not None else None
                widened = added if target.route == GOOD_ROUTE else {}  # one table: no fan-out adds columns
                if widened:
                    target = dataclasses.replace(target, columns=(*target.columns, *((n, n) for n in widened)))
                replayed |= not self.writer.write(self.rows_of(batch, target), target, query_id=self.query_id,
                                                  batch_id=batch_id, metadata=metadata,
                                                  replace=self.replace.get(target.route), staging=staging,
                                                  added=widened)
                faults.reach("between_commits", batch_id)
            if self.added is not None:
                self.added.update(added)  # committed with its batch's rows
            if replayed:
                self.replayed.append(batch_id)
        finally:
            batch.unpersist()

    def _write_collected(self, batch: DataFrame, batch_id: int) -> None:
        """A small batch, appended on the rs engine: collected to the driver once as Arrow (one Spark job, no Python
        worker), refused if a row broke a ``fail`` rule, then cut into its tables' rows and appended."""
        assert isinstance(self.writer, RsTableWriter)
        rows = batch.toArrow()
        if NEW_FIELDS_COLUMN in rows.column_names:
            fields: dict[str, int] = {}
            origins: dict[str, None] = {}
            origin = SOURCE_FILE_COLUMN if SOURCE_FILE_COLUMN in rows.column_names else None
            new_fields_in(rows, NEW_FIELDS_COLUMN, origin, fields, origins)
            if fields:
                raise drift_failure(batch_id, fields, list(origins))
        if FAILED_COLUMN in rows.column_names:
            failed: dict[str, int] = {}
            example = failed_in(rows, FAILED_COLUMN, self.example_column, failed)
            if failed:
                raise expectation_failure(batch_id, failed, example)
        faults.reach("before_commit", batch_id)
        replayed = False
        for target in self.targets:
            mask = target.selects(rows.column(self.route_column), rows.column(target.flag) if target.flag else None)
            selected = rows.filter(mask).select([source for source, _ in target.columns])
            replayed |= not self.writer.append_arrow(
                selected.rename_columns(target.table_columns), target, query_id=self.query_id, batch_id=batch_id,
                metadata=self.commit_info(batch_id, target.route))
            faults.reach("between_commits", batch_id)
        faults.reach("after_commit", batch_id)
        if replayed:
            self.replayed.append(batch_id)
