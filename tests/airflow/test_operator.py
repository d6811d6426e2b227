"""StreamRunOperator and its hook: templating, arguments, the local default, summary capture, on_kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pendulum
import pytest

from sluice.summary import RunSummary, StreamRunSummary
from tests.helpers import load_spark_app

pytestmark = pytest.mark.airflow
PROJECT = Path(__file__).resolve().parents[2]


def make_operator(**kwargs):  # type: ignore[no-untyped-def]
    from airflow.sdk import DAG

    from sluice_airflow.operators import StreamRunOperator

    with DAG("templating", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        return StreamRunOperator(task_id="run", **kwargs)


def test_templated_fields_render() -> None:
    operator = make_operator(
        streams=["{{ params.stream }}"],
        landing_root="/landing/{{ ds }}",
        lake_root="/lake",
        checkpoint_root="/checkpoints/{{ params.stream }}",
        conf={"spark.app.note": "{{ ds_nodash }}"},
        params={"stream": "events_bronze"},
    )
    assert set(operator.template_fields) >= {"streams", "landing_root", "lake_root", "checkpoint_root", "conf"}
    operator.render_template_fields({"ds": "2026-11-22", "ds_nodash": "20261122", "params": operator.params})
    assert operator.streams == ["events_bronze"]
    assert operator.landing_root == "/landing/2026-11-22"
    assert operator.checkpoint_root == "/checkpoints/events_bronze"
    assert operator.conf == {"spark.app.note": "20261122"}


def test_constructor_stores_arguments_unchanged_and_does_no_io() -> None:
    operator = make_operator(streams=["a", "b"], catalog="/nowhere/catalog.yaml", engine="rs")
    assert (operator.streams, operator.catalog, operator.engine) == (["a", "b"], "/nowhere/catalog.yaml", "rs")


def test_application_args_carry_everything_the_runner_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_DATA_ROOT", "/srv/sluice")
    monkeypatch.delenv("SLUICE_LAKE_ROOT", raising=False)
    operator = make_operator(streams=["a", "b"], landing_root="/landing", engine="rs")
    args = load_spark_app("stream_runner.py").parse_args(
        operator.application_args(run_id="dag/run/task", summary_file="/tmp/s.json"))
    assert args.catalog.endswith("streams.yaml")
    assert args.streams == ["a", "b"]
    assert (args.landing_root, args.lake_root) == ("/landing", "/srv/sluice/lake")
    assert (args.engine, args.run_id, args.summary_file) == ("rs", "dag/run/task", "/tmp/s.json")


def test_values_that_start_with_a_dash_reach_the_runners_as_values() -> None:
    """A run id or a backfill reason chosen by a user must never be read as one of the runner's options."""
    from sluice.catalog import parse_catalog
    from sluice.operations.backfill import parse_request
    from sluice.paths import Roots
    from tests.helpers import events_stream

    operator = make_operator(streams=["a"])
    args = load_spark_app("stream_runner.py").parse_args(
        operator.application_args(run_id="--engine=jvm", summary_file="-s.json"))
    assert (args.run_id, args.summary_file, args.engine) == ("--engine=jvm", "-s.json", None)

    catalog = parse_catalog({"streams": [events_stream("events")]})
    request = parse_request({"stream": "events", "start": "2026-11-01T00:00:00Z", "end": "2026-11-02T00:00:00Z",
                             "select_by": "file_time", "reason": "--mode=replace"}, catalog, run_id="-h")
    backfill = load_spark_app("backfill_runner.py").parse_args(
        [*request.to_args(), "--catalog=c.yaml", *Roots("/l", "/k", "/c").as_args()])
    assert (backfill.reason, backfill.run_id, backfill.mode) == ("--mode=replace", "-h", "append")


def test_empty_stream_list_is_refused() -> None:
    from airflow.sdk.exceptions import AirflowException

    with pytest.raises(AirflowException, match="streams must be a non-empty list"):
        make_operator(streams=[]).application_args(run_id="r", summary_file="s")


def test_spark_env_points_spark_at_the_project_interpreter() -> None:
    env = make_operator(streams=["a"], env_vars={"EXTRA": "1"}).spark_env()
    assert env["PYSPARK_PYTHON"] and Path(env["PYSPARK_PYTHON"]).exists()
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["EXTRA"] == "1"


def test_hook_defaults_to_local_spark_without_a_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_airflow.hooks import DEFAULT_LOCAL_MASTER, SluiceSparkSubmitHook

    monkeypatch.delenv("AIRFLOW_CONN_SLUICE_SPARK", raising=False)
    assert SluiceSparkSubmitHook(conn_id="sluice_spark").master == DEFAULT_LOCAL_MASTER


def test_hook_uses_the_airflow_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_airflow.hooks import SluiceSparkSubmitHook

    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_SPARK", '{"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077}')
    assert SluiceSparkSubmitHook(conn_id="sluice_spark").master == "spark://127.0.0.1:7077"


