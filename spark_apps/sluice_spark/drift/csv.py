"""CSV files whose header changes, read under a drift policy: each file's columns are matched to the schema by the
names in its header, and the columns the schema does not declare are rescued, added or refused, as the policy says.

Spark's CSV reader takes one header for every file (it checks each file's against the schema, or ignores it), so a
file with a new column fails the run, or lands its values in the wrong columns. Here every step that reads CSV text
is still Spark's own parser, with the stream's options, so that quoting, escapes, comments, ``multiLine``,
whitespace and ``nullValue`` mean what they mean to Spark:

1. Spark's reader splits the files into records and drops each file's header line (``header``, with
   ``enforceSchema``: no check), reading the declared number of fields as text. A record with another number of
   fields keeps its text in ``_corrupt_record``.
2. The header is each file's first record, read from the file by the executors (:func:`first_record`: the first
   line that is not blank or a comment, or as many lines as a quoted header spans under ``multiLine``).
3. A header, and a record Spark did not split into the declared number of fields, is split again by
   ``from_csv`` with a marker field appended: the marker's position is the number of fields (Spark's reader
   says nothing else about it).
4. A record is malformed when its number of fields is not its header's (a dead letter, with its text). Otherwise
   each declared column takes the field under its name (without case, as Spark compares headers; NULL when the
   header lacks it), and the fields of undeclared names go to the policy.
5. A declared string column takes its field's text as it is. The others are typed by ``from_csv`` over one
   canonical line (written by ``to_csv``: every value quoted and kept whole, NULL as the stream's ``nullValue``),
   with the stream's ``nullValue``, ``timestampFormat``, ``dateFormat`` and ``timeZone``: the conversions of
   Spark's reader. A value that does not fit is rescued, as for any CSV record.

A run reads a stream first with :func:`conform_checked`: Spark's typed reader, checking each file's header
against the declared names, gives the rows of the common case at its own cost (the steps above would spend a
Python UDF per row and a second typing), and a file with another header fails the query, which the run plans
again with :func:`conform` (:func:`plan_by_header`).

Limits: a header may name at most :data:`EXTRA_FIELDS` more columns than the schema declares (a file with more is
malformed whole); a header that repeats a name (without case) makes its file's records malformed; a record that
Spark split into the declared number of fields keeps, as a dead letter, its fields re-quoted, not its bytes.
"""

from __future__ import annotations

import bz2
import operator
import re
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache, reduce
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sluice.constants import CORRUPT_COLUMN, RESCUED_COLUMN, SOURCE_FILE_COLUMN, SchemaEvolution
from sluice.errors import SluiceError
from sluice.model.sources import SourceSpec
from sluice.model.types import quote
from sluice.storage.checkpoint import local_file_path
from sluice.storage.store import folder, is_local
from sluice_spark.drift.fields import column_like_key, field_key, key_of
from sluice_spark.targets import CSV_FIELDS_COLUMN, NEW_COLUMNS_COLUMN, NEW_FIELDS_COLUMN

if TYPE_CHECKING:
    from sluice.model.stream import StreamSpec
    from sluice.paths import Roots

#: How many more columns than the schema declares a file's header may name.
EXTRA_FIELDS = 64
# How much of a file is read to find its header.
_HEAD_BYTES = 1 << 20
# The options that say how CSV text splits into fields, as Spark's reader and from_csv take them.
_SPLIT_OPTIONS = frozenset({"sep", "delimiter", "quote", "escape", "nullValue", "emptyValue", "ignoreLeadingWhiteSpace",
                            "ignoreTrailingWhiteSpace"})
# The options that say how a field's text becomes a value.
_VALUE_OPTIONS = frozenset({"nullValue", "timestampFormat", "dateFormat", "timeZone"})
_PAD = "_sluice_pad"
# The steps' columns (:func:`conform`).
(_HEADER, _PLAIN, _HEADER_SPLIT, _RECORD_SPLIT, _NAMES, _HEADER_COUNT, _FIELDS, _COUNT, _FOLDED, _OK, _VALUE,
 _UNDECLARED, _TYPED) = (f"_sluice_csv_{name}" for name in (
    "header", "plain", "header_split", "record_split", "names", "header_count", "fields", "count", "folded", "ok",
    "value", "undeclared", "typed"))
