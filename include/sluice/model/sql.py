"""Spark SQL in the catalog, read without Spark: the checks of expectations and the SQL transforms.

Both are parsed with sqlglot's Spark dialect when the catalog loads, so that a typo, a column that does not exist or
a check that is not a boolean fails in the scheduler with the rule or transform named, not in a Spark run hours
later. Column types come from the declared schema; sqlglot infers the type of each expression from them. Where it
cannot (a function it does not type, a column a Python transform adds), Spark checks at the start of the run.

A SQL transform is one ``SELECT`` of expressions over ``source``, the parsed good rows: every row in gives exactly
one row out, because the row reconciliation and the dead-letter split depend on it. Filters, aggregates, joins,
set operations, generators and windows are refused with the reason and where each belongs instead.

Every piece of catalog text that becomes Spark SQL (a transform, a check, a fan-out's ``where``, a measure) goes
through :func:`parse_sql`, an allowlist of expression forms and functions (:mod:`sluice.model.sql_functions`): catalog
SQL computes values from its row, and reaches nothing else (no program, no JVM method, no other table, no setting).
"""

from __future__ import annotations

import bisect
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum

import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError, ParseError, SqlglotError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify
from sqlglot.tokens import Token, TokenType

from sluice.limits import SQL_MAX_CHARS, SQL_MAX_DEPTH
from sluice.model.sql_functions import AGGREGATE_FUNCTIONS, ROW_FUNCTIONS, SYNTAX_BEFORE_PARENTHESIS
from sluice.model.types import quote

DIALECT = "spark"
SOURCE_TABLE = "source"
# The type a schema entry gets when nobody knows it (a column a Python transform adds).
_UNKNOWN = "UNKNOWN"

#: Name -> Spark SQL type (None when unknown): the columns an expression may name.
Columns = Mapping[str, str | None]


class SqlError(ValueError):
    """SQL the catalog cannot accept; the message says why and where."""


@dataclass(frozen=True)
class Projection:
    """One item of a SQL transform's select list: the user's text, and the column it produces (None for a star,
    which keeps the input's columns but those in ``excluded``)."""

    text: str
    name: str | None = None
    excluded: tuple[str, ...] = ()


@dataclass(frozen=True)
class SqlTransform:
    """A row transform in Spark SQL, checked: what it selects and the columns (with types, when known) it gives."""

    sql: str
    alias: str
    projections: tuple[Projection, ...]
    columns: tuple[tuple[str, str | None], ...]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.columns]


class Shape(Enum):
    """What a piece of catalog SQL is, which decides what it may contain."""

    # A boolean or a value over one row: an expectation's check, a fan-out's where.
    ROW = "row"
    # One measure of an aggregate: an aggregate function over a column of the group.
    GROUP = "group"
    # A SQL transform: SELECT <row expressions> FROM source.
    SELECT = "select"


def parse_sql(text: object, *, what: str, shape: Shape) -> exp.Expr:
    """The one gate between catalog text and Spark SQL: ``text`` parsed, or a :class:`SqlError` that names ``what``
    and the construct it refuses.

    An allowlist, not a denylist: every function must be one of :mod:`sluice.model.sql_functions` (as written, so
    that a quoted or qualified name cannot pass for another) and every other node one of the expression forms a row
    needs (:data:`_NODES`). Refused everywhere: script transforms (``TRANSFORM ... USING``), reflection, subqueries,
    table functions, generators, windows, variables (``${...}``, ``:name``, ``?``), hints; aggregates outside an
    aggregate's measures. The text's length and nesting are bounded first, so that any input is refused in bounded
    time and memory, before the parser recurses.
    """
    if not isinstance(text, str) or not text.strip():
        raise SqlError(f"{what} must be a non-empty Spark SQL {'statement' if shape is Shape.SELECT else 'expression'}")
    if len(text) > SQL_MAX_CHARS:
        raise SqlError(f"{what} is {len(text):,} characters long; at most {SQL_MAX_CHARS:,}")
    if "${" in text:
        raise SqlError(f"{what} holds '${{': Spark substitutes ${{...}} (environment variables, Spark settings, "
                       "credentials among them) into SQL before it runs it; write the value itself")
    tokens = _tokenize(text, what)
    _check_tokens(tokens, text, what)
    try:
        node = _parse(text, what, shape)
        _check_depth(node, what)
        items = _select_items(node, what) if shape is Shape.SELECT else [node]
        for item in items:
            _check_nodes(item, text, what, shape)
        _check_called_names(tokens, what, shape)
    except RecursionError:
        raise SqlError(f"{what} nests too deeply to be read; at most {SQL_MAX_DEPTH} levels") from None
    return node


