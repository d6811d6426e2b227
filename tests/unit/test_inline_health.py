"""The health gate, as a task of its own and inside the run task (``health_gate: inline``): which streams a try leaves
out, and whether the task may retry. The checks themselves are tested on real checkpoints elsewhere
(``test_checkpoint_reader``, the DAG tests); here ``check_stream`` returns the reports each case needs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
import pytest

from sluice.constants import FaultCode, Severity
from sluice.model.stream import StreamSpec
from sluice.operations.health import HealthReport
from sluice.paths import Roots
from tests.helpers import events_stream, write_catalog
from tests.unit.test_kafka_secrets import FakeTaskInstance

WARN = (FaultCode.UNCOMMITTED_BATCH, Severity.WARN, {})
MISSING = (FaultCode.METADATA_MISSING, Severity.FAIL, {})
LOCKED = (FaultCode.LOCKED, Severity.FAIL, {"run_id": "maintenance/delta_maintenance/scheduled__1/maintain"})
LOCK_PATH_UNUSABLE = (FaultCode.LOCKED, Severity.FAIL, {"path": "/checkpoints/events/.sluice-lock.json",
                                                         "kind": "directory"})


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """stream name -> the findings its check reports, or the exception it raises; or an iterator of those, one per
    check."""
    import sluice.operations.gate as gate
    import sluice.operations.health as health

    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path))
    monkeypatch.setattr(gate, "LOCK_POLL_SECONDS", 0.01)
    outcomes: dict[str, Any] = {}

    def check_stream(stream: StreamSpec, roots: Roots, **_: Any) -> HealthReport:
        outcome = outcomes.get(stream.name, [])
        if isinstance(outcome, Iterator):
            outcome = next(outcome)
        if isinstance(outcome, Exception):
            raise outcome
        report = HealthReport(stream=stream.name, checkpoint=stream.checkpoint_path(roots))
        for code, severity, evidence in outcome:
            report.add(code, severity, f"{code} in {stream.name}", **evidence)
        return report

    monkeypatch.setattr(health, "check_stream", check_stream)
    return outcomes


def run_operator(tmp_path: Path, **kwargs: Any) -> Any:
    kwargs.setdefault("lock_wait_seconds", 0)
    from airflow.sdk import DAG

    from sluice_airflow.operators import StreamRunOperator

    catalog = write_catalog(tmp_path, events_stream("clicks", group="pair", health_gate="inline"),
                            events_stream("views", group="pair", health_gate="inline"))
    with DAG("inline_health", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        return StreamRunOperator(task_id="run_streams", streams=["clicks", "views"], catalog=str(catalog),
                                 check_health=True, **kwargs)


def gated(operator: Any) -> tuple[list[str], dict[str, Any]]:
    ti = FakeTaskInstance()
    stopped = operator._gated({"run_id": "manual__1", "ti": ti})
    return stopped, ti.xcom["health_reports"]


def test_a_fail_leaves_its_stream_out_and_a_warn_runs(tmp_path: Path, checks: dict[str, Any]) -> None:
    checks.update(clicks=[WARN], views=[MISSING])
    operator = run_operator(tmp_path)

    stopped, reports = gated(operator)

    assert stopped == ["views"] and operator.streams == ["clicks"]
    assert {name: report["status"] for name, report in reports.items()} == {"clicks": "WARN", "views": "FAIL"}
    assert not operator._retry_left_out, "a checkpoint that needs repair does not heal by retrying"


def test_fail_on_warn_leaves_a_warned_stream_out(tmp_path: Path, checks: dict[str, Any]) -> None:
    checks.update(clicks=[WARN])
    operator = run_operator(tmp_path, health_fail_on_warn=True)

    assert gated(operator)[0] == ["clicks"] and operator.streams == ["views"]


def test_every_stream_failing_fails_the_task_without_retries(tmp_path: Path, checks: dict[str, Any]) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    checks.update(clicks=[MISSING], views=[MISSING, LOCKED])

    with pytest.raises(AirflowFailException) as caught:
        gated(run_operator(tmp_path))

    assert "checkpoint health of stream 'clicks'" in str(caught.value)
    assert "METADATA_MISSING in views" in str(caught.value)


def test_a_live_lock_is_left_to_the_next_try(tmp_path: Path, checks: dict[str, Any]) -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    checks.update(clicks=[LOCKED], views=[LOCKED])

    with pytest.raises(AirflowException) as caught:
        gated(run_operator(tmp_path))

    assert not isinstance(caught.value, AirflowFailException), "the lock clears when its run ends: retry"
    assert "LOCKED in clicks" in str(caught.value)


def test_a_lock_path_sluice_cannot_use_is_no_reason_to_retry(tmp_path: Path, checks: dict[str, Any]) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    checks.update(clicks=[LOCK_PATH_UNUSABLE], views=[LOCK_PATH_UNUSABLE])

    with pytest.raises(AirflowFailException):  # the folder stays until someone removes it
        gated(run_operator(tmp_path))


def test_a_group_retries_when_one_stream_left_out_waits_for_a_lock(tmp_path: Path, checks: dict[str, Any]) -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    checks.update(clicks=[MISSING], views=[LOCKED])

    with pytest.raises(AirflowException) as caught:
        gated(run_operator(tmp_path))

    assert not isinstance(caught.value, AirflowFailException), "views may run at the next try"


@pytest.mark.parametrize(("findings", "retries"), [([LOCKED], True), ([LOCKED, MISSING], False),
                                                   ([LOCK_PATH_UNUSABLE], False)])
def test_the_gate_task_retries_only_a_live_runs_lock(tmp_path: Path, checks: dict[str, Any],
                                                     findings: list[Any], retries: bool) -> None:
    """A nightly maintenance or a backfill that holds the lock as the gate checks must not fail the run for good."""
    from airflow.sdk import DAG
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from sluice_airflow.operators import CheckpointHealthCheckOperator

    checks.update(clicks=findings)
    catalog = write_catalog(tmp_path, events_stream("clicks"))
    with DAG("gate", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        gate = CheckpointHealthCheckOperator(task_id="checkpoint_health", stream="clicks", catalog=str(catalog),
                                             lock_wait_seconds=0)
    ti = FakeTaskInstance()

    with pytest.raises(AirflowException) as caught:
        gate.execute({"run_id": "manual__1", "ti": ti})

    assert isinstance(caught.value, AirflowFailException) is not retries
    assert ti.xcom["health_report"]["status"] == "FAIL"


def test_the_gate_waits_for_the_run_that_holds_the_lock(tmp_path: Path, checks: dict[str, Any]) -> None:
    checks.update(clicks=iter([[LOCKED], [LOCKED], [WARN]]), views=iter([[LOCKED], []]))
    operator = run_operator(tmp_path, lock_wait_seconds=60)

    stopped, reports = gated(operator)

    assert stopped == [] and operator.streams == ["clicks", "views"]
    assert {name: report["status"] for name, report in reports.items()} == {"clicks": "WARN", "views": "OK"}


def test_a_check_that_raises_leaves_only_its_stream_out(tmp_path: Path, checks: dict[str, Any]) -> None:
    checks.update(views=OSError("the store is unreachable"))
    operator = run_operator(tmp_path)

    stopped, reports = gated(operator)

    assert stopped == ["views"] and operator.streams == ["clicks"]
    assert reports["views"] == {"stream": "views", "status": "ERROR", "error": "OSError: the store is unreachable"}
    assert reports["clicks"]["status"] == "OK"
    assert operator._retry_left_out


def test_a_run_takes_its_own_check_or_its_gates_not_both(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not both"):
        run_operator(tmp_path, health_gates={"clicks": "health_clicks"})


def test_no_stream_is_refused_before_any_check(tmp_path: Path, checks: dict[str, Any]) -> None:
    from airflow.sdk.exceptions import AirflowException

    operator = run_operator(tmp_path)
    operator.streams = []

    with pytest.raises(AirflowException, match="non-empty list of stream names"):
        operator.execute({"run_id": "manual__1", "ti": FakeTaskInstance()})