_LINE_END = re.compile(r"\r\n|\r|\n")
# What Java's String.trim removes: every character up to the space.
_JAVA_BLANK = "".join(map(chr, range(33)))
# How much of a file is read first for its header.
_FIRST_BYTES = 1 << 16
# Hadoop's codecs whose files this module cannot read a header from.
_OTHER_CODECS = frozenset({"zst", "lz4", "snappy", "br", "xz", "lzo"})
# The file source's own columns the header's cache is keyed by.
_MODIFIED, _SIZE, _MISFIT, _NEW_NAMES = ("_sluice_csv_modified", "_sluice_csv_size", "_sluice_csv_misfit",
                                         "_sluice_csv_new_names")


def first_record(head: bytes, *, encoding: str = "utf-8", line_sep: str | None = None, comment: str | None = None,
                 quote_char: str = '"', escape: str = "\\", multi_line: bool = False,
                 complete: bool = False) -> str | None:
    """The header of a CSV file from its first bytes: its first line that is not blank (Java's ``trim``) or a
    comment (Spark's ``filterCommentAndEmpty``), and under ``multiLine`` as many more lines as a quoted name spans.
    None when the bytes hold none; with ``complete``, also when the bytes may end inside it (no line end after it)."""
    text = head.decode(encoding, errors="replace").removeprefix("\ufeff")  # a byte order mark names nothing
    # Hadoop's line reader ends a line at \n, \r\n or \r only (str.splitlines knows more).
    lines = text.split(line_sep) if line_sep else _LINE_END.split(text)
    pending: list[str] = []
    last = len(lines) - 1
    for index, line in enumerate(lines):
        if not pending and (not line.strip(_JAVA_BLANK) or (comment and line.startswith(comment))):
            continue
        if complete and index == last:
            return None  # the bytes may end inside this line
        pending.append(line)
        record = "\n".join(pending)
        if not multi_line or _quotes_closed(record, quote_char, escape):
            return record
    return None


def _quotes_closed(text: str, quote_char: str, escape: str) -> bool:
    """Whether every quoted value of ``text`` is closed (an escaped quote, or a doubled one, closes nothing)."""
    inside, index = False, 0
    while index < len(text):
        char = text[index]
        if inside and char == escape and escape != quote_char and index + 1 < len(text):
            index += 2
            continue
        if char == quote_char:
            if inside and index + 1 < len(text) and text[index + 1] == quote_char:
                index += 2
                continue
            inside = not inside
        index += 1
    return not inside


def _options(source: SourceSpec, names: frozenset[str]) -> dict[str, str]:
    return {key: value for key, value in source.options.items() if key in names}


def _decompressed(name: str, head: bytes) -> bytes:
    """The first bytes of a file as Spark's reader sees them: Hadoop decompresses a file by its suffix."""
    suffix = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if suffix in ("gz", "gzip"):
        return zlib.decompressobj(wbits=31).decompress(head, _HEAD_BYTES)
    if suffix == "deflate":
        return zlib.decompressobj().decompress(head, _HEAD_BYTES)
    if suffix == "bz2":
        return bz2.BZ2Decompressor().decompress(head, _HEAD_BYTES)
    if suffix in _OTHER_CODECS:
        raise SluiceError(f"{name}: a .{suffix} file's header cannot be read here; decompress it, or read the stream "
                          "with schema_evolution: none")
    return head


def _file_head(uri: str, size: int) -> bytes:
    path = local_file_path(uri)
    if is_local(path):
        with open(path, "rb") as handle:
            head = handle.read(size)
    else:
        parent, _, name = path.rpartition("/")
        head = folder(parent).read_head(name, size)
    return _decompressed(path, head)


@lru_cache(maxsize=4096)
def _header_of(uri: str, version: tuple[Any, Any], options: tuple[tuple[str, str], ...]) -> str | None:
    """The header of a file at one version (its modification time and size: a file written again at the same path
    is read again): from its first 64 KiB, or its first MiB when the header runs past them."""
    settings = dict(options)

    def read(size: int, complete: bool) -> str | None:
        return first_record(_file_head(uri, size), encoding=settings.get("encoding", settings.get("charset", "utf-8")),
                            line_sep=settings.get("lineSep"), comment=settings.get("comment"),
                            quote_char=settings.get("quote", '"'), escape=settings.get("escape", "\\"),
                            multi_line=settings.get("multiLine", "false").lower() == "true", complete=complete)

    if uri.lower().endswith(".bz2"):  # bz2 gives whole blocks of up to 900 KB only
        return read(_HEAD_BYTES, False)
    return read(_FIRST_BYTES, True) or read(_HEAD_BYTES, False)