def _tokenize(text: str, what: str) -> list[Token]:
    try:
        return sqlglot.Dialect.get_or_raise(DIALECT).tokenize(text)
    except Exception as exc:  # as for the parser: whatever sqlglot raises on the text is a no
        raise SqlError(f"{what} is not valid Spark SQL: {(str(exc).splitlines() or [type(exc).__name__])[0]}") \
            from None


# What opens and closes a level of nesting, as the parser recurses into it.
_OPENERS = {TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.CASE}
_CLOSERS = {TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.END}
_QUOTED = {TokenType.STRING, TokenType.RAW_STRING, TokenType.NATIONAL_STRING, TokenType.HEX_STRING,
           TokenType.BIT_STRING, TokenType.BYTE_STRING, TokenType.IDENTIFIER}


def _check_tokens(tokens: list[Token], text: str, what: str) -> None:
    """Bound the nesting (before the parser recurses into it), refuse hints and parameters."""
    # Spark reads /*+ ... */ as a hint after SELECT and as a comment elsewhere; the tokenizer drops both alike.
    quoted = [(token.start, token.end) for token in tokens if token.token_type in _QUOTED]
    starts = [start for start, _ in quoted]
    for found in re.finditer(re.escape("/*+"), text):
        inside = bisect.bisect_right(starts, found.start()) - 1  # the last literal that starts before it
        if inside < 0 or quoted[inside][1] < found.start():
            raise SqlError(f"{what} has HINT: {_CLAUSES['hint']}")
    depth = 0
    for token in tokens:
        if token.token_type in _OPENERS:
            depth += 1
            if depth > SQL_MAX_DEPTH:
                raise SqlError(f"{what} nests more than {SQL_MAX_DEPTH} levels deep (parentheses, brackets, CASE)")
        elif token.token_type in _CLOSERS:
            depth -= 1
        if token.token_type is TokenType.HINT:
            raise SqlError(f"{what} has HINT: {_CLAUSES['hint']}")
        if token.token_type in (TokenType.PARAMETER, TokenType.PLACEHOLDER, TokenType.SESSION_PARAMETER):
            raise SqlError(f"{what} has the parameter {token.text!r}: catalog SQL has no variables; write the value")


def _check_called_names(tokens: list[Token], what: str, shape: Shape) -> None:
    """Every name the text calls, as written: a name sqlglot reads as something else is still what Spark calls."""
    allowed = ROW_FUNCTIONS | (AGGREGATE_FUNCTIONS if shape is Shape.GROUP else frozenset())
    for index, token in enumerate(tokens):
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        if following is None or following.token_type is not TokenType.L_PAREN:
            continue
        if token.token_type is TokenType.STRING or not _WORD.match(token.text):
            continue
        name = token.text.lower()
        if index and tokens[index - 1].token_type is TokenType.DOT:
            raise SqlError(f"{what} calls the qualified function {name}(): a qualified name reaches functions of a "
                           "catalog; call Spark's built-in functions by their plain name")
        if name in allowed or (name in SYNTAX_BEFORE_PARENTHESIS and token.token_type is not TokenType.IDENTIFIER):
            continue
        raise SqlError(_refusal(name, what, shape))


_WORD = re.compile(r"^\w+$")
_MEASURE_SHAPE = f"a measure is function(column) with function one of {', '.join(sorted(AGGREGATE_FUNCTIONS))}"


