"""A failing run's error, as it reaches the run summary (XCom, the task log) and the run log, holds none of the
secrets the run was given (issue 40): here Spark's ANSI error quotes the value it could not cast, and that value is
the object store's secret key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluice.storage import runlog
from sluice_spark.runner import run_streams
from tests.helpers import roots_in
from tests.spark.test_expectations import catalog_with, record, write_feed

pytestmark = pytest.mark.spark

SECRET = "s3-secret-key-0c7e41f9"


def test_a_failed_runs_error_is_scrubbed_in_the_summary_and_the_run_log(spark: Any, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    write_feed(tmp_path / "landing" / "events", "a.json", [record(1, currency=SECRET)])
    catalog, roots = catalog_with(tmp_path, {"numeric": {"check": "CAST(currency AS INT) > 0"}}), roots_in(tmp_path)
    [run] = run_streams(spark, catalog, ["events"], roots).streams
    assert run.status == "failed"
    assert "CAST_INVALID_INPUT" in (run.error or "") and "***" in (run.error or ""), run.error
    assert SECRET not in (run.error or "")
    [logged] = runlog.runs(roots.lake, "events")
    assert logged["status"] == "failed" and "CAST_INVALID_INPUT" in logged["error"]
    assert SECRET not in logged["error"]