def header_text(options: tuple[tuple[str, str], ...]) -> Any:
    """A pandas UDF: a file (its ``_metadata.file_path``) -> its header's text, each file read once per Python
    worker. pandas is imported here, not with the module: a third of a second that only a stream reading CSV headers
    needs (every run imports this module)."""
    import pandas as pd

    def header(files: pd.Series, modified: pd.Series, sizes: pd.Series) -> pd.Series:
        # A batch of rows holds a few files (each at one version): each is looked up once.
        versions = pd.DataFrame({"file": files, "modified": modified, "size": sizes}).drop_duplicates("file")
        found = {row.file: _header_of(row.file, (row.modified, row.size), options)
                 for row in versions.itertuples(index=False)}
        return files.map(found)

    # Spark reads the UDF's kind from its type hints, which name the module-level ``pd`` as text: given as types.
    header.__annotations__ = {"files": pd.Series, "modified": pd.Series, "sizes": pd.Series, "return": pd.Series}
    return F.pandas_udf(header, "string")  # type: ignore[call-overload]


# The escapes Spark's CSVExprUtils.toChar reads in a separator.
_ESCAPED = {"\\t": "\t", "\\r": "\r", "\\b": "\b", "\\f": "\f", '\\"': '"', "\\'": "'", "\\\\": "\\"}


def delimiter(options: Mapping[str, str]) -> str:
    """The field separator as Spark's reader takes it from ``sep`` (or ``delimiter``): ``\\t`` written out is a tab,
    as for ``CSVExprUtils.toDelimiterStr``."""
    written = options.get("sep", options.get("delimiter", ","))
    found, index = [], 0
    while index < len(written):
        step = 2 if written[index] == "\\" else 1
        part = written[index:index + step]
        found.append(_ESCAPED.get(part, part))
        index += step
    return "".join(found)


def _marker(options: Mapping[str, str]) -> str:
    """A field no option can split or change: letters only, none of them a separator, quote or escape."""
    used = set(delimiter(options) + "".join(options.get(key, "") for key in ("quote", "escape", "comment")))
    for marker in ("SluiceEndOfRecord", "QzxEndMarker", "XyzzyPlugh"):
        if not used & set(marker):
            return marker
    return "\u2063\u2063"  # an invisible separator: no stream splits on it


def split_fields(text: Column, options: Mapping[str, str], width: int) -> Column:
    """``text`` split into fields by ``from_csv`` with the stream's options and a marker field appended: a struct
    of ``width + 1`` strings (:func:`fields_and_count` reads it). Name it in a step of its own: every reference to a
    field of an unnamed ``from_csv`` parses the text again."""
    separator = delimiter(options)
    schema = ", ".join(f"`f{index}` STRING" for index in range(width + 1))
    return F.from_csv(F.concat(text, F.lit(separator + _marker(options))), F.lit(schema),
                      {**options, "mode": "PERMISSIVE"})


def fields_and_count(parsed: Column, options: Mapping[str, str], width: int) -> tuple[Column, Column]:
    """A split's fields as an array, and how many there are (-1 when more than ``width``, or when the text does not
    end where a field ends)."""
    fields = F.array(*[parsed[f"f{index}"] for index in range(width + 1)])
    count = F.array_position(fields, _marker(options)) - 1
    return F.slice(fields, 1, F.greatest(count, F.lit(1))), count


def _requoted(value: Column, options: Mapping[str, str]) -> Column:
    """A field as the stream's own CSV would write it: quoted, its quotes escaped with the stream's ``escape``,
    NULL as its ``nullValue``."""
    quote_char = options.get("quote", '"') or '"'
    escape = options.get("escape", "\\")
    escaped = F.replace(F.replace(value, F.lit(escape), F.lit(escape * 2)), F.lit(quote_char),
                        F.lit(escape + quote_char)) if escape and escape != quote_char else F.replace(
        value, F.lit(quote_char), F.lit(quote_char * 2))
    return F.coalesce(F.concat(F.lit(quote_char), escaped, F.lit(quote_char)), F.lit(options.get("nullValue", "")))