def _refusal(name: str, what: str, shape: Shape) -> str:
    if name in _FORBIDDEN_FUNCTIONS:
        return f"{what} calls {name}(), which runs JVM code; catalog SQL is row expressions only"
    if name in _SPARK_AGGREGATES and shape is not Shape.GROUP:
        return f"{what} uses the aggregate {name}(); it sees one row at a time (aggregate in the stream's aggregate " \
               "section)"
    if shape is Shape.GROUP:
        return f"{what} calls {name}(); {_MEASURE_SHAPE}"
    return f"{what} calls {name}(), which catalog SQL does not allow (docs, 'Expectations and SQL transforms': the " \
           "string, math, date, conditional, cast, JSON, variant, array, map and struct functions)"


def _parse(text: str, what: str, shape: Shape) -> exp.Expr:
    """One statement or expression, or the parser's first complaint with its position."""
    try:
        with _quiet_parser():
            parsed = [statement for statement in sqlglot.parse(text, read=DIALECT) if statement is not None]
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        where = f" at line {first.get('line')}, column {first.get('col')}" if first.get("line") else ""
        near = f" near {first.get('highlight')!r}" if first.get("highlight") else ""
        raise SqlError(f"{what} is not valid Spark SQL: {first.get('description', exc)}{where}{near}") from None
    except RecursionError:
        raise
    except Exception as exc:  # sqlglot's builders fail on some calls with IndexError and the like; any is a no
        raise SqlError(f"{what} is not valid Spark SQL: {(str(exc).splitlines() or [type(exc).__name__])[0]}") \
            from None
    if len(parsed) != 1:
        raise SqlError(f"{what} must be one {'statement' if shape is Shape.SELECT else 'expression'}, "
                       f"found {len(parsed)}")
    node = parsed[0]
    if shape is not Shape.SELECT and isinstance(node, (exp.Query, exp.Command, exp.DDL, exp.DML)):
        raise SqlError(f"{what} must be an expression over the row, not a statement")
    return node


@contextmanager
def _quiet_parser() -> Iterator[None]:
    """Keep sqlglot's warnings (text it reads as an opaque command, which the shape check then refuses) out of the
    output: a refusal is one line, the one that names the field."""
    logger = logging.getLogger("sqlglot")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _check_depth(node: exp.Expr, what: str) -> None:
    """Bound the tree's height (a chain of a thousand ANDs nests a thousand deep), walking it without recursion."""
    pending = [(node, 1)]
    while pending:
        current, depth = pending.pop()
        if depth > SQL_MAX_DEPTH * 4:
            raise SqlError(f"{what} nests more than {SQL_MAX_DEPTH * 4} operations deep; split it (a transform's "
                           "columns can feed an expectation)")
        pending += [(child, depth + 1) for child in current.iter_expressions()]


def _select_items(statement: exp.Expr, what: str) -> list[exp.Expr]:
    """A transform's select items, once its shape (one SELECT over source, no clause that adds or drops rows) is
    checked."""
    if isinstance(statement, exp.SetOperation):
        raise SqlError(f"{what} is a set operation ({type(statement).__name__.upper()}); it must be one SELECT that "
                       "keeps one row per input row")
    if not isinstance(statement, exp.Select):
        raise SqlError(f"{what} must be SELECT ... FROM {SOURCE_TABLE}, got {statement.key.upper()}")
    for clause, reason in _CLAUSES.items():
        if statement.args.get(clause):
            raise SqlError(f"{what} has {clause.rstrip('_s').upper()}: {reason}")
    source = statement.args.get("from_")
    table = source.this if source is not None else None
    for clause, reason in _TABLE_CLAUSES.items():
        if isinstance(table, exp.Table) and table.args.get(clause):
            raise SqlError(f"{what} reads {table.sql(DIALECT)}: {reason}")
    if not isinstance(table, exp.Table) or table.name.casefold() != SOURCE_TABLE \
            or any(value for key, value in table.args.items() if key not in ("this", "alias")):
        shown = source.sql(DIALECT) if source is not None else "no FROM clause"
        raise SqlError(f"{what} must read FROM {SOURCE_TABLE} (the stream's parsed rows), got {shown}")
    unknown = set(statement.args) - {"expressions", "from_"}
    if any(statement.args.get(clause) for clause in unknown):
        raise SqlError(f"{what} has {', '.join(sorted(c.upper() for c in unknown if statement.args.get(c)))}: a "
                       f"transform is SELECT <expressions> FROM {SOURCE_TABLE}")
    return list(statement.expressions)


