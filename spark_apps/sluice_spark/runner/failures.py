"""Why a query failed, and whether a rerun can get past it."""

from __future__ import annotations

import re

from sluice.errors import BatchRefused

# Spark's words for a checkpoint that lacks what a resume needs: the same run fails the same way until someone
# restores or resets the checkpoint, so Airflow must not retry it. (Spark raises these as plain Java exceptions,
# IllegalStateException and the like, or names them by an error condition: no type says more than these words.)
_CHECKPOINT_LACKS = re.compile(
    r"batch \d+ doesn't exist|Unable to find batch|Error reading (?:delta|snapshot) file .* of HDFSStateStoreProvider|"
    r"STATE_STORE_\w*(?:NOT_FOUND|CORRUPT)|CANNOT_LOAD_STATE_STORE"
)


# Spark's ANSI error conditions for a value an expression cannot take (Spark 4 runs SQL under ANSI by default): the
# same rows meet the same expression on every rerun.
_ANSI_VALUE_ERRORS = re.compile(
    r"\[(?:CAST_INVALID_INPUT|CAST_OVERFLOW\w*|DIVIDE_BY_ZERO|INTERVAL_DIVIDED_BY_ZERO|ARITHMETIC_OVERFLOW|"
    r"BINARY_ARITHMETIC_OVERFLOW|NUMERIC_VALUE_OUT_OF_RANGE\w*|INVALID_ARRAY_INDEX\w*|INVALID_INDEX_OF_ZERO|"
    r"DATETIME_OVERFLOW|DATETIME_FIELD_OUT_OF_BOUNDS|INVALID_FRACTION_OF_SECOND|CANNOT_PARSE_TIMESTAMP|"
    r"CONVERSION_INVALID_INPUT|INVALID_VARIANT_CAST)[\].]"
)


ANSI_HINT = ("; a value of the batch broke an expression of the stream (its transform, a rule, a cast) under ANSI SQL, "
             "so every rerun fails the same way: write it with the try_* functions (try_cast, try_divide, "
             "try_element_at...) or catch such rows with an expectation; Spark names the expression above")

# The line of a Python traceback that names a raised exception by its qualified class name (``module.Class: message``).
_RAISED = re.compile(r"^((?:[A-Za-z_]\w*\.)+[A-Z]\w*):")


def is_permanent(error: BaseException) -> bool:
    """True for a query error that a rerun of the same checkpoint cannot get past: a batch Sluice refused
    (:func:`refused_by`), a checkpoint that lacks what a resume needs, a value an expression cannot take under ANSI.
    """
    if refused_by(error) is not None:
        return True
    text = "\n".join(str(cause) for cause in _chain(error))
    return _CHECKPOINT_LACKS.search(text) is not None or _ANSI_VALUE_ERRORS.search(text) is not None


def refused_by(error: BaseException) -> type[BatchRefused] | None:
    """The type of the :class:`~sluice.errors.BatchRefused` that stopped a query, or None.

    Raised in this process, it is in the error's chain. Raised in a ``foreachBatch`` function or a Python data
    source's writer, it reaches the query's error through the JVM as its Python traceback, whose line
    ``module.Class: message`` names its class: it is known by that qualified name, as a Java exception is known by
    its class (:func:`sluice_spark.kinds.explain_failure`), never by the words of its message.
    """
    known = {f"{kind.__module__}.{kind.__qualname__}": kind for kind in _subclasses(BatchRefused)}
    for cause in _chain(error):
        if isinstance(cause, BatchRefused):
            return type(cause)
        for line in str(cause).splitlines():
            raised = _RAISED.match(line.strip())
            if raised is not None and raised.group(1) in known:
                return known[raised.group(1)]
    return None


def _subclasses(kind: type[BatchRefused]) -> list[type[BatchRefused]]:
    found = [kind]
    for sub in kind.__subclasses__():
        found += _subclasses(sub)
    return found


def _chain(error: BaseException) -> list[BaseException]:
    """The error and its causes: Python's, and the JVM cause chain pyspark keeps on a captured exception
    (``_cause``)."""
    chain: list[BaseException] = []
    seen: BaseException | None = error
    while seen is not None and len(chain) < 20 and all(seen is not other for other in chain):
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__ or getattr(seen, "_cause", None)
    return chain


def explained(message: str) -> str:
    """A query's error, with what to do about an ANSI error (see :data:`ANSI_HINT`)."""
    if _ANSI_VALUE_ERRORS.search(message) is None:
        return message
    return f"{message[:2000 - len(ANSI_HINT)]}{ANSI_HINT}"


_PYTHON_EXCEPTION = re.compile(r"^(?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Failed|Exit|Interrupt)(?::|$)")


def error_message(error: BaseException) -> str:
    """The first line of a query's error, and its root cause: Spark wraps most causes in a generic message; an
    ANSI error says what to do (:func:`explained`)."""
    def first_line(exc: BaseException) -> str:
        text = str(exc).strip()
        if not text:
            return repr(exc)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if "Traceback (most recent call last)" not in text:
            return lines[0]
        # A Python error raised in foreachBatch or a Python data source arrives as a traceback, with Spark's plan
        # after it: the line that names the Python exception says what happened.
        raised = next((line for line in lines[1:] if _PYTHON_EXCEPTION.match(line)), lines[-1])
        # A JVM error met inside the Python code (a batch collected in foreachBatch) carries its Java stack in the
        # traceback's text: its last cause is what went wrong.
        causes = [line for line in lines if line.startswith("Caused by: ")]
        return f"{lines[0]} {raised}" + (f" {causes[-1]}" if causes else "")

    message, root, seen = first_line(error), error, 0
    # pyspark keeps the JVM cause chain on captured exceptions as ``_cause``.
    while getattr(root, "_cause", None) is not None and seen < 20:
        root, seen = root._cause, seen + 1  # type: ignore[attr-defined]
    cause = first_line(root)
    if root is not error and cause[-200:] not in message:  # a Python error repeats in its JVM wrapper
        message = f"{message} Caused by: {cause}"
    return explained(message[:2000])