def conform(frame: DataFrame, source: SourceSpec) -> DataFrame:
    """Spark's reader's rows (the declared number of fields as text, ``_corrupt_record``, ``_source_file``) matched
    to the schema by their files' headers: the declared columns typed, ``_corrupt_record``, ``_rescued_data``,
    ``_source_file`` and the declared fields as text (:data:`CSV_FIELDS_COLUMN`, for the dead-letter reasons).

    Built in steps, each naming what it makes: a Column is a tree, and one expression holding the splits once per
    declared column would be too large to plan."""
    names = source.read_schema.names
    width = len(names) + EXTRA_FIELDS
    split = _options(source, _SPLIT_OPTIONS)
    separator = delimiter(source.options)
    text_columns = [F.col(quote(name)) for name in names]
    raw = F.col(CORRUPT_COLUMN)

    # 1. The file's header, once per file on a worker; whether it is the declared names as they are (the common
    # case, which needs no split).
    header = header_text(tuple(sorted(source.options.items())))(F.col(SOURCE_FILE_COLUMN), F.col(_MODIFIED),
                                                                F.col(_SIZE))
    special = {separator, source.options.get("quote", '"'), source.options.get("escape", "\\"), " ", "\t"}
    splits_plainly = not any(char in name for name in names for part in special if part for char in part)
    staged = frame.withColumn(_HEADER, header).withColumn(
        _PLAIN, F.coalesce(F.col(_HEADER) == F.lit(separator.join(names)), F.lit(False)) if splits_plainly
        else F.lit(False))
    plain = F.col(_PLAIN)
    # 2. Otherwise the header's names and the record's fields, split by Spark's parser (a record Spark's reader split
    # into the declared number of fields needs no split).
    staged = staged.withColumns({
        _HEADER_SPLIT: F.when(~plain, split_fields(F.col(_HEADER), split, width)),
        _RECORD_SPLIT: F.when(~plain & raw.isNotNull(), split_fields(raw, split, width))})
    header_fields, header_count = fields_and_count(F.col(_HEADER_SPLIT), split, width)
    record_fields, record_count = fields_and_count(F.col(_RECORD_SPLIT), split, width)
    # A header's empty name is `_c<i>`, as Spark names a column it has no name for.
    staged = staged.withColumns({
        _NAMES: F.when(~plain, F.transform(header_fields,
                                           lambda name, index: F.coalesce(name, F.concat(F.lit("_c"), index)))),
        _HEADER_COUNT: header_count,
        _FIELDS: F.when(~plain, F.when(raw.isNull(), F.array(*text_columns)).otherwise(record_fields)),
        _COUNT: F.when(raw.isNull(), F.lit(len(names))).otherwise(record_count)})
    # 3. Whether the record splits as its header does: the header split, names no name twice (without case), and
    # the record has as many fields. Under the declared header, whether Spark's reader split it so.
    folded = F.transform(F.col(_NAMES), F.lower)
    staged = staged.withColumns({_FOLDED: folded, _OK: F.when(plain, raw.isNull()).otherwise(
        (F.col(_HEADER_COUNT) > 0) & (F.size(F.array_distinct(folded)) == F.size(folded))
        & (F.col(_COUNT) == F.col(_HEADER_COUNT)))})
    # 4. Each declared column's field, by its name in the header; the undeclared names' fields.
    well_formed = F.col(_OK)

    def field(name: str, text: Column) -> Column:
        position = F.array_position(F.col(_FOLDED), F.lower(F.lit(name)))
        by_name = F.when(well_formed & (position > 0),
                         F.element_at(F.col(_FIELDS), F.greatest(position, F.lit(1)).cast("int")))
        return F.when(plain, F.when(well_formed, text)).otherwise(by_name)

    declared_folded = F.array(*[F.lower(F.lit(name)) for name in names])
    undeclared = F.map_filter(F.map_from_arrays(F.col(_NAMES), F.col(_FIELDS)),
                              lambda key, value: value.isNotNull() & ~F.array_contains(declared_folded, F.lower(key)))
    values = [f"{_VALUE}{index}" for index in range(len(names))]
    staged = staged.withColumns({
        **{value: field(name, text) for value, name, text in zip(values, names, text_columns, strict=True)},
        _UNDECLARED: F.when(~plain & well_formed, undeclared),
        _NEW_NAMES: F.when(~plain & well_formed, F.filter(F.col(_NAMES), lambda name: ~F.array_contains(
            declared_folded, F.lower(name))))})
    requoted = F.concat_ws(separator, *[_requoted(column, source.options) for column in text_columns])
    return _typed(staged, source, well_formed, corrupt=F.coalesce(raw, requoted),
                  undeclared=F.coalesce(F.col(_UNDECLARED), F.create_map().cast("map<string,string>")),
                  new_names=F.col(_NEW_NAMES))


