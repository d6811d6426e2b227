"""Schema drift in Spark: what a record holds that its declared schema does not read.

Under a drift policy (``source.schema_evolution``) a record's text may be parsed twice: with the declared schema, by
Spark's JSON parser (the typed columns, as under ``none``), and as a VARIANT, which keeps every field. Walking the
declared schema over both finds, at any depth:

- **new fields**: keys of an object that its struct does not declare (``coupon``, ``actor.site_admin``,
  ``payload.commits[0].verified``). Names match as Spark's JSON parser matches them: exactly, so ``Amount`` is new
  beside a declared ``amount``;
- **misfits**: values the schema declares but that did not fit their type: the typed value is NULL where the text
  holds one (``"amount": "12,50"`` for a decimal). A struct, array or map that failed as a whole is one misfit.

``rescue`` keeps both, as one JSON object in ``_rescued_data`` whose keys are the paths above and whose values are
the values as they arrived; the row is still good. ``fail_on_new_columns`` lists the new fields' paths in
:data:`NEW_FIELDS_COLUMN`; the writers refuse a batch with any (:func:`sluice_spark.targets.drift_failure`), and a
misfit is a dead letter as under ``none``.

Everything here is a column expression (no Python UDF). Most records are parsed once: only those that may hold a
key the schema does not declare, a misfit, or what the VARIANT's parser refuses are parsed again as a VARIANT. Which
ones is found, where the session has Sluice's JVM classes (``python -m sluice jvm-classes``), by one streaming pass
over each record's tokens on the JVM (``include/jvm/drift``: :func:`_jvm_may_drift`); without them, under a nested
schema, by counting the key ends in the text against the typed values (:func:`_may_drift`), and under a flat schema
every record is parsed twice (measured cheaper than that count). Under ``rescue`` with the JVM classes, the flagged
records' VARIANT parse and walk are one Java call each too (``Rescue.java``: :func:`_jvm_rescue`), the same steps
and bytes as the column expressions, which the other policies keep.

A typed source (a Delta table) has no text to parse: :mod:`sluice_spark.drift.typed` compares its columns with the
declared ones.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Callable, Mapping
from functools import reduce

from py4j.protocol import Py4JError
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StringType

from sluice.constants import CORRUPT_COLUMN, RESCUED_COLUMN, FileFormat, SchemaEvolution
from sluice.kinds.files import names_columns_by_header
from sluice.model.schema import Schema
from sluice.model.sources import SourceSpec
from sluice.model.types import (
    IDENTIFIER,
    Array,
    DataType,
    Field,
    MapType,
    Primitive,
    Struct,
    quote,
)
from sluice_spark.targets import CSV_FIELDS_COLUMN, NEW_COLUMNS_COLUMN, NEW_FIELDS_COLUMN

_ENTRIES = "ARRAY<STRUCT<path: STRING, value: VARIANT>>"
_RAW = "_sluice_raw"
_FOUND = "_sluice_found"
# A name a new column may take: a plain identifier that starts with a letter (a leading '_' is Sluice's).
_COLUMN_NAME = "^[A-Za-z][A-Za-z0-9_]*$"
_TEXT = "_sluice_text"
_TYPED = "_sluice_typed"
_SUSPECT = "_sluice_suspect"
# Bigger records are parsed as a VARIANT whatever they hold: the VARIANT's size limit may refuse them.
_ALWAYS_CHECKED_BYTES = 1 << 20  # MayDrift.ALWAYS_CHECKED_BYTES
#: ``0``: the JSON drift check as column expressions even where the session has Sluice's JVM classes.
JVM_DRIFT_ENV = "SLUICE_JVM_DRIFT"


def parse_json_text(frame: DataFrame, text: Column, schema: Schema, policy: SchemaEvolution,
                    options: Mapping[str, str], keep: Mapping[str, Column]) -> DataFrame:
    """Records of JSON text (the column ``text`` of ``frame``) as the declared columns, ``_corrupt_record`` (the text
    of a record Spark's parser rejected) and the policy's column (``_rescued_data`` under ``rescue``,
    :data:`NEW_FIELDS_COLUMN` under ``fail_on_new_columns``); ``keep`` are carried along (the lineage). A rejected
    record whose misfits were rescued is good after all: the dead-letter split
    (:func:`sluice_spark.steps.quality.dead_letter_reason`) reads both columns.

    Under ``none`` this is Spark's JSON parser alone. Otherwise a record the variant parser cannot read as an object
    is corrupt too: not JSON, a top-level array, or an object with a key given twice (Spark's parser would keep the
    last value silently).
    """
    ddl = f"{schema.ddl(nullable_only=True)}, `{CORRUPT_COLUMN}` STRING"
    parse_options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN, **options}
    typed = F.from_json(text, ddl, parse_options)
    columns = [typed[column.name].alias(column.name) for column in schema.columns]
    kept = [column.alias(name) for name, column in keep.items()]
    # An empty text parses to no struct at all: corrupt, with its (empty) text.
    rejected = F.coalesce(typed[CORRUPT_COLUMN], F.when(typed.isNull(), text)).alias(CORRUPT_COLUMN)
    if policy is SchemaEvolution.NONE:
        return frame.select(*columns, rejected, *kept)
    declared = schema_struct(schema)
    jvm_check = _jvm_may_drift(frame.sparkSession)
    if jvm_check or any(_has_keys(field.type) for field in declared.fields):
        # One parse for most records of a nested schema: Spark's typed one. The VARIANT (the second parse) is for the
        # records that may hold something the typed parse dropped or that the VARIANT's parser refuses
        # (:func:`_may_drift`). Each step names what it makes, so that no parse is planned twice.
        kept_names = [F.col(name) for name in keep]
        parsed = frame.select(typed.alias(_TYPED), text.alias(_TEXT), *kept)
        typed_value, record_text = F.col(_TYPED), F.col(_TEXT)
        rejected = F.coalesce(typed_value[CORRUPT_COLUMN], F.when(typed_value.isNull(), record_text))
        flagged = parsed.select(*[typed_value[column.name].alias(column.name) for column in schema.columns],
                                rejected.alias(CORRUPT_COLUMN), record_text, *kept_names)
        may_drift = F.col(CORRUPT_COLUMN).isNotNull() | F.call_function(
            _MAY_DRIFT, record_text, F.lit(schema.ddl(nullable_only=True))) if jvm_check else \
            _may_drift(declared, record_text, F.col(CORRUPT_COLUMN))
        flagged = flagged.withColumn(_SUSPECT, may_drift)
        if jvm_check and policy is SchemaEvolution.RESCUE:
            return _jvm_rescue(flagged, schema, keep)
        staged = flagged.withColumn(_RAW, F.when(F.col(_SUSPECT), F.try_parse_json(record_text)))
        parsed_again = F.col(_SUSPECT)
    else:
        # A flat schema: every record parsed twice. Flagging its records costs more than the second parse saves
        # (bench_ingest: 3.12x plain Spark against 2.22x; its records hold NULLs, which need the text scanned).
        staged = frame.select(*columns, rejected, F.try_parse_json(text).alias(_RAW), text.alias(_TEXT), *kept)
        parsed_again = F.lit(True)
    raw = F.col(_RAW)
    record = raw.try_cast("MAP<STRING, VARIANT>")
    rescue = policy is not SchemaEvolution.FAIL_ON_NEW_COLUMNS
    adds = policy is SchemaEvolution.ADD_NEW_COLUMNS
    # Most records hold nothing to find: no misfit (Spark's parser flags every one) and no key beyond the declared
    # ones at any depth (counted, without walking). Only the others are walked.
    suspect = ~_clean_or_true(declared, raw)
    if rescue:
        suspect = suspect | F.col(CORRUPT_COLUMN).isNotNull()
    # A record that the VARIANT's parser read and whose text opens with a brace is an object; only the others are
    # cast to find out (a cast copies every value).
    is_object = raw.isNotNull() & (F.col(_TEXT).startswith("{") | record.isNotNull())
    unreadable = parsed_again & ~is_object
    walk = is_object & suspect
    # Under add_new_columns, a new top-level field may become a column when its name is a plain identifier that no
    # declared column takes in another case (Delta's names are case-insensitive); the rest is rescued.
    folded = F.array(*[F.lit(name.casefold()) for name in schema.names])

    def may_be_column(key: Column) -> Column:
        return key.rlike(_COLUMN_NAME) & ~F.array_contains(folded, F.lower(key))

    found = F.when(walk, _struct_entries(declared, raw, None, F.lit(""), misfits=rescue,
                                         root_new=(lambda key: ~may_be_column(key)) if adds else None))
    extra = []
    if adds:
        new_columns = F.map_filter(record, lambda key, _: may_be_column(key))
        extra.append(F.when(walk & (F.size(new_columns) > 0), F.to_json(new_columns)).alias(NEW_COLUMNS_COLUMN))
    walked = staged.select(*[F.col(quote(column.name)) for column in schema.columns],
                           F.when(unreadable, F.col(_TEXT)).otherwise(F.col(CORRUPT_COLUMN)).alias(CORRUPT_COLUMN),
                           found.alias(_FOUND), *extra, *map(F.col, keep))
    entries = F.col(_FOUND)
    if rescue:
        added = F.when(F.size(entries) > 0, F.to_json(F.map_from_entries(entries)))
        name = RESCUED_COLUMN
    else:
        added = F.when(F.size(entries) > 0, F.transform(entries, lambda entry: entry["path"]))
        name = NEW_FIELDS_COLUMN
    names = [F.col(quote(column.name)) for column in schema.columns]
    return walked.select(*names, CORRUPT_COLUMN, added.alias(name), *([NEW_COLUMNS_COLUMN] if adds else []),
                         *map(F.col, keep))


# Sluice's JVM drift check and rescue (include/jvm/drift/sluice/drift/), as the session knows them.
_MAY_DRIFT = "sluice_may_drift"
_MAY_DRIFT_CLASS = "sluice.drift.MayDrift"
_RESCUE = "sluice_rescue"
_RESCUE_CLASS = "sluice.drift.Rescue"
_VERDICT = "_sluice_verdict"


def _jvm_rescue(flagged: DataFrame, schema: Schema, keep: Mapping[str, Column]) -> DataFrame:
    """``rescue``'s columns from the flagged records (:data:`_SUSPECT`) by Sluice's JVM rescue
    (``include/jvm/drift/sluice/drift/Rescue.java``): the same VARIANT parse and walk as the column expressions of
    :func:`parse_json_text`, in one Java call per flagged record, so that no projection holds a higher-order function
    (which kept every record out of Spark's generated code). It returns NULL for a record the VARIANT's parser
    refuses or that is no object (a dead letter, with its text), "" when nothing is rescued."""
    typed = F.struct(*[F.col(quote(column.name)) for column in schema.columns])
    suspect, text = F.col(_SUSPECT), F.col(_TEXT)
    verdict = F.when(suspect, F.call_function(_RESCUE, text, typed, F.col(CORRUPT_COLUMN).isNotNull(),
                                              F.lit(schema.ddl(nullable_only=True))))
    staged = flagged.withColumn(_VERDICT, verdict)
    found = F.col(_VERDICT)
    return staged.select(*[F.col(quote(column.name)) for column in schema.columns],
                         F.when(suspect & found.isNull(), text).otherwise(F.col(CORRUPT_COLUMN)).alias(CORRUPT_COLUMN),
                         F.when(found != "", found).alias(RESCUED_COLUMN), *map(F.col, keep))


def _jvm_may_drift(spark: SparkSession) -> bool:
    """Whether the session has Sluice's JVM drift check (registered here as :data:`_MAY_DRIFT`): false when its jar
    is not on the classpath (``python -m sluice jvm-classes`` never ran), and the check is then column expressions.
    ``SLUICE_JVM_DRIFT=0`` turns it off, to compare both."""
    if os.environ.get(JVM_DRIFT_ENV, "1") == "0":
        return False
    try:
        spark.udf.registerJavaFunction(_MAY_DRIFT, _MAY_DRIFT_CLASS, BooleanType())
        spark.udf.registerJavaFunction(_RESCUE, _RESCUE_CLASS, StringType())
    except (AnalysisException, Py4JError):
        return False
    return True


def field_key(name: str) -> str:
    """A field's name in a path of ``_rescued_data`` and in messages: as it is, quoted when it is no identifier."""
    return name if IDENTIFIER.fullmatch(name) else quote(name)


def column_like_key(key: Column) -> Column:
    """:func:`column_like`, for a key in a frame."""
    return key.rlike(_COLUMN_NAME)


def column_like(name: str) -> bool:
    """Whether a new field's name may be a column's under ``add_new_columns`` (see :data:`_COLUMN_NAME`)."""
    return re.match(_COLUMN_NAME, name) is not None


# Timestamps in JSON with every microsecond (Spark's default keeps milliseconds).
_JSON_TIMES = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
               "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"}


def json_object(entries: list[tuple[str, Column]]) -> Column:
    """The entries whose value is not NULL, as one JSON object; NULL when there is none."""
    if not entries:
        return F.lit(None).cast("string")
    text = F.to_json(F.struct(*[value.alias(key) for key, value in entries]), _JSON_TIMES)
    return F.when(text != "{}", text)


# A key's end in JSON text when no whitespace comes before its colon, and what starts whitespace after a quote.
_KEY_END = '":'
_QUOTE_THEN_BLANK = ('" ', '"\t', '"\n', '"\r')


def _may_drift(declared: Struct, text: Column, rejected: Column) -> Column:
    """False only for a record that Spark's typed parse read whole: no misfit, no more key ends in its text than
    typed values (so no key beyond the declared ones, and none whose value is NULL), nothing the VARIANT's parser
    refuses that Spark's reads (single quotes, NaN and INF, a top-level array; text after the object both ignore),
    and not so big that the VARIANT's size limit may refuse it. Such a record needs no VARIANT: the typed values
    count its keys. A NULL is no typed value: a record holding one is parsed as a VARIANT too, and its keys counted
    there (:func:`_clean`)."""
    keys = _typed_keys(declared, None)
    assert keys is not None, "a record is an object"
    refused = [text.contains(token) for token in ("'", "NaN", "INF", "Infinity", *_QUOTE_THEN_BLANK)]
    odd = reduce(operator.or_, [rejected.isNotNull(), ~text.startswith("{"), ~text.endswith("}"), *refused,
                                F.octet_length(text) > _ALWAYS_CHECKED_BYTES])
    return odd | (_occurrences(text, _KEY_END) > keys)


def _occurrences(text: Column, token: str) -> Column:
    """How many times ``token`` stands in ``text`` (without a regular expression: a third of a parse)."""
    return (F.octet_length(text) - F.octet_length(F.replace(text, F.lit(token), F.lit("")))) / len(token.encode())


def _typed_keys(data_type: DataType, typed: Column | None) -> Column | None:
    """How many keys a typed value of ``data_type`` surely held (``typed`` None: the record's own columns): its
    fields that are not NULL, a map's entries, at every depth; None for a type without keys."""
    if isinstance(data_type, Struct):
        counts: list[Column] = []
        for field in data_type.fields:
            child = F.col(quote(field.name)) if typed is None else typed.getField(field.name)
            counts.append(child.isNotNull().cast("int"))
            inner = _typed_keys(field.type, child)
            if inner is not None:
                counts.append(F.coalesce(inner, F.lit(0)))
        return reduce(operator.add, counts) if counts else None
    if not _has_keys(data_type):
        return None
    assert typed is not None, "a record is a struct"

    def keys_of(element_type: DataType, element: Column) -> Column:
        found = _typed_keys(element_type, element)
        return F.lit(0) if found is None else F.coalesce(found, F.lit(0))

    if isinstance(data_type, Array):
        return F.aggregate(typed, F.lit(0), lambda total, element: total + keys_of(data_type.element, element))
    assert isinstance(data_type, MapType)
    entries = F.size(typed)
    if not _has_keys(data_type.value):
        return entries
    return entries + F.aggregate(F.map_values(typed), F.lit(0),
                                 lambda total, value: total + keys_of(data_type.value, value))


def _has_keys(data_type: DataType) -> bool:
    """Whether a value of this type holds keys of its own (an object, at any depth)."""
    if isinstance(data_type, Array):
        return _has_keys(data_type.element)
    return isinstance(data_type, (Struct, MapType))


def _clean(data_type: DataType, raw: Column) -> Column | None:
    """True when ``raw`` holds no key its type does not declare, at any depth (NULL when it is not the shape its type
    says, which Spark's parser flags); None when a value of this type has no keys to check."""
    if isinstance(data_type, Struct):
        fields = raw.try_cast("MAP<STRING, VARIANT>")
        present = [F.map_contains_key(fields, field.name).cast("int") for field in data_type.fields]
        checks = [F.size(fields) == reduce(operator.add, present)]
        checks += [_clean_or_true(field.type, F.try_element_at(fields, F.lit(field.name)))
                   for field in data_type.fields if _hides(field.type, misfits=False)]
        return reduce(operator.and_, checks)
    if isinstance(data_type, Array) and _hides(data_type.element, misfits=False):
        return F.forall(raw.try_cast("ARRAY<VARIANT>"), lambda element: _clean_or_true(data_type.element, element))
    if isinstance(data_type, MapType) and data_type.key == Primitive("STRING") and _hides(data_type.value,
                                                                                          misfits=False):
        return F.forall(F.map_values(raw.try_cast("MAP<STRING, VARIANT>")),
                        lambda value: _clean_or_true(data_type.value, value))
    return None


def _clean_or_true(data_type: DataType, raw: Column) -> Column:
    """:func:`_clean`, where a value with nothing to check, or not of its type's shape, counts as clean."""
    clean = _clean(data_type, raw)
    return F.lit(True) if clean is None else F.coalesce(clean, F.lit(True))


def schema_struct(schema: Schema) -> Struct:
    return Struct(tuple(Field(column.name, column.data_type) for column in schema.columns))


def reads_by_header(source: SourceSpec) -> bool:
    """Whether a source's CSV files are matched to its schema by the names in their headers
    (:mod:`sluice_spark.drift.csv`): under a drift policy, with ``header``, and without ``enforceSchema``, which asks
    for columns by position."""
    return (source.format is FileFormat.CSV and source.schema_evolution is not SchemaEvolution.NONE
            and names_columns_by_header(source.options))


def reparse_as_text(source: SourceSpec) -> Column | None:
    """A corrupt JSON, CSV or Parquet record parsed again with every declared field as a string: what each field
    held before the cast (NULL for another format). A CSV record read by its header has its declared fields as text
    beside it already (NULL when it is malformed)."""
    if reads_by_header(source):
        return F.col(CSV_FIELDS_COLUMN)
    columns = ", ".join(f"{quote(name)} STRING" for name in source.read_schema.names)
    schema = f"{columns}, `{CORRUPT_COLUMN}` STRING"
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
    if source.format is FileFormat.PARQUET:  # a record with a misfit, as JSON (:mod:`sluice_spark.drift.parquet`)
        return F.from_json(F.col(CORRUPT_COLUMN), schema, options)
    options.update(source.record_options)
    if source.format is FileFormat.JSON:
        return F.from_json(F.col(CORRUPT_COLUMN), schema, options)
    if source.format is FileFormat.CSV:
        csv_options = {k: v for k, v in options.items() if k not in {"header", "pathGlobFilter"}}
        return F.from_csv(F.col(CORRUPT_COLUMN), F.lit(schema), csv_options)
    return None


def rescue_csv(source: SourceSpec) -> Column:
    """A CSV record's ``_rescued_data`` under ``rescue``: the values that did not fit their type, as the record's
    text held them (``{"amount": "12,50"}``). A record whose text does not split into the declared fields rescues
    nothing: it is malformed."""
    reparsed = reparse_as_text(source)
    assert reparsed is not None
    fields = source.read_schema.names
    misfits = F.map_filter(
        F.create_map(*[part for name in fields for part in (
            F.lit(field_key(name)), F.when(F.col(quote(name)).isNull(), reparsed[name]))]),
        lambda _, value: value.isNotNull())
    split = F.col(CORRUPT_COLUMN).isNotNull() & reparsed[CORRUPT_COLUMN].isNull() & reparsed.isNotNull()
    return F.when(split & (F.size(misfits) > 0), F.to_json(misfits))


def _empty() -> Column:
    return F.expr(f"CAST(array() AS {_ENTRIES})")


def _entry(path: Column, value: Column) -> Column:
    return F.struct(path.alias("path"), value.alias("value"))


def key_of(name: Column) -> Column:
    """A top-level field's key in ``_rescued_data``: its name, quoted when it is no identifier."""
    return _child_path(F.lit(""), name)


def _child_path(path: Column, name: Column) -> Column:
    """``parent.name``, with a name that is not a plain identifier quoted with backticks."""
    quoted = F.when(name.rlike(f"^{IDENTIFIER.pattern}$"), name).otherwise(
        F.concat(F.lit("`"), F.replace(name, F.lit("`"), F.lit("``")), F.lit("`")))
    return F.when(path == "", quoted).otherwise(F.concat(path, F.lit("."), quoted))


def _present(raw: Column) -> Column:
    return raw.isNotNull() & ~F.is_variant_null(raw)


def _entries(data_type: DataType, raw: Column, typed: Column, path: Column, *, misfits: bool) -> Column | None:
    """What the value ``raw`` holds under ``data_type`` that the typed value lacks, as an array of (path, value);
    None when this type can hide nothing (a string takes any JSON value as its text)."""
    if isinstance(data_type, Primitive):
        deeper = None
    elif isinstance(data_type, Struct):
        deeper = _struct_entries(data_type, raw, typed, path, misfits=misfits)
    elif isinstance(data_type, Array) and _hides(data_type.element, misfits=misfits):
        elements = raw.try_cast("ARRAY<VARIANT>")
        deeper = F.flatten(F.transform(elements, lambda element, index: _required(_entries(
            data_type.element, element, F.try_element_at(typed, index + 1),
            F.concat(path, F.lit("["), index.cast("string"), F.lit("]")), misfits=misfits))))
    elif isinstance(data_type, MapType) and data_type.key == Primitive("STRING") and _hides(data_type.value,
                                                                                          misfits=misfits):
        values = raw.try_cast("MAP<STRING, VARIANT>")
        deeper = F.flatten(F.transform(F.map_entries(values), lambda entry: _required(_entries(
            data_type.value, entry["value"], F.try_element_at(typed, entry["key"]),
            _child_path(path, entry["key"]), misfits=misfits))))
    else:
        deeper = None
    if not (misfits and data_type != Primitive("STRING")):
        return deeper
    whole = F.array(_entry(path, raw))
    if deeper is None:
        return F.when(typed.isNull() & _present(raw), whole).otherwise(_empty())
    return F.when(typed.isNull() & _present(raw), whole).otherwise(F.coalesce(deeper, _empty()))


def _hides(data_type: DataType, *, misfits: bool) -> bool:
    """Whether a value of this type can hold something its typed value lacks (see :func:`_entries`)."""
    if misfits:
        return data_type != Primitive("STRING")
    if isinstance(data_type, Struct):
        return True
    if isinstance(data_type, Array):
        return _hides(data_type.element, misfits=misfits)
    if isinstance(data_type, MapType):
        return _hides(data_type.value, misfits=misfits)
    return False


def _required(found: Column | None) -> Column:
    assert found is not None, "a type that hides nothing is not walked"
    return F.coalesce(found, _empty())


def _struct_entries(data_type: Struct, raw: Column, typed: Column | None, path: Column, *, misfits: bool,
                    root_new: Callable[[Column], Column] | None = None) -> Column:
    """An object's new keys, and what its declared fields hide (``typed`` None: the record's own columns).
    ``root_new`` keeps only the new keys it is true for (the record's own, under ``add_new_columns``)."""
    fields = raw.try_cast("MAP<STRING, VARIANT>")
    declared = F.array(*[F.lit(field.name) for field in data_type.fields])

    def is_new(key: Column) -> Column:
        undeclared = ~F.array_contains(declared, key)
        return undeclared if root_new is None else undeclared & root_new(key)

    new = F.transform(F.map_entries(F.map_filter(fields, lambda key, _: is_new(key))),
                      lambda entry: _entry(_child_path(path, entry["key"]), entry["value"]))
    parts = [F.coalesce(new, _empty())]
    for field in data_type.fields:
        child = F.col(f"`{field.name.replace('`', '``')}`") if typed is None else typed.getField(field.name)
        found = _entries(field.type, F.try_element_at(fields, F.lit(field.name)), child,
                         _child_path(path, F.lit(field.name)), misfits=misfits)
        if found is not None:
            parts.append(F.coalesce(found, _empty()))
    return F.concat(*parts) if len(parts) > 1 else parts[0]