def _check_nodes(item: exp.Expr, text: str, what: str, shape: Shape) -> None:
    """Every node of ``item`` is an allowed expression form or an allowed function."""
    aggregates = 0
    for node in item.walk():
        if isinstance(node, exp.QueryTransform):
            raise SqlError(f"{what} has a script transform (TRANSFORM ... USING): it runs a program on Spark's "
                           "executors; catalog SQL is row expressions only")
        if isinstance(node, (exp.Query, exp.Subquery)) or (isinstance(node, exp.Exists)
                                                          and isinstance(node.this, exp.Query)):
            raise SqlError(f"{what} has a subquery; it reads only its own row")
        if isinstance(node, exp.Window):
            raise SqlError(f"{what} uses the window function {node.sql(DIALECT)!r}, which a stream cannot run")
        if isinstance(node, exp.UDTF):
            raise SqlError(f"{what} uses the generator {node.sql(DIALECT)!r}, which turns a row into several; it "
                           "must keep one row per input row")
        if isinstance(node, (exp.Parameter, exp.Placeholder, exp.SessionParameter)):
            raise SqlError(f"{what} has the parameter {node.sql(DIALECT)!r}: catalog SQL has no variables")
        if isinstance(node, exp.Hint):
            raise SqlError(f"{what} has a hint: it changes how Spark plans the batch, which is Sluice's to choose")
        if isinstance(node, exp.Func | exp.Any):  # any(flag), an aggregate sqlglot reads as ANY (subquery)
            name = _written_name(node, text) if isinstance(node, exp.Func) else "any"
            if isinstance(node, exp.AggFunc | exp.Any) or name in _SPARK_AGGREGATES:
                aggregates += 1
                if shape is not Shape.GROUP or aggregates > 1 or name not in AGGREGATE_FUNCTIONS:
                    raise SqlError(f"{what} uses the aggregate {node.sql(DIALECT)!r}; "
                                   + (_MEASURE_SHAPE if shape is Shape.GROUP else
                                      "it sees one row at a time (aggregate in the stream's aggregate section)"))
            elif name not in ROW_FUNCTIONS and type(node) not in _SYNTAX_FUNCTIONS:
                raise SqlError(_refusal(name, what, shape))
        elif type(node) not in _NODES:
            raise SqlError(f"{what} has {node.sql(DIALECT)!r} ({node.key}), which catalog SQL does not allow")


def _written_name(function: exp.Func, text: str) -> str:
    """A function's name as the text writes it (sqlglot may map it to another), else as sqlglot knows it."""
    start, end = function.meta.get("start"), function.meta.get("end")
    if isinstance(start, int) and isinstance(end, int) and 0 <= start <= end < len(text):
        written = text[start:end + 1].strip("`")
        if _WORD.match(written):
            return written.lower()
    return _function_name(function)


# Functions that call arbitrary JVM methods: named in their refusal.
_FORBIDDEN_FUNCTIONS = frozenset({"reflect", "java_method", "try_reflect"})
# Functions sqlglot builds from syntax rather than a name (CASE, CAST(x AS t), x::t, EXTRACT(f FROM x), a[0]), or
# wraps around an argument of a function it knows (year(x) is YEAR(TS_OR_DS_TO_DATE(x)) to it); the names the text
# calls are checked as written besides.
_SYNTAX_FUNCTIONS = frozenset({exp.Case, exp.Cast, exp.TryCast, exp.Extract, exp.Collate, exp.Bracket,
                               exp.TsOrDsToDate, exp.TimeStrToTime, exp.StrPosition})