def _typed(staged: DataFrame, source: SourceSpec, well_formed: Column, *, corrupt: Column,
           undeclared: Column | None, new_names: Column | None, read: Mapping[str, Column] | None = None,
           typed_whole: Column | None = None) -> DataFrame:
    """Steps 5 to 7 of :func:`conform`: the declared fields (``_sluice_csv_value<i>``, text) typed, the misfits
    found, and the row as the file source gives it with the policy's columns. ``read`` are the values Spark's
    reader typed itself, taken where ``typed_whole`` (the rows it typed without a failure); the others are typed
    here. ``undeclared`` and ``new_names`` are None for a header that is the declared names (nothing undeclared):
    the policy's columns are then built without a map (:func:`_declared_policy_columns`)."""
    names = source.read_schema.names
    values = [f"{_VALUE}{index}" for index in range(len(names))]
    # 5. The declared fields typed by Spark's CSV conversions, from one canonical line: Spark's CSV writer quotes
    # every value and writes NULL as the stream's nullValue, which the conversion reads back as NULL.
    canonical = F.to_csv(F.struct(*[F.col(value) for value in values], F.lit("p").alias(_PAD)),
                         {"sep": ",", "quote": '"', "escape": '"', "quoteAll": "true",
                          "nullValue": source.options.get("nullValue", ""),
                          # Spark's CSV writer trims values unless told not to.
                          "ignoreLeadingWhiteSpace": "false", "ignoreTrailingWhiteSpace": "false"})
    value_options = {"sep": ",", "quote": '"', "escape": '"', "emptyValue": "", "mode": "PERMISSIVE",
                     **_options(source, _VALUE_OPTIONS)}
    typed_schema = f"{source.read_schema.ddl(nullable_only=True)}, `{_PAD}` STRING"
    parsed = F.from_csv(canonical, F.lit(typed_schema), value_options)
    staged = staged.withColumn(_TYPED, parsed if typed_whole is None else F.when(~typed_whole, parsed))
    # 6. Whether a declared value did not fit its type (most rows: none, and no map is built for them).
    text_typed = {column.name for column in source.read_schema.columns if column.sql_type == "STRING"}
    typed = {name: F.when(well_formed, F.col(value) if name in text_typed else F.col(_TYPED)[name])
             for value, name in zip(values, names, strict=True)}
    unfit = {name: typed[name].isNull() & F.col(value).isNotNull() for value, name in zip(values, names, strict=True)}
    if read is not None and typed_whole is not None:
        typed = {name: F.when(typed_whole, read[name]).otherwise(column) for name, column in typed.items()}
    staged = staged.withColumn(_MISFIT, reduce(operator.or_, unfit.values()))
    # 7. The row as the file source gives it, with the policy's columns.
    misfit = F.col(_MISFIT)
    if undeclared is None or new_names is None:
        policy_columns = _declared_policy_columns(source.schema_evolution, misfit, F.to_json(F.struct(
            *[F.when(unfit[name], F.col(value)).alias(field_key(name))
              for value, name in zip(values, names, strict=True)]), {"ignoreNullFields": "true"}))
    else:
        misfits = F.when(misfit, F.map_filter(F.create_map(*[part for value, name in zip(values, names, strict=True)
                                                             for part in (F.lit(field_key(name)),
                                                                          F.when(unfit[name], F.col(value)))]),
                                              lambda _, found: found.isNotNull()))
        empty = F.create_map().cast("map<string,string>")
        policy_columns = _policy_columns(source.schema_evolution, undeclared, F.coalesce(misfits, empty), new_names)
    text_fields = F.when(well_formed & misfit, F.struct(
        *[F.col(value).alias(name) for value, name in zip(values, names, strict=True)],
        F.lit(None).cast("string").alias(CORRUPT_COLUMN)))
    return staged.select(*[column.alias(name) for name, column in typed.items()],
                         F.when(~well_formed | misfit, corrupt).alias(CORRUPT_COLUMN), *policy_columns,
                         SOURCE_FILE_COLUMN, text_fields.alias(CSV_FIELDS_COLUMN))


