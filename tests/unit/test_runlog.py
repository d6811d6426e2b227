"""The run log's tables without Spark: one row per key however often it is written, compacted as it grows."""

from __future__ import annotations

from pathlib import Path

from deltalake import DeltaTable

from sluice.storage import runlog
from sluice.summary import StreamRunSummary


def test_a_key_written_twice_is_one_row_and_the_table_stays_small(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    for number in range(runlog.COMPACT_AFTER_FILES + 6):
        summary = StreamRunSummary(stream="events", run_id=f"ingest_events/scheduled__{number}/run_stream",
                                   status="succeeded", input_rows=number,
                                   started_at=f"2026-11-22T{8 + number // 60:02d}:{number % 60:02d}:00+00:00",
                                   ended_at=f"2026-11-22T{8 + number // 60:02d}:{number % 60:02d}:09+00:00",
                                   expectations=[{"rule": "r", "violated": 1}])
        runlog.record_runs(lake, [runlog.run_row(summary)])
    runlog.record_runs(lake, [runlog.run_row(StreamRunSummary(stream="events", run_id=summary.run_id,
                                                              status="failed", error="retried"))])

    rows = runlog.runs(lake, "events")
    assert len(rows) == runlog.COMPACT_AFTER_FILES + 6
    retried = [row for row in rows if row["run_id"] == summary.run_id]
    assert [(row["status"], row["error"]) for row in retried] == [("failed", "retried")]
    assert sorted(row["input_rows"] for row in rows if row is not retried[0]) == list(
        range(runlog.COMPACT_AFTER_FILES + 5))
    assert rows[0]["dag_id"] == "ingest_events" and rows[0]["dag_run_id"] == "scheduled__0"
    assert rows[0]["expectations"] == '[{"rule": "r", "violated": 1}]'
    table = DeltaTable(str(Path(lake, runlog.RUNS_TABLE)))
    assert len(table.file_uris()) <= runlog.COMPACT_AFTER_FILES // 2, "compacted as it grew"
    assert runlog.latest_runs(lake)["events"]["run_id"] == "ingest_events/scheduled__68/run_stream"


def test_a_merge_bounded_by_its_keys_still_replaces_rows_of_compacted_and_older_files(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")

    def batch(number: int, run_id: str, rows: int) -> dict[str, object]:
        return {"stream": "events", "run_id": run_id, "query_id": "q'1", "batch_id": number, "input_rows": rows}

    for number in range(runlog.COMPACT_AFTER_FILES + 3):  # compacted once, then three files of one row
        runlog.record_batches(lake, [batch(number, f"run-{number:03d}", 1)])
    # One merge whose keys span the compacted file, a small file and a new row: each bound is the rows' own.
    runlog.record_batches(lake, [batch(2, "run-002", 20), batch(runlog.COMPACT_AFTER_FILES + 1, "run-065", 21),
                                 batch(500, "run-500", 22), batch(7, "run-'7", 23)])

    rows = {(row["run_id"], row["batch_id"]): row["input_rows"] for row in runlog.batches(lake, "events")}
    assert len(rows) == runlog.COMPACT_AFTER_FILES + 5
    assert rows[("run-002", 2)] == 20 and rows[("run-065", 65)] == 21
    assert rows[("run-500", 500)] == 22 and rows[("run-'7", 7)] == 23 and rows[("run-007", 7)] == 1
