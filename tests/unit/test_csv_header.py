"""The header of a CSV file as Spark's reader takes it (the first line that is not blank or a comment; under
multiLine, as many lines as a quoted name spans), read from the file's first bytes by :mod:`sluice_spark.drift.csv`.
The header's split into names is Spark's own (from_csv), tested with real Spark in tests/spark/test_drift.py."""

from __future__ import annotations

import pytest

from sluice_spark.drift.csv import first_record


@pytest.mark.parametrize(("head", "options", "expected"), [
    (b"id,amount\n1,2\n", {}, "id,amount"),
    (b"id,amount\r\n1,2\r\n", {}, "id,amount"),
    (b"id,amount\r1,2\r", {}, "id,amount"),
    (b"\xef\xbb\xbfid,amount\n1,2\n", {}, "id,amount"),  # a byte order mark names nothing
    (b"\n   \n# made by the shop\nid,amount\n", {"comment": "#"}, "id,amount"),
    (b"# not a comment without the option\nid\n", {}, "# not a comment without the option"),
    (b'"id","note\nlong"\n1,2\n', {"multi_line": True}, '"id","note\nlong"'),
    (b'"id","note\nlong"\n1,2\n', {}, '"id","note'),  # one line per record without multiLine, as Spark reads it
    (b'"a\\"b",c\n1,2\n', {"multi_line": True}, '"a\\"b",c'),  # an escaped quote closes nothing
    (b'"a""b",c\n1,2\n', {"multi_line": True}, '"a""b",c'),
    (b"id;amount|1;2|", {"line_sep": "|"}, "id;amount"),
    ("prénom,âge\n".encode("utf-16-le"), {"encoding": "utf-16-le"}, "prénom,âge"),
    (b"", {}, None),
    (b"\n\n", {}, None),
])
def test_the_first_record_is_the_header_spark_takes(head: bytes, options: dict, expected: str | None) -> None:
    assert first_record(head, **options) == expected


def test_a_line_ends_only_where_hadoops_line_reader_ends_it() -> None:
    assert first_record("id\u2028x,amount\n1,2\n".encode()) == "id\u2028x,amount"
    assert first_record(b"id\x0bx,amount\n") == "id\x0bx,amount"


def test_blank_is_what_javas_trim_removes() -> None:
    assert first_record(b" \t\nid\n") == "id"
    assert first_record("\u00a0\nid\n".encode()) == "\u00a0", "a no-break space is no blank to Spark"


def test_a_header_the_bytes_may_cut_short_is_not_taken_from_them() -> None:
    assert first_record(b"id,amo", complete=True) is None
    assert first_record(b"id,amount\n1", complete=True) == "id,amount"
    assert first_record(b"id,amo") == "id,amo"