def conform_checked(frame: DataFrame, source: SourceSpec) -> DataFrame:
    """:func:`conform`'s rows from Spark's reader with the declared types, for files whose headers Spark's reader
    checked against the declared names (``enforceSchema`` false: a file with another header fails the query, and
    :func:`header_mismatch` tells the runner to plan it again with :func:`conform`). A record Spark typed whole is
    its row as it is: no header is looked up, nothing is typed again. A record it could not (``_corrupt_record``)
    is split again by Spark's parser and goes through :func:`conform`'s steps 5 to 7, so that its misfits, its
    rescued data and its dead letter are :func:`conform`'s."""
    names = source.read_schema.names
    split = _options(source, _SPLIT_OPTIONS)
    raw = F.col(CORRUPT_COLUMN)
    # Split into the declared number of fields and one more: a record of the declared number of fields has the
    # marker there and nowhere before (fields_and_count's count, without its arrays). Spark compiles a stage into
    # one Java method, and the JVM compiles none of more than 8,000 bytes of bytecode: the arrays of
    # EXTRA_FIELDS more fields made this stage's 23,000, run by the bytecode interpreter for every row.
    staged = frame.withColumn(_RECORD_SPLIT, F.when(raw.isNotNull(), split_fields(raw, split, len(names))))
    parts = [F.col(_RECORD_SPLIT)[f"f{index}"] for index in range(len(names) + 1)]
    marker = F.lit(_marker(split))
    declared_count = reduce(operator.and_, [F.coalesce(part != marker, F.lit(True)) for part in parts[:-1]],
                            F.coalesce(parts[-1] == marker, F.lit(False)))
    # A record Spark's reader split into the declared number of fields, but could not type: conform's well-formed
    # record with a misfit, its dead letter the fields re-quoted.
    well_formed = raw.isNull() | declared_count
    text = raw.isNotNull() & well_formed
    values = [f"{_VALUE}{index}" for index in range(len(names))]
    staged = staged.withColumns({value: F.when(text, part) for value, part in zip(values, parts, strict=False)})
    requoted = F.concat_ws(delimiter(source.options),
                           *[_requoted(F.col(value), source.options) for value in values])
    return _typed(staged, source, well_formed, corrupt=F.when(well_formed, requoted).otherwise(raw),
                  undeclared=None, new_names=None, read={name: F.col(quote(name)) for name in names},
                  typed_whole=raw.isNull())


#: What Spark's reader says of a file whose header is not the declared names (``enforceSchema`` false).
_MISMATCH = ("CSV header does not conform to the schema", "Number of column in CSV header is not equal to number of "
             "fields in the schema")


# Whether the stream being planned may be read by :func:`conform_checked` (a run sets it: it plans a stream again
# when a header does not match); and the streams (by name and landing folder) of this process that met a file
# with another header, read by :func:`conform` from then on.
_CHECKED: ContextVar[bool] = ContextVar("sluice_csv_checked", default=False)
_DRIFTED: set[tuple[str, str]] = set()


@contextmanager
def headers_checked_by_reader() -> Iterator[None]:
    """Within: a CSV stream read by header is planned with :func:`conform_checked`, unless its files have met
    another header in this process. Only a caller that plans a stream again on :func:`header_mismatch` sets it."""
    token = _CHECKED.set(True)
    try:
        yield
    finally:
        _CHECKED.reset(token)


def checks_headers(stream: str, folder: str) -> bool:
    """Whether the stream reading ``folder`` is planned with :func:`conform_checked` (see
    :func:`headers_checked_by_reader`)."""
    return _CHECKED.get() and (stream, folder) not in _DRIFTED


