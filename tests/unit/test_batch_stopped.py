"""A stopping query's cancelled batch goes back to Spark as one short line
(sluice_spark.write.batches.briefly_stopped).

Spark reads a foreachBatch error through a regex that recurses once per character (StreamExecution.PROXY_ERROR): a
Py4J error with its Java stack trace, tens of KB, overflowed the stream thread's stack when a warm run was cancelled
in the middle of a batch's job. What Spark is given instead must be short and still read as the stop it is: Spark's
exception, the word "cancelled" and the query's run id (StreamExecution.isCancelledJobGroup).
"""

from __future__ import annotations

import traceback

import pytest

from sluice_spark.write.batches import BatchStopped, briefly_stopped

RUN_ID = "17239ccf-bc8b-4017-b594-13a1961c590f"
JAVA_FRAMES = "".join(f"\tat org.apache.spark.Frame{n}.call(Frame.java:{n})\n" for n in range(3000))


class Py4JJavaError(Exception):
    """Stands in for py4j's (its module is what briefly_stopped looks at): building a real one takes a JVM."""


Py4JJavaError.__module__ = "py4j.protocol"


def long_error(cause: str) -> Exception:
    return Py4JJavaError(f"An error occurred while calling o2174.getResult.\n: org.apache.spark.SparkException: "
                         f"Exception thrown in awaitResult:\n{JAVA_FRAMES}Caused by: {cause}\n{JAVA_FRAMES}")


def raised(error: Exception) -> BaseException:
    with pytest.raises(BaseException) as caught, briefly_stopped():
        raise error
    return caught.value


def test_a_job_cancelled_by_the_stop_becomes_one_short_line_spark_reads_as_a_stop() -> None:
    cause = (f"org.apache.spark.SparkException: [SPARK_JOB_CANCELLED] Job 1 cancelled Query events [id = "
             f"b7e7ed95-8682-44f2-abec-f8661cc01dfc, runId = {RUN_ID}] was stopped SQLSTATE: XXKDA")
    error = raised(long_error(cause))
    assert isinstance(error, BatchStopped)
    sent = "".join(traceback.format_exception(error))  # what py4j sends the JVM
    assert len(sent) < 2000 and "Frame" not in sent and "awaitResult" not in sent
    assert "org.apache.spark.SparkException" in sent and "cancelled" in sent and RUN_ID in sent


def test_an_interrupted_call_stays_an_interruption_in_a_short_line() -> None:
    error = raised(long_error("java.lang.InterruptedException"))
    sent = "".join(traceback.format_exception(error))
    assert len(sent) < 2000
    assert "py4j.protocol.Py4JJavaError: An error occurred while calling" in sent
    assert "java.lang.InterruptedException" in sent


@pytest.mark.parametrize("error", [
    long_error("java.lang.ArithmeticException: / by zero"),
    RuntimeError("java.lang.InterruptedException quoted by a Python error, not a Py4J one"),
    ValueError("a rule failed"),
])
def test_every_other_error_goes_back_as_it_was(error: Exception) -> None:
    assert raised(error) is error
