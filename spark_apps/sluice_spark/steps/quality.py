"""The quality split: every parsed record is good, dead-lettered with a reason, or dropped by a rule and counted.

Two steps, in this order around the transform:

1. :func:`flag_dead_letters`, before the transform: a record goes to the dead-letter table when the reader could
   not parse it (``_corrupt_record`` is set) or when a field declared ``not null`` is missing. The reason names the
   first offending field and its raw value.
2. :func:`check_expectations`, after the transform and before the stateful steps: the stream's rules
   (:mod:`sluice.model.expectations`) judge the rows step 1 kept. A quarantined row joins the dead letters with
   every rule it broke in its reason; a dropped row leaves the frame; a row that broke a ``fail`` rule is marked
   for the writers, which refuse to commit its batch (:func:`sluice_spark.targets.expectation_failure`).

Both are column expressions (no Python UDF), so they cost no extra pass over the data. The counts per rule travel
in Spark's observed metrics (:data:`EXPECTATIONS_METRIC`), one row per micro-batch in its progress report.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import StreamingQueryProgress

from sluice.constants import CORRUPT_COLUMN, RESCUED_COLUMN, FileFormat, SchemaEvolution
from sluice.errors import CatalogError
from sluice.model.expectations import QUARANTINE_REASON, NullResult, Violation
from sluice.model.stream import StreamSpec
from sluice.model.types import dotted, quote
from sluice_spark.drift.fields import reads_by_header, reparse_as_text
from sluice_spark.drift.parquet import UNREADABLE_PARQUET
from sluice_spark.targets import (
    CSV_FIELDS_COLUMN,
    FAILED_COLUMN,
    NEW_COLUMNS_COLUMN,
    NEW_FIELDS_COLUMN,
    RAW_COLUMN,
    REASON_COLUMN,
    RECORD_COLUMN,
)

_MAX_VALUE_IN_REASON = 120
#: The name of the observed metrics that count, per micro-batch, the rows the rules judged (``checked``), the rows
#: each rule caught (``broke_<rule>``) and the rows dropped (``dropped``).
EXPECTATIONS_METRIC = "sluice_expectations"
#: The observed metrics that count, per micro-batch, the good rows of a stream that carry rescued data
#: (``rescued``); a joined stream counts its own.
RESCUE_METRIC = "sluice_rescue_{stream}"
CHECKED_METRIC = "checked"
DROPPED_METRIC = "dropped"


def broke_metric(rule: str) -> str:
    return f"broke_{rule}"


def dead_letter_reason(stream: StreamSpec, reparsed: Column | None) -> Column:
    """Why a parsed record is rejected, or NULL when it is good. ``reparsed`` is the corrupt record parsed again
    with every declared field as text (:func:`with_reparsed`), or None for a source that keeps no text."""
    schema = stream.source.read_schema
    kind = stream.source.format.value.upper()
    cast_failures: list[Column] = []
    if reparsed is not None:
        malformed = F.lit(f"malformed {kind} record")
        if stream.source.format is FileFormat.PARQUET:
            # A file pyarrow could not read says why in its one dead letter (sluice_spark.drift.parquet).
            unreadable = F.col(CORRUPT_COLUMN).startswith(UNREADABLE_PARQUET)
            malformed = F.when(unreadable, F.col(CORRUPT_COLUMN)).otherwise(malformed)
        cast_failures.append(F.when(reparsed[CORRUPT_COLUMN].isNotNull() | reparsed.isNull(), malformed))
        for column in schema.columns:
            raw_value = reparsed[column.name]
            cast_failures.append(
                F.when(
                    raw_value.isNotNull() & F.col(column.name).isNull(),
                    F.concat(
                        F.lit(f"field '{column.name}': cannot parse '"),
                        F.substring(raw_value, 1, _MAX_VALUE_IN_REASON),
                        F.lit(f"' as {column.sql_type}"),
                    ),
                )
            )
    corrupt = F.when(
        F.col(CORRUPT_COLUMN).isNotNull(),
        F.coalesce(*cast_failures, F.lit(f"malformed {kind} record")),
    )
    if stream.source.rescues:
        # A record whose misfits were rescued is good, unless a required column is among them.
        required = set(schema.required)
        misfit_required = [failure for column, failure in zip(schema.columns, cast_failures[1:], strict=False)
                           if column.name in required]
        corrupt = F.when(F.col(RESCUED_COLUMN).isNull(), corrupt).otherwise(
            F.coalesce(*misfit_required) if misfit_required else F.lit(None).cast("string"))
    missing = [
        F.when(F.col(quote(name)).isNull(), F.lit(f"missing required field '{name}'")) for name in schema.required
    ]
    missing += [F.when(_lacks(F.col(quote(path[0])), path[1:]), F.lit(f"missing required field '{dotted(path)}'"))
                for path in schema.required_fields]
    return F.coalesce(corrupt, *missing) if missing else corrupt


def with_reparsed(frame: DataFrame, stream: StreamSpec) -> tuple[DataFrame, Column | None]:
    """``frame`` with the corrupt record parsed again as text (:func:`reparse_as_text`) in a step of its own, and the
    column that holds it (None for a source that keeps no text).

    ``from_json`` is not compiled to Java code (Spark's ``CodegenFallback``): written into the reason, once per
    declared field, it kept the reason's whole step out of whole-stage codegen, and with it what the optimizer folded
    into that step (a transform's columns, the rules' flags). Named here, computed for a corrupt record only, the
    parse is a small step of its own, and the reason, which reads its fields, compiles with the rest: the optimizer
    does not fold this step into the reason's, which would copy the parse once per field (``CollapseProject``).
    A CSV record read by its header has its fields as text in a column already."""
    reparsed = reparse_as_text(stream.source)
    if reparsed is None or reads_by_header(stream.source):
        return frame, reparsed
    staged = frame.withColumn(_REPARSED, F.when(F.col(CORRUPT_COLUMN).isNotNull(), reparsed))
    return staged, F.col(_REPARSED)


_REPARSED = "_sluice_reparsed"


def _lacks(parent: Column, rest: tuple[str, ...]) -> Column:
    """True when ``parent`` is there and lacks the ``not null`` field at ``rest`` (in any of its elements, across an
    array): Spark's and Delta's meaning of a NOT NULL field in a nullable struct."""
    step, tail = rest[0], rest[1:]
    if step == "[]":
        inner = F.exists(parent, lambda element: _lacks(element, tail))
    else:
        child = parent.getField(step)
        inner = child.isNull() if not tail else _lacks(child, tail)
    return parent.isNotNull() & F.coalesce(inner, F.lit(False))


def flag_dead_letters(frame: DataFrame, stream: StreamSpec) -> DataFrame:
    """Add the reason (NULL for a good record) and, for rejected records only, the raw record.

    Both are NULL for good records, which costs next to nothing to carry; the raw record is taken before any
    transform can rewrite the fields it is rebuilt from.
    """
    staged, reparsed = with_reparsed(frame, stream)
    reason = dead_letter_reason(stream, reparsed)
    policy = stream.source.schema_evolution
    if policy is SchemaEvolution.FAIL_ON_NEW_COLUMNS:
        # A row with fields the schema does not declare stops its batch (``fail_on_new_columns``); it rides with the
        # dead letters past the stateful steps, to the writers that refuse the batch.
        new_fields = F.concat(F.lit("new field(s) not in the declared schema: "),
                              F.array_join(F.col(NEW_FIELDS_COLUMN), ", "))
        reason = F.coalesce(reason, F.when(F.col(NEW_FIELDS_COLUMN).isNotNull(), new_fields))
    flagged = staged.withColumn(REASON_COLUMN, reason).drop(_REPARSED)
    flagged = flagged.withColumns({RAW_COLUMN: F.when(F.col(REASON_COLUMN).isNotNull(), _raw_record(stream)),
                                   **({RECORD_COLUMN: _record_fields(stream)} if stream.expectations else {})})
    flagged = flagged.drop(CSV_FIELDS_COLUMN)
    if stream.source.rescues:
        rescued = F.count_if(F.col(REASON_COLUMN).isNull() & F.col(RESCUED_COLUMN).isNotNull())
        flagged = flagged.observe(RESCUE_METRIC.format(stream=stream.name), rescued.alias("rescued"))
    return flagged


def rescued_count(progress: Iterable[StreamingQueryProgress], stream: StreamSpec) -> int | None:
    """The good rows that carried rescued data, over the executed batches of a query's progress reports; None for
    a stream that rescues nothing."""
    if not stream.source.rescues:
        return None
    return sum(int(values["rescued"]) for values in observed(progress, RESCUE_METRIC.format(stream=stream.name)))


def observed(progress: Iterable[StreamingQueryProgress], name: str) -> Iterator[dict[str, Any]]:
    """The observed metrics ``name`` of each executed batch in a query's progress reports (a report without
    ``addBatch`` is an idle trigger)."""
    for report in progress:
        metrics = report.observedMetrics.get(name) if "addBatch" in report.durationMs else None
        if metrics is not None:
            yield metrics.asDict()


def _raw_record(stream: StreamSpec) -> Column:
    """The record as it arrived when the reader kept it, else the parsed fields as JSON, with what the drift policy
    kept beside them (the rescued data, the new columns' values): a dead letter loses nothing."""
    return F.coalesce(F.col(CORRUPT_COLUMN), F.to_json(_record_fields(stream)))


def _record_fields(stream: StreamSpec) -> Column:
    """The parsed record's fields, and what the drift policy kept beside them, as one struct (not serialised: only
    a dead letter's is)."""
    source = stream.source
    names = [*source.read_schema.names, *([RESCUED_COLUMN] if source.rescues else []),
             *([NEW_COLUMNS_COLUMN] if source.schema_evolution is SchemaEvolution.ADD_NEW_COLUMNS else [])]
    return F.struct(*[F.col(quote(name)) for name in names])


def check_expectations(frame: DataFrame, stream: StreamSpec, data_columns: list[str]) -> DataFrame:
    """Judge the good rows of a transformed frame by the stream's rules (see the module's docstring).

    ``data_columns`` are the row's columns as the rules see them. A quarantined row's raw record is the record as the
    source read it (:func:`flag_dead_letters` carries it), else those columns as JSON.
    """
    rules = stream.expectations
    if not rules:
        return frame
    judged = F.col(REASON_COLUMN).isNull()
    broke: dict[str, Column] = {}
    checks = [F.expr(rule.check) for rule in rules]
    # Spark types every check in one analysis: each analysis is a round trip to the JVM, slow on a cold one.
    kinds = [field.dataType.simpleString() for field in frame.select(*checks).schema.fields]
    for rule, check, kind in zip(rules, checks, kinds, strict=True):
        if kind != "boolean":
            raise CatalogError(f"the check {rule.check!r} gives {kind}, not a boolean", stream=stream.name,
                               field=f"expectations.{rule.name}.check")
        broke[rule.name] = judged & ~F.coalesce(check, F.lit(rule.on_null is NullResult.PASSES))
    flags = {_JUDGED: judged, **{_flag(name): condition for name, condition in broke.items()}}
    flagged = frame.withColumns(flags)

    def any_broke(action: Violation) -> Column:
        return _any([F.col(_flag(rule.name)) for rule in rules if rule.on_violation is action])

    def names(selected: list[str]) -> Column:
        return F.concat_ws(", ", *[F.when(F.col(_flag(name)), F.lit(name)) for name in selected])

    failed, quarantined = any_broke(Violation.FAIL), any_broke(Violation.QUARANTINE)
    dead = failed | quarantined
    dropped = any_broke(Violation.DROP) & ~dead
    # The record as it arrived (before the transform), so that a redrive can send it through the transform again;
    # a frame routed without the source's flags (a test's) has only its columns.
    row = F.to_json(F.col(RECORD_COLUMN) if RECORD_COLUMN in frame.columns
                    else F.struct(*[F.col(quote(name)) for name in data_columns]))
    fail_rules = [rule.name for rule in rules if rule.on_violation is Violation.FAIL]
    judged_frame = flagged.withColumns({
        REASON_COLUMN: F.when(dead, F.concat(F.lit(QUARANTINE_REASON), names([rule.name for rule in rules])))
        .otherwise(F.col(REASON_COLUMN)),
        RAW_COLUMN: F.when(dead, F.coalesce(F.col(RAW_COLUMN), row)).otherwise(F.col(RAW_COLUMN)),
        **({FAILED_COLUMN: F.when(failed, names(fail_rules))} if fail_rules else {}),
    })
    metrics = [F.count_if(F.col(_JUDGED)).alias(CHECKED_METRIC), F.count_if(dropped).alias(DROPPED_METRIC),
               *[F.count_if(F.col(_flag(rule.name))).alias(broke_metric(rule.name)) for rule in rules]]
    observed = judged_frame.observe(EXPECTATIONS_METRIC, *metrics)
    return observed.where(~dropped).drop(*flags, RECORD_COLUMN)


_JUDGED = "_sluice_judged"


def _flag(rule: str) -> str:
    return f"_sluice_broke_{rule}"


def _any(conditions: list[Column]) -> Column:
    if not conditions:
        return F.lit(False)
    result = conditions[0]
    for condition in conditions[1:]:
        result = result | condition
    return result


def expectation_counts(progress: Iterable[StreamingQueryProgress],
                       stream: StreamSpec) -> tuple[list[dict[str, Any]], int]:
    """Per rule, the rows checked and the rows that broke it, and the rows dropped, over the executed batches of a
    query's progress reports (a report without ``addBatch`` is an idle trigger)."""
    checked = dropped = 0
    broke = dict.fromkeys((rule.name for rule in stream.expectations), 0)
    for values in observed(progress, EXPECTATIONS_METRIC):
        checked += int(values[CHECKED_METRIC])
        dropped += int(values[DROPPED_METRIC])
        for name in broke:
            broke[name] += int(values[broke_metric(name)])
    counts = [{"rule": rule.name, "on_violation": rule.on_violation.value, "checked": checked,
               "violated": broke[rule.name]} for rule in stream.expectations]
    return counts, dropped