def plan_by_header(stream: StreamSpec, roots: Roots, error: BaseException | None) -> bool:
    """True when a query of ``stream`` planned with :func:`conform_checked` failed on a file whose header is not
    the declared names: the stream is read by :func:`conform` from now on in this process, and its query is to be
    planned and started again (its failed batch is in its offset log, and runs again with the same files). Any
    other stream's query, whatever its source (a table or a topic has no folder), is not asked for its folder."""
    if error is None or not header_mismatch(error):
        return False
    key = (stream.name, stream.source_path(roots))
    if key in _DRIFTED:
        return False
    _DRIFTED.add(key)
    return True


def header_mismatch(error: BaseException | str) -> bool:
    """Whether a query failed because Spark's reader met a CSV file whose header is not the declared names
    (:func:`conform_checked`)."""
    text = str(error)
    return any(message in text for message in _MISMATCH)


def _declared_policy_columns(policy: SchemaEvolution, misfit: Column, misfits: Column) -> list[Column]:
    """:func:`_policy_columns` for a record whose header is the declared names, so that nothing is undeclared:
    ``misfits`` is the JSON of a struct of the misfits (``to_json`` leaves out a NULL field, as ``_policy_columns``
    leaves a NULL value out of its map), written where ``misfit``. The same columns, with no higher-order function
    (``map_filter``, ``transform_keys``): Spark compiles none of them (``CodegenFallback``), and one keeps its whole
    step, the stream's every row, out of whole-stage codegen."""
    if policy is SchemaEvolution.FAIL_ON_NEW_COLUMNS:
        return [F.lit(None).cast("array<string>").alias(NEW_FIELDS_COLUMN)]
    extra = [F.lit(None).cast("string").alias(NEW_COLUMNS_COLUMN)] if policy is SchemaEvolution.ADD_NEW_COLUMNS \
        else []
    return [F.when(misfit, misfits).alias(RESCUED_COLUMN), *extra]


def _policy_columns(policy: SchemaEvolution, undeclared: Column, misfits: Column, new_names: Column) -> list[Column]:
    """The drift policy's columns from a record's undeclared fields (by their header names; NULL ones left out), its
    misfits, and its header's undeclared names: under ``rescue`` the fields and the misfits in ``_rescued_data``;
    under ``add_new_columns`` the fields whose name may be a column's as new columns (CSV text, so strings), the rest
    and the misfits rescued; under ``fail_on_new_columns`` the names, even of an empty column, which stop the batch
    (a misfit makes a dead letter there)."""
    quoted = F.transform_keys(undeclared, lambda key, _: key_of(key))
    empty = F.create_map().cast("map<string,string>")
    nothing = (F.size(undeclared) == 0) & (F.size(misfits) == 0)
    if policy is SchemaEvolution.FAIL_ON_NEW_COLUMNS:
        return [F.when(F.size(new_names) > 0, F.array_sort(F.transform(new_names, key_of))).alias(NEW_FIELDS_COLUMN)]
    rescued = F.map_concat(quoted, misfits)
    extra = []
    if policy is SchemaEvolution.ADD_NEW_COLUMNS:
        columns = F.map_filter(undeclared, lambda key, _: column_like_key(key))
        others = F.transform_keys(F.map_filter(undeclared, lambda key, _: ~column_like_key(key)),
                                  lambda key, _: key_of(key))
        rescued = F.map_concat(F.coalesce(others, empty), misfits)
        extra.append(F.when(F.size(columns) > 0, F.to_json(columns)).alias(NEW_COLUMNS_COLUMN))
    return [F.when(~nothing & (F.size(rescued) > 0), F.to_json(rescued)).alias(RESCUED_COLUMN), *extra]


def file_version() -> list[Column]:
    """The columns of the file source that :func:`conform` keys a file's header by, beside ``_source_file``."""
    return [F.col("_metadata.file_modification_time").alias(_MODIFIED), F.col("_metadata.file_size").alias(_SIZE)]


def read_schema_ddl(source: SourceSpec) -> str:
    """What Spark's reader reads: the declared number of fields, by the declared names (so that a file whose header
    matches draws no warning), as text."""
    return ", ".join([*(f"{quote(name)} STRING" for name in source.read_schema.names), f"`{CORRUPT_COLUMN}` STRING"])

