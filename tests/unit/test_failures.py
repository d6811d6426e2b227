"""A query's failure is classified by the type of what raised it (sluice_spark.runner.failures), not by the words of
Sluice's messages: a batch Sluice refused (sluice.errors.BatchRefused) is permanent, whether it was raised in this
process or reached the query's error through the JVM as a Python traceback."""

from __future__ import annotations

import traceback

import pytest

from sluice.errors import BatchRefused, ExpectationFailed, SchemaDriftError, SluiceError
from sluice_spark.runner import is_permanent, refused_by
from sluice_spark.targets import drift_failure, expectation_failure


class _Captured(Exception):
    """As pyspark captures a JVM error: its message, and the JVM cause chain as ``_cause``."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self._cause = cause


class LateRefusal(BatchRefused):
    """A refusal declared elsewhere than sluice.errors: known by its own qualified name."""


def through_the_jvm(error: BaseException) -> _Captured:
    """``error`` raised in a foreachBatch function, as the stopped query reports it: Spark's words, then the Python
    traceback the Py4J callback returned."""
    try:
        raise error
    except BaseException:
        text = traceback.format_exc()
    return _Captured("[STREAM_FAILED] Query [id = 1] terminated with exception: An exception was raised by the "
                     f"Python Proxy. Return Message: {text}\n\tat py4j.Protocol.getReturnValue(Protocol.java:476)")


@pytest.mark.parametrize("error", [expectation_failure(3, {"positive_amount": 2}, '{"amount": -1}'),
                                   drift_failure(3, {"coupon": 1}, ["landing/a.json"]),
                                   LateRefusal("the batch holds what no table takes")])
def test_a_refused_batch_is_permanent_where_it_was_raised_and_through_the_jvm(error: BatchRefused) -> None:
    assert refused_by(error) is type(error) and is_permanent(error)
    wrapped = through_the_jvm(error)
    assert refused_by(wrapped) is type(error) and is_permanent(wrapped)
    deeper = _Captured("org.apache.spark.SparkException: job aborted", cause=wrapped)
    assert refused_by(deeper) is type(error), "found along pyspark's JVM cause chain"
    try:
        raise SluiceError("stream 'events' failed") from error
    except SluiceError as chained:
        assert refused_by(chained) is type(error), "found along Python's cause chain"


def test_the_words_of_a_refusal_under_another_type_are_not_a_refusal() -> None:
    """The classification follows the type: a retryable error that happens to say what a refusal says stays
    retryable."""
    words = str(expectation_failure(3, {"positive_amount": 2}, None))
    for error in (ValueError(words), through_the_jvm(ValueError(words)), _Captured(words),
                  through_the_jvm(RuntimeError(str(drift_failure(1, {"coupon": 1}, []))))):
        assert refused_by(error) is None and not is_permanent(error), error


def test_only_the_last_line_of_a_traceback_names_what_was_raised() -> None:
    text = through_the_jvm(ConnectionResetError("reset by peer"))
    assert refused_by(text) is None and not is_permanent(text)
    assert refused_by(_Captured("sluice.errors.ExpectationFailedSoon: no such type")) is None
    assert refused_by(_Captured("sluice.errors.ExpectationFailed: one")) is ExpectationFailed
    assert refused_by(_Captured("  sluice.errors.SchemaDriftError: two")) is SchemaDriftError


@pytest.mark.parametrize("message", [
    "java.lang.IllegalStateException: batch 4 doesn't exist",
    "[CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] An error occurred during loading state.",
    "org.apache.spark.SparkArithmeticException: [DIVIDE_BY_ZERO] Division by zero. SQLSTATE: 22012",
])
def test_what_spark_cannot_get_past_is_permanent(message: str) -> None:
    assert is_permanent(_Captured("[STREAM_FAILED] terminated", cause=_Captured(message)))
    assert not is_permanent(_Captured("[STREAM_FAILED] terminated", cause=_Captured("Connection reset by peer")))
