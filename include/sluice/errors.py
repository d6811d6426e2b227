"""The project's exception types. Every message names the thing that is wrong and, where it can, the fix."""

from __future__ import annotations

import re

# What a terminal would act on rather than show: C0 and C1 controls (ESC starts an ANSI sequence, and C1's CSI is
# one on its own), DEL, the bidirectional overrides that reorder what follows, and the lone surrogates that stand
# for a file name's bytes that are not UTF-8.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` (a file name, a message that holds one) as a terminal or a log shows it safely: every control or
    reordering character escaped as Python writes it (``\\x1b``, ``\\u202e``); a byte of a name that is not UTF-8
    as ``\\xff``. Everything else, non-ASCII letters included, stays as it is."""
    return _UNPRINTABLE.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's surrogateescape: the byte it could not decode
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class SluiceError(Exception):
    """Base class of every error Sluice raises on purpose."""


class BackfillError(SluiceError):
    """A backfill request was refused; nothing was read or written. The message starts with the field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


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


class BatchRefused(SluiceError):
    """A micro-batch Sluice refused to commit because of the rows it holds: it committed nowhere, and every rerun of
    the same checkpoint meets the same rows and is refused again, so the run is not retryable. The runner knows it
    by its type, also when it crossed the JVM as a Python traceback (``sluice_spark.runner.failures``)."""


class ExpectationFailed(BatchRefused):
    """Rows of a micro-batch broke an expectation whose action is ``fail``: the batch committed nowhere, and every
    run stops at it until the rule or the data changes."""


class SchemaDriftError(BatchRefused):
    """A batch brought fields the declared schema does not have, under ``fail_on_new_columns``: it committed
    nowhere."""
