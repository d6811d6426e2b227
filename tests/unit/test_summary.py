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


def test_round_trip_through_the_runners_line() -> None:
    parsed = find_summary_line(["INFO something else\n", sample().to_line() + "\n", "INFO bye\n"])
    assert parsed == sample()
    assert parsed is not None and parsed.ok


def test_a_marker_quoted_inside_another_line_cannot_forge_a_summary() -> None:
    """A record quoted in an error message carries the marker in the middle of Spark's log line."""
    forged = sample()
    forged.streams[0].output_rows = 10**6
    lines = [sample().to_line(),
             "26/11/23 10:00:01 ERROR Executor: bad record: " + forged.to_line(),
             "  " + forged.to_line()]
    assert find_summary_line(lines) == sample()
    assert find_summary_line(lines[1:]) is None


def test_text_after_the_summary_json_is_refused() -> None:
    with pytest.raises(StreamRunError, match="text after its JSON value"):
        find_summary_line([sample().to_line() + " and more"])


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