# The expression forms a row or a group needs (a function is checked by its name, above).
_NODES = frozenset({
    exp.Column, exp.Identifier, exp.Literal, exp.Boolean, exp.Null, exp.Star, exp.Alias, exp.Paren, exp.Tuple,
    exp.Neg, exp.Not, exp.BitwiseNot, exp.And, exp.Or, exp.Xor, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE,
    exp.NullSafeEQ, exp.NullSafeNEQ, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.BitwiseAnd,
    exp.BitwiseOr, exp.BitwiseXor, exp.BitwiseLeftShift, exp.BitwiseRightShift, exp.DPipe, exp.Like, exp.ILike,
    exp.RegexpLike, exp.Escape, exp.In, exp.Between, exp.Is, exp.Dot, exp.Bracket, exp.Lambda, exp.Kwarg,
    exp.PropertyEQ, exp.DataType, exp.DataTypeParam, exp.ColumnDef, exp.Interval, exp.Var, exp.If,
    exp.AtTimeZone, exp.FromTimeZone, exp.RawString, exp.HexString, exp.BitString, exp.ByteString, exp.National,
})
# Spark's aggregate functions (its function registry's "agg_funcs"): sqlglot knows most of them as aggregates, and
# parses the others as plain calls.
_SPARK_AGGREGATES = frozenset({
    "any", "any_value", "approx_count_distinct", "approx_percentile", "approx_top_k_accumulate", "approx_top_k_combine",
    "array_agg", "avg", "bit_and", "bit_or", "bit_xor", "bitmap_and_agg", "bitmap_construct_agg", "bitmap_or_agg",
    "bool_and", "bool_or", "collect_list", "collect_set", "corr", "count", "count_if", "count_min_sketch",
    "covar_pop", "covar_samp", "every", "first", "first_value", "grouping", "grouping_id", "histogram_numeric",
    "hll_sketch_agg", "hll_union_agg", "kll_sketch_agg_bigint", "kll_sketch_agg_double", "kll_sketch_agg_float",
    "kurtosis", "last", "last_value", "listagg", "max", "max_by", "mean", "median", "min", "min_by", "mode",
    "percentile", "percentile_approx", "percentile_cont", "percentile_disc", "regr_avgx", "regr_avgy", "regr_count",
    "regr_intercept", "regr_r2", "regr_slope", "regr_sxx", "regr_sxy", "regr_syy", "skewness", "some", "std",
    "stddev", "stddev_pop", "stddev_samp", "string_agg", "sum", "theta_intersection_agg", "theta_sketch_agg",
    "theta_union_agg", "try_avg", "try_sum", "var_pop", "var_samp", "variance", "kll_merge_agg_bigint",
    "kll_merge_agg_double", "kll_merge_agg_float", "tuple_sketch_agg_double", "tuple_sketch_agg_integer",
    "tuple_union_agg_double", "tuple_union_agg_integer", "tuple_intersection_agg_double",
    "tuple_intersection_agg_integer", "vector_sum", "vector_avg", "approx_top_k", "measure", "schema_of_variant_agg",
})


def _function_name(function: exp.Func) -> str:
    return (function.name if isinstance(function, exp.Anonymous) else function.sql_name()).lower()


def _lambda_names(column: exp.Column) -> set[str]:
    """The variables of the higher-order functions around a column (``x`` in ``exists(items, x -> x.ok)``)."""
    names: set[str] = set()
    parent = column.parent
    while parent is not None:
        if isinstance(parent, exp.Lambda):
            names |= {variable.name.casefold() for variable in parent.expressions}
        parent = parent.parent
    return names


def _check_columns(node: exp.Expr, columns: Columns, what: str, qualifiers: set[str]) -> None:
    """Every column ``node`` names exists (Spark compares names without case); a struct's field is reached through
    its column."""
    known = {name.casefold() for name in columns}
    for column in node.find_all(exp.Column):
        if isinstance(column.this, exp.Star):
            continue
        parts = [part.name for part in column.parts]
        if parts[0].casefold() in _lambda_names(column):
            continue
        if len(parts) > 1 and parts[0].casefold() in qualifiers and parts[0].casefold() not in known:
            parts = parts[1:]
        elif len(parts) > 1 and parts[0].casefold() == SOURCE_TABLE and parts[0].casefold() not in known:
            raise SqlError(f"{what} names {column.sql(DIALECT)}: name the column without {SOURCE_TABLE}.")
        if parts[0].casefold() not in known:
            raise SqlError(f"{what} names the column {parts[0]!r}, which does not exist here; the columns are: "
                           f"{', '.join(columns)}")


