"""The project's exception types. Every message names the thing that is wrong and, where it can, the fix."""

from __future__ import annotations


class SluiceError(Exception):
    """Base class of every error Sluice raises on purpose."""


class CatalogError(SluiceError):
    """The stream catalog, or a value derived from it, is invalid.

    The message always starts with the stream (when there is one) and the dotted path of the bad field, so that
    ``stream 'events_bronze': sink.partition_by: ...`` tells the reader exactly where to look.
    """

    def __init__(self, message: str, *, stream: str | None = None, field: str | None = None) -> None:
        self.stream = stream
        self.field = field
        prefix = ""
        if stream is not None:
            prefix += f"stream '{stream}': "
        if field is not None:
            prefix += f"{field}: "
        super().__init__(prefix + message)


class StreamRunError(SluiceError):
    """A stream run failed: Spark failed, or a run could not produce its summary."""


class ExpectationFailed(SluiceError):
    """Rows of a micro-batch broke an expectation whose action is ``fail``: the batch committed nowhere, and every
    run stops at it until the rule or the data changes."""


class SchemaDriftError(SluiceError):
    """A batch brought fields the declared schema does not have, under ``fail_on_new_columns``: it committed
    nowhere."""
