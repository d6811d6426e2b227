"""Source and sink kinds on the Spark side: how each kind of :mod:`sluice.kinds` is read or written.

A source kind's module has ``read(spark, stream, roots, *, path, trigger)``: the stream's source as a streaming
DataFrame of the declared columns plus ``_corrupt_record`` (the text of a record that did not parse, else NULL) and
``_source_file`` (each row's lineage). ``path`` and ``trigger`` replace the catalog's (a backfill reads a glob of the
files it selected, with its own limits). A sink kind's module has ``sink_writer(request)``, and may have a check of
what must hold before any table is created (:attr:`SparkSink.check`).

A new kind is its module here and one line in :data:`READERS` or :data:`SINKS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter

from sluice.constants import SinkFormat, SourceType
from sluice.model.stream import StreamSpec, TriggerSpec
from sluice.paths import Roots
from sluice_spark.kinds import delta, files, iceberg, kafka
from sluice_spark.write.batches import SinkRequest

Reader = Callable[..., DataFrame]


@dataclass(frozen=True)
class SparkSink:
    writer: Callable[[SinkRequest], DataStreamWriter]
    check: Callable[[SparkSession, StreamSpec], None] = lambda spark, stream: None


READERS: dict[SourceType, Reader] = {SourceType.FILES: files.read, SourceType.DELTA: delta.read,
                                     SourceType.KAFKA: kafka.read, SourceType.ICEBERG: iceberg.read}
SINKS: dict[SinkFormat, SparkSink] = {SinkFormat.DELTA: SparkSink(delta.sink_writer),
                                      SinkFormat.KAFKA: SparkSink(kafka.sink_writer),
                                      SinkFormat.ICEBERG: SparkSink(iceberg.sink_writer)}


def read_stream(spark: SparkSession, stream: StreamSpec, roots: Roots, *, path: str | None = None,
                trigger: TriggerSpec | None = None) -> DataFrame:
    """The stream's source as a streaming DataFrame: the declared columns, ``_corrupt_record``, ``_source_file``."""
    return READERS[stream.source.type](spark, stream, roots, path=path, trigger=trigger or stream.trigger)


# What a source kind knows about a query's failure that Spark's message does not say: a sentence for the user, or None.
EXPLAINERS: dict[SourceType, Callable[[StreamSpec, BaseException], str | None]] = {
    SourceType.KAFKA: kafka.explain_failure, SourceType.DELTA: delta.explain_failure}


def explain_failure(stream: StreamSpec, error: BaseException) -> str | None:
    """Why ``stream``'s query failed, in its source's terms, when the source kind recognises the failure (by the
    Java exception's type); such a failure is permanent: a rerun meets it again."""
    explainer = EXPLAINERS.get(stream.source.type)
    return None if explainer is None else explainer(stream, error)


def sink(stream: StreamSpec) -> SparkSink:
    return SINKS[stream.sink.format]