def _typed(select: exp.Select, columns: Columns) -> exp.Select:
    """The select with every expression's type inferred from the column types."""
    schema: dict[str, object] = {SOURCE_TABLE: {quote(name): kind or _UNKNOWN for name, kind in columns.items()}}
    try:
        qualified = qualify(select.copy(), schema=schema, dialect=DIALECT, validate_qualify_columns=False,
                            expand_stars=False, quote_identifiers=False)
        return annotate_types(qualified, schema=schema, dialect=DIALECT)
    except (OptimizeError, SqlglotError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return select  # the names were checked already; Spark types what sqlglot could not


def _type_of(node: exp.Expr) -> str | None:
    kind = node.type
    if kind is None or kind.is_type(exp.DataType.Type.UNKNOWN, exp.DataType.Type.NULL):
        return None
    return kind.sql(DIALECT)


def check_expression(text: str, columns: Columns, *, what: str) -> None:
    """Refuse a check that is not one boolean expression over one row of ``columns``."""
    node = parse_sql(text, what=what, shape=Shape.ROW)
    _check_columns(node, columns, what, qualifiers=set())
    select = exp.select(node.copy().as_("_check")).from_(SOURCE_TABLE)
    kind = _type_of(_typed(select, columns).selects[0])
    if kind is not None and kind.upper() != "BOOLEAN":
        raise SqlError(f"{what} is not a boolean expression: {text.strip()!r} gives {kind}")


_CLAUSES = {
    "where": "a WHERE clause drops rows; drop them with an expectation (on_violation: drop), which counts them",
    "group": "GROUP BY makes one row of many; aggregate in the stream's aggregate section",
    "having": "HAVING filters groups; aggregate in the stream's aggregate section",
    "qualify": "QUALIFY filters rows",
    "order": "ORDER BY has no meaning for the rows of a micro-batch",
    "limit": "LIMIT drops rows",
    "offset": "OFFSET drops rows",
    "distinct": "DISTINCT drops rows; deduplicate in the stream's dedupe section",
    "joins": "a join changes the number of rows; join in the stream's join or lookup section",
    "laterals": "LATERAL VIEW turns a row into several",
    "with_": "a WITH clause is not needed: select from source",
    "windows": "a WINDOW clause is not needed",
    "hint": "a hint (/*+ ... */) changes how Spark plans and partitions the batch, which is Sluice's to choose",
    "sample": "TABLESAMPLE drops rows",
    "distribute": "DISTRIBUTE BY repartitions the batch, which is Sluice's to choose",
    "cluster": "CLUSTER BY repartitions the batch, which is Sluice's to choose",
    "sort": "SORT BY has no meaning for the rows of a micro-batch",
}
# What a transform may not do to its one table.
_TABLE_CLAUSES = {
    "sample": "TABLESAMPLE drops rows",
    "pivots": "PIVOT and UNPIVOT change the number of rows",
}


def parse_transform(text: str, columns: Columns) -> SqlTransform:
    """Check a SQL transform against its input ``columns``; return what it produces."""
    what = "the transform"
    statement = parse_sql(text, what=what, shape=Shape.SELECT)
    assert isinstance(statement, exp.Select)  # parse_sql's SELECT shape
    table = statement.args["from_"].this
    alias = table.alias_or_name.casefold()
    _check_columns(statement, columns, what, qualifiers={SOURCE_TABLE, alias})
    typed = _typed(statement, columns)
    projections, produced = _projections(text, statement, typed, columns, alias)
    return SqlTransform(sql=text, alias=alias, projections=tuple(projections), columns=tuple(produced))


def _projections(text: str, statement: exp.Select, typed: exp.Select, columns: Columns,
                 alias: str) -> tuple[list[Projection], list[tuple[str, str | None]]]:
    texts = _select_list(text)
    if len(texts) != len(statement.expressions):
        raise SqlError("the transform's select list could not be split into its items")
    by_folded = {name.casefold(): name for name in columns}
    projections: list[Projection] = []
    produced: list[tuple[str, str | None]] = []
    for item, typed_item, item_text in zip(statement.expressions, typed.expressions, texts, strict=True):
        star = item if isinstance(item, exp.Star) else item.this if isinstance(item, exp.Column) else None
        if isinstance(star, exp.Star):
            if isinstance(item, exp.Column) and item.table.casefold() not in {alias, SOURCE_TABLE}:
                raise SqlError(f"the transform selects {item.sql(DIALECT)}, but the only table is {alias}")
            excluded = [column.name for column in star.args.get("except_") or []]
            unknown = [name for name in excluded if name.casefold() not in by_folded]
            if unknown:
                raise SqlError(f"the transform's * EXCEPT names {', '.join(unknown)}, which the input lacks")
            if star.args.get("replace") or star.args.get("rename"):
                raise SqlError("the transform's * REPLACE and * RENAME are not Spark SQL; select * EXCEPT (c), then "
                               "<expression> AS c")
            dropped = {name.casefold() for name in excluded}
            produced += [(name, kind) for name, kind in columns.items() if name.casefold() not in dropped]
            projections.append(Projection(item_text, None, tuple(by_folded[name.casefold()] for name in excluded)))
            continue
        if isinstance(item, exp.Alias):
            name = item.alias
        elif isinstance(item, exp.Column):
            name = item.name
        else:
            raise SqlError(f"the transform's {item_text.strip()!r} needs a name: add AS <column>")
        passed_through = isinstance(item, exp.Column) and item.name.casefold() in by_folded
        if name.startswith("_") and not passed_through:
            raise SqlError(f"the transform produces {name!r}: names that start with '_' are Sluice's own columns "
                           "(the dead-letter flags, the lineage); choose another name")
        produced.append((name, _type_of(typed_item)))
        projections.append(Projection(item_text, name))
    seen: dict[str, str] = {}
    for name, _ in produced:
        if name.casefold() in seen:
            raise SqlError(f"the transform produces the column {name!r} twice; to rewrite an input column, select "
                           f"* EXCEPT ({name}) and then the new expression AS {name}")
        seen[name.casefold()] = name
    return projections, produced


def _select_list(text: str) -> list[str]:
    """The user's text of each item of the top-level select list, split at the commas between them."""
    tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(text)
    Type = sqlglot.TokenType
    depth, start, previous_end, items, begun = 0, None, 0, [], False
    previous, angles, type_word = None, 0, False
    for token in tokens:
        if not begun:
            begun = token.token_type is Type.SELECT
            continue
        # A type's angle brackets (x::MAP<STRING, INT>, CAST(x AS ARRAY<...>)) nest like parentheses; a comparison's
        # do not (a column named map: map < 5).
        opens = token.token_type is Type.LT and type_word
        if token.token_type in (Type.L_PAREN, Type.L_BRACKET) or opens:
            depth += 1
        elif token.token_type in (Type.R_PAREN, Type.R_BRACKET) or (token.token_type is Type.GT and angles):
            depth -= 1
        if opens:
            angles += 1
        elif token.token_type is Type.GT and angles:
            angles -= 1
        type_word = token.token_type in (Type.MAP, Type.ARRAY, Type.STRUCT) and (
            angles > 0 or previous is Type.DCOLON or (previous is Type.ALIAS and depth > 0))
        previous = token.token_type
        if depth == 0 and token.token_type in (Type.COMMA, Type.FROM):
            if start is not None:
                items.append(text[start:previous_end + 1])
            start = None
            if token.token_type is Type.FROM:
                break
            continue
        if start is None:
            start = token.start
        previous_end = token.end
    return items


def spark_select(transform: SqlTransform, carried: Sequence[str], *, placeholder: str = "{source}") -> str:
    """The SQL Spark runs for a transform: the user's select items, each star widened to leave out the
    ``carried`` columns (Sluice's own, which ride along unchanged after the user's), over ``placeholder``.

    Braces in the user's text are doubled: the result is a :meth:`str.format` template, as pyspark's
    ``spark.sql(query, source=frame)`` takes it.
    """
    items = []
    for projection in transform.projections:
        if projection.name is None:
            hidden = ", ".join(quote(name) for name in (*carried, *projection.excluded))
            items.append(f"* EXCEPT ({hidden})" if hidden else "*")
        else:
            items.append(projection.text.replace("{", "{{").replace("}", "}}"))
    items += [quote(name) for name in carried]
    alias = quote(transform.alias).replace("{", "{{").replace("}", "}}")
    return f"SELECT {', '.join(items)} FROM {placeholder} AS {alias}"
