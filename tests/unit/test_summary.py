from __future__ import annotations

import pytest

from sluice.errors import StreamRunError
from sluice.summary import RunSummary, StreamRunSummary, find_summary_line


def sample() -> RunSummary:
    return RunSummary(
        app_id="local-1",
        streams=[StreamRunSummary(stream="events", status="succeeded", batches=2, input_rows=10, output_rows=9,
                                  dead_letter_rows=1, delta_version_before=0, delta_version_after=2,
                                  batch_ids=[0, 1])],
    )


def test_round_trip_through_a_log_line_with_a_prefix() -> None:
    lines = ["INFO something else",
             "[2026-11-22 10:00:00] INFO - " + sample().to_line() + " [airflow.task.hooks] loc=spark_submit.py:965"]
    parsed = find_summary_line(lines)
    assert parsed == sample()
    assert parsed is not None and parsed.ok


def test_last_summary_wins() -> None:
    first = sample()
    second = sample()
    second.streams[0].status = "failed"
    parsed = find_summary_line([first.to_line(), second.to_line()])
    assert parsed is not None and not parsed.ok


def test_no_marker_gives_none() -> None:
    assert find_summary_line(["a", "b"]) is None


def test_unknown_keys_are_ignored_for_forward_compatibility() -> None:
    parsed = RunSummary.from_json('{"app_id": null, "streams": [{"stream": "s", "new_field": 1}]}')
    assert parsed.streams[0].stream == "s"


@pytest.mark.parametrize("text, message", [("{nope", "not valid JSON"), ('{"streams": 3}', "no 'streams' list")])
def test_bad_summary_is_refused(text: str, message: str) -> None:
    with pytest.raises(StreamRunError, match=message):
        RunSummary.from_json(text)
    with pytest.raises(StreamRunError, match=message):
        find_summary_line(["SLUICE_RUN_SUMMARY " + text])
