"""Debezium's change events unwrapped into rows (``source.envelope: debezium``), before the JSON is parsed.

An event (with or without Kafka Connect's ``{"schema": ..., "payload": ...}`` around it) holds ``op`` (``c`` create,
``u`` update, ``r`` snapshot read, ``d`` delete, ``t`` truncate), the row ``before`` and ``after`` the change, and
``ts_ms``. The unwrapped record is the row (``after``; ``before`` for a delete) with ``__op``, ``__ts_ms`` and
``__sequence``: ts_ms followed by twenty digits of the catalog's tiebreak (``source.lsn``), one DECIMAL(38,0) that
orders two events of one millisecond. A Kafka tombstone (no value) deletes its key: its row is the record's key, its
ts_ms the record's timestamp. The unwrapped text goes through the source's JSON parsing and drift policy as any
record does; an event that is not one (no ``op``, no row) keeps its text and becomes a dead letter there.

A truncate stops the batch with a message under ``envelope_truncate: fail``; under ``ignore`` it is read, counted
and skipped by the cdc writer (:func:`sluice_spark.write.cdc.flagged`).
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from sluice.constants import DEBEZIUM_OP_COLUMN, DEBEZIUM_SEQUENCE_COLUMN, DEBEZIUM_TS_COLUMN, OnTruncate
from sluice.model.sources import SourceSpec

TRUNCATE = "t"
_TIEBREAK_DIGITS = 20


def _unwrapped(variant: Column) -> Column:
    """Kafka Connect's JSON converter puts the event under ``payload`` (with ``schemas.enable``)."""
    return F.coalesce(F.try_variant_get(variant, "$.payload", "variant"), variant)


def debezium_text(text: Column, source: SourceSpec, *, key: Column | None = None,
                  timestamp: Column | None = None, stream: str = "") -> Column:
    """The JSON text of the row an event's ``text`` carries, with its operation, ts_ms and sequence; a Kafka
    record's ``key`` and ``timestamp`` make a tombstone (``text`` NULL) a delete of that key."""
    event = _unwrapped(F.try_parse_json(text))
    op = F.try_variant_get(event, "$.op", "string")
    row = F.when(op == "d", F.try_variant_get(event, "$.before", "variant")).otherwise(
        F.try_variant_get(event, "$.after", "variant"))
    ts_ms = F.try_variant_get(event, "$.ts_ms", "bigint")
    if key is not None and timestamp is not None:
        tombstone = text.isNull() & key.isNotNull()
        op = F.when(tombstone, F.lit("d")).otherwise(op)
        row = F.when(tombstone, _unwrapped(F.try_parse_json(key))).otherwise(row)
        ts_ms = F.when(tombstone, F.unix_millis(timestamp)).otherwise(ts_ms)
    tiebreak = (F.lit(0) if source.envelope_tiebreak is None
                else F.try_variant_get(event, f"$.{source.envelope_tiebreak}", "bigint"))
    padded = F.lpad(F.coalesce(tiebreak, F.lit(0)).cast("string"), _TIEBREAK_DIGITS, "0")
    digits = F.concat(ts_ms.cast("string"), padded)
    sequence = F.when(ts_ms.isNotNull(), digits).cast("decimal(38,0)")
    marks = F.to_json(F.struct(op.alias(DEBEZIUM_OP_COLUMN), ts_ms.alias(DEBEZIUM_TS_COLUMN),
                               sequence.alias(DEBEZIUM_SEQUENCE_COLUMN)))
    body = F.to_json(row)
    # {"a":1} and {"__op":...} make {"a":1,"__op":...}: the row's fields, then the marks.
    joined = F.when(body == "{}", marks).otherwise(F.concat(body.substr(F.lit(1), F.length(body) - 1), F.lit(","),
                                                            marks.substr(F.lit(2), F.length(marks) - 1)))
    truncated = marks
    if source.envelope_truncate is OnTruncate.FAIL:
        truncated = F.raise_error(F.lit(
            f"stream '{stream}': a Debezium truncate event (op 't') empties the table, which a feed of changes by "
            "key cannot follow; set source.envelope_truncate: ignore to skip such events")).cast("string")
    # Not an event (no operation, or no row to change): the record as it came, for the dead letters.
    return (F.when(op == TRUNCATE, truncated).when(op.isNull() | row.isNull() | (body == "null"), text)
            .otherwise(joined))