def test_hook_captures_the_summary_from_the_driver_log() -> None:
    from sluice_airflow.hooks import SluiceSparkSubmitHook

    hook = SluiceSparkSubmitHook(conn_id="sluice_spark")
    summary = RunSummary("local-7", [StreamRunSummary(stream="events_bronze", status="succeeded", input_rows=3)])
    hook._process_spark_submit_log(iter(["26/11/22 INFO starting\n", summary.to_line() + "\n", "bye\n"]))
    assert hook.run_summary == summary


def test_on_kill_stops_the_whole_process_group(tmp_path: Path) -> None:
    """A launcher with a child, like spark-submit's JVM with its Python driver: on_kill must stop both."""
    from sluice_airflow.hooks import SluiceSparkSubmitHook

    child_pid_file = tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {child_pid_file}; wait"
    hook = SluiceSparkSubmitHook(conn_id="sluice_spark")
    hook._submit_sp = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 30
    while not child_pid_file.exists() or not child_pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    child = int(child_pid_file.read_text())

    hook.on_kill()

    assert hook._submit_sp.wait(timeout=30) in (-signal.SIGTERM, -signal.SIGKILL)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child}").exists() and "Z" not in Path(f"/proc/{child}/stat").read_text().split()[2]:
        assert time.monotonic() < deadline, "the child outlived on_kill"
        time.sleep(0.02)


def test_health_check_operator_templates_its_stream() -> None:
    from airflow.sdk import DAG

    from sluice_airflow.operators import CheckpointHealthCheckOperator

    with DAG("health", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        operator = CheckpointHealthCheckOperator(task_id="health", stream="{{ params.stream }}",
                                                 params={"stream": "events_bronze"})
    operator.render_template_fields({"params": operator.params})
    assert operator.stream == "events_bronze"
    assert "stream" in operator.template_fields


def test_a_cluster_master_gets_the_code_archive_a_local_one_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowException

    from sluice_airflow import hooks

    submitted: list[str | None] = []

    def fake_submit(self: hooks.SluiceSparkSubmitHook, application: str = "", **kwargs: object) -> None:
        submitted.append(self._py_files)
        raise AirflowException("not run")

    monkeypatch.setattr(hooks.SluiceSparkSubmitHook, "submit", fake_submit)
    operator = make_operator(streams=["events_bronze"])
    monkeypatch.delenv("AIRFLOW_CONN_SLUICE_SPARK", raising=False)
    operator.submit("stream_runner.py", [], name="local")
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_SPARK", '{"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077}')
    operator.submit("stream_runner.py", [], name="cluster")
    assert submitted[0] is None
    assert submitted[1] is not None and Path(submitted[1]).name.startswith("sluice-code-")


def test_every_operator_takes_the_same_templated_catalog_and_roots() -> None:
    """A backfill's plan and its run, a health check and a repair must see one deployment, not the worker's env."""
    from sluice_airflow import operators

    shared = {"catalog", "landing_root", "lake_root", "checkpoint_root"}
    classes = [operators.StreamRunOperator, operators.BackfillOperator, operators.BackfillPlanOperator,
               operators.CheckpointHealthCheckOperator, operators.CheckpointRepairOperator]
    for operator_class in classes:
        assert shared <= set(operator_class.template_fields), operator_class.__name__


