"""The stream's Delta tables: their routes in the routed frame, and their creation before a run."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema

from sluice.catalog.patterns import default_delete_when
from sluice.constants import CDC_END_COLUMN, CDC_START_COLUMN, DeltaEngine, SchemaEvolution, SinkMode, TableRole
from sluice.kinds.delta import DeltaSink
from sluice.model.schema import Column as DeclaredColumn
from sluice.model.sinks import CdcSpec
from sluice.model.stream import StreamSpec
from sluice.model.types import parse as parse_type
from sluice.paths import Roots
from sluice.storage.delta import added_columns, ensured_table, table_version
from sluice_spark.steps.route import DEAD_LETTER_FIELDS, fan_out_column, fan_out_columns
from sluice_spark.targets import DEAD_LETTER_ROUTE, GOOD_ROUTE, TableTarget


def sink_targets(stream: StreamSpec, roots: Roots, data_columns: list[str]) -> list[TableTarget]:
    """The stream's tables (:meth:`StreamSpec.tables`: its own, its dead-letter table, its fan-out tables) as
    routes of the routed frame."""
    sink, aggregate = stream.sink, stream.patterns.aggregate
    targets = []
    for table in stream.tables(roots):
        if table.role is TableRole.SINK:
            assert isinstance(sink, DeltaSink)
            keys = aggregate.key_columns if aggregate is not None and sink.mode is SinkMode.MERGE else sink.keys
            cdc = _resolved_cdc(stream) if sink.mode is SinkMode.CDC else None
            # A cdc table's writer gets every column (delete_when may read one of the except_columns) and drops
            # the except_columns itself; its table is created without them.
            targets.append(TableTarget(GOOD_ROUTE, table.path, tuple((c, c) for c in data_columns), sink.partition_by,
                                       mode=sink.mode, keys=keys, sequence_by=sink.sequence_by, cdc=cdc))
        elif table.role is TableRole.DEAD_LETTER:
            targets.append(TableTarget(DEAD_LETTER_ROUTE, table.path, DEAD_LETTER_FIELDS))
        else:
            spec = stream.patterns.fan_out[table.index]
            targets.append(TableTarget(GOOD_ROUTE, table.path,
                                       tuple((c, c) for c in fan_out_columns(spec, data_columns)),
                                       spec.partition_by, flag=fan_out_column(table.index)))
    return targets


def _resolved_cdc(stream: StreamSpec) -> CdcSpec:
    """The sink's cdc block with its delete predicate resolved: a Debezium envelope's default when none is set."""
    sink = stream.sink
    assert isinstance(sink, DeltaSink)
    cdc = sink.cdc or CdcSpec()
    if cdc.delete_when is None:
        cdc = replace(cdc, delete_when=default_delete_when(stream.source))
    return cdc


def tables_to_create(targets: list[TableTarget], engine: DeltaEngine, *, change_feed: bool = False
                     ) -> list[TableTarget]:
    """The targets :func:`create_tables` prepares before a run: all of them on the rs engine. The jvm engine creates
    an appended table on its first write, but needs the table of a merge (delta-spark merges only into a table), and
    an existing table gains the stream's new columns here all the same (delta-spark would refuse the append, or a
    merge would drop them). A table whose changes another stream reads (``change_feed``) is created here too, to
    record them from its first version."""
    if engine is DeltaEngine.RS:
        return targets
    return [target for target in targets
            if target.mode in (SinkMode.MERGE, SinkMode.CDC) or table_version(target.path) is not None
            or (change_feed and target.route == GOOD_ROUTE and not target.flag)]


def feeds_changes(stream: StreamSpec) -> bool:
    """Whether another stream of the catalog reads the changes of this stream's table (``read: changes``)."""
    return isinstance(stream.sink, DeltaSink) and stream.sink.change_feed


def create_tables(stream: StreamSpec, routed: DataFrame, targets: list[TableTarget]) -> dict[str, Any]:
    """Create the targets' Delta tables with delta-rs from the routed frame's schema (the jvm engine creates its
    own on first write); an existing table must have the same schema. The tables as delta-rs loaded them, by path:
    the run's later reads and commits bring these up to date instead of loading them again."""
    arrow_schema = to_arrow_schema(routed.schema, timezone="UTC")
    tables: dict[str, Any] = {}
    for target in targets:
        skipped = target.cdc.except_columns if target.cdc is not None else ()
        fields = [arrow_schema.field(source).with_name(name) for source, name in target.columns if name not in skipped]
        if target.cdc is not None and target.cdc.scd_type == 2:  # each version's validity, in the sequence's type
            sequence = arrow_schema.field(target.sequence_by or "").type
            fields += [pa.field(CDC_START_COLUMN, sequence), pa.field(CDC_END_COLUMN, sequence)]
        if target.flag:  # a fan-out table is named after its folder
            name = target.path.rstrip("/").rsplit("/", 1)[-1]
        else:
            name = stream.name if target.route == GOOD_ROUTE else f"{stream.name}_dead_letter"
        tables[target.path], _ = ensured_table(
            target.path, pa.schema(fields), target.partition_by, name=name, description=stream.description,
            change_feed=feeds_changes(stream) and target.route == GOOD_ROUTE and not target.flag)
    return tables


def with_added_columns(stream: StreamSpec, roots: Roots) -> StreamSpec:
    """The stream as a run reads it: under ``add_new_columns``, with the columns earlier batches added to its table
    (which records them in its schema: :func:`sluice.storage.delta.added_columns`) unless the catalog now declares
    them."""
    if stream.source.schema_evolution is not SchemaEvolution.ADD_NEW_COLUMNS or stream.sink.table is None:
        return stream
    declared = {name.casefold() for name in stream.source.schema.names}
    evolved = tuple(DeclaredColumn(name, kind, True, parse_type(kind)[0]) for name, kind in
                    added_columns(stream.sink_path(roots)).items() if name.casefold() not in declared)
    return replace(stream, source=replace(stream.source, evolved=evolved)) if evolved else stream