def test_the_backfill_plan_reads_the_roots_it_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import DAG

    from sluice_airflow.operators import BackfillPlanOperator
    from tests.helpers import events_stream, write_catalog

    monkeypatch.setenv("SLUICE_DATA_ROOT", str(tmp_path / "elsewhere"))
    catalog = write_catalog(tmp_path, events_stream())
    landing = tmp_path / "landing" / "events" / "2026-11-22"
    landing.mkdir(parents=True)
    (landing / "a.json").write_text('{"event_id": "1"}\n')
    os.utime(landing / "a.json", (1_795_000_000, 1_795_000_000))
    with DAG("plan_roots", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        plan = BackfillPlanOperator(task_id="plan", catalog=str(catalog), landing_root=str(tmp_path / "landing"),
                                    lake_root=str(tmp_path / "lake"), checkpoint_root=str(tmp_path / "cp"))
    params = {"stream": "events", "start": "2026-11-18T00:00:00Z", "end": "2026-11-25T00:00:00Z",
              "select_by": "file_time", "mode": "append", "dry_run": True}
    result = plan.execute({"params": params, "run_id": "manual__1"})  # type: ignore[arg-type]
    # The stream has never run, so its next run reads the file: the plan leaves it to the live stream.
    assert (result["pending_files"], result["file_count"]) == (1, 0)


def test_a_backfill_plan_refused_by_what_the_landing_zone_holds_is_not_retried(tmp_path: Path) -> None:
    """A link in the landing zone, or a file name that is not UTF-8, is there on the next try too: the task fails
    for good, with the refusal, instead of retrying it with a traceback."""
    from airflow.sdk import DAG
    from airflow.sdk.exceptions import AirflowFailException

    from sluice_airflow.operators import BackfillPlanOperator
    from tests.helpers import events_stream, write_catalog

    catalog = write_catalog(tmp_path, events_stream())
    landing = tmp_path / "landing" / "events"
    landing.mkdir(parents=True)
    (landing / "planted\x1b[2J.json").symlink_to("/etc/hostname")
    with DAG("plan_refused", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        plan = BackfillPlanOperator(task_id="plan", catalog=str(catalog), landing_root=str(tmp_path / "landing"),
                                    lake_root=str(tmp_path / "lake"), checkpoint_root=str(tmp_path / "cp"))
    params = {"stream": "events", "start": "2026-11-18T00:00:00Z", "end": "2026-11-25T00:00:00Z",
              "select_by": "file_time"}
    with pytest.raises(AirflowFailException, match=r"backfill refused.*symbolic link") as refused:
        plan.execute({"params": params, "run_id": "manual__1"})  # type: ignore[arg-type]
    assert "\x1b" not in str(refused.value) and "planted\\x1b[2J.json" in str(refused.value)


@pytest.mark.parametrize("on_s3", ["roots", "catalog paths"])
def test_the_health_check_reads_s3_with_the_storage_connection(
        tmp_path: Path, s3: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        on_s3: str) -> None:
    """Roots on a real S3-compatible server, or a catalog's own absolute S3 paths under local roots, the credentials
    only in the Airflow connection ``sluice_storage``: the check reads the store with them, and the secret is in no
    log line and not in the result."""
    import json as json_module

    from airflow.sdk import DAG

    from sluice.storage import store
    from sluice_airflow.operators import CheckpointHealthCheckOperator
    from tests.helpers import events_stream, write_catalog

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP"):
        monkeypatch.delenv(name)
    store._store.cache_clear()  # no client made with the environment's credentials may serve the check
    secret = "never-print-this-secret-4711"
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_STORAGE", json_module.dumps({
        "conn_type": "aws", "login": "sluice-test", "password": secret,
        "extra": {"region_name": "us-east-1", "endpoint_url": endpoint}}))
    if on_s3 == "roots":
        catalog = write_catalog(tmp_path, events_stream())
        lake, checkpoints = f"s3://{s3}/lake", f"s3://{s3}/checkpoints"
    else:
        catalog = write_catalog(tmp_path, events_stream(checkpoint=f"s3://{s3}/checkpoints/events",
                                                        sink={"path": f"s3://{s3}/lake/events"}))
        lake, checkpoints = str(tmp_path / "lake"), str(tmp_path / "checkpoints")
    with DAG("health_s3", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        check = CheckpointHealthCheckOperator(task_id="check", stream="events", catalog=str(catalog),
                                              landing_root=str(tmp_path / "landing"), lake_root=lake,
                                              checkpoint_root=checkpoints)
    result = check.execute({})  # type: ignore[arg-type]
    logged = "".join(capsys.readouterr())
    assert result["status"] == "OK" and [finding["code"] for finding in result["findings"]] == ["NEW"]
    assert "Object storage through connection 'sluice_storage'" in logged and "'AWS_SECRET_ACCESS_KEY': '***'" in logged
    assert secret not in logged and secret not in json_module.dumps(result)
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == secret, "the task process reads the store with the connection"


WARM_TOKEN = "w" * 32


def test_a_run_goes_warm_only_with_the_connection_and_nothing_an_own_application_needs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from airflow.sdk.exceptions import AirflowFailException

    from sluice.warm import WarmAddress

    monkeypatch.delenv("AIRFLOW_CONN_SLUICE_WARM", raising=False)
    assert make_operator(streams=["events_bronze"]).warm_target() is None  # no connection: cold
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_WARM", json.dumps(
        {"conn_type": "generic", "host": "warm-host", "port": 15050, "password": WARM_TOKEN}))
    assert make_operator(streams=["events_bronze"]).warm_target() == WarmAddress("warm-host", 15050, WARM_TOKEN)
    for own in ({"conf": {"spark.executor.memory": "8g"}}, {"env_vars": {"X": "1"}}, {"conn_id": "other_spark"},
                {"storage_conn_id": "other_store"}, {"spark_submit_kwargs": {"jars": "x.jar"}}):
        assert make_operator(streams=["events_bronze"], **own).warm_target() is None, own
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_WARM", json.dumps(
        {"conn_type": "generic", "host": "warm-host", "port": 15050, "password": "short"}))
    with pytest.raises(AirflowFailException, match="password"):
        make_operator(streams=["events_bronze"]).warm_target()


def test_killing_a_warm_task_closes_its_connection_even_before_it_is_made() -> None:
    import socket

    operator = make_operator(streams=["events_bronze"])
    near, far = socket.socketpair()
    operator.warm_hook._keep(near)
    operator.on_kill()
    assert far.recv(1) == b""  # the server side sees the client go
    operator = make_operator(streams=["events_bronze"])
    operator.on_kill()  # killed while the catalog loads: the connection made next is closed at once
    near, far = socket.socketpair()
    operator.warm_hook._keep(near)
    assert far.recv(1) == b"" and near.fileno() == -1
