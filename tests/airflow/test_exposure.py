"""What a run's Spark driver opens to the network: a real spark-submit of the stream runner, built by the operator as
a `make run` task builds it (no Spark connection: a local master), listens on loopback only, and its UI cannot kill.

The run is held in the middle of its first batch (a fault point), while every part of the driver is up: the JVM's
RPC and block manager, the UI, the Python driver and its workers. Every listening socket of the process tree is read
with psutil then.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pendulum
import psutil
import pytest

from sluice.cli.demo_producer import DemoProducer
from sluice.operations.loopback import is_loopback
from tests.helpers import events_stream, roots_in, write_catalog

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


def listening(root: int) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every listening TCP socket of process ``root`` and its descendants."""
    found = []
    parent = psutil.Process(root)
    for process in [parent, *parent.children(recursive=True)]:
        try:
            for connection in process.net_connections(kind="inet"):
                if connection.status == psutil.CONN_LISTEN:
                    found.append((connection.laddr.ip, connection.laddr.port, process.name()))
        except psutil.NoSuchProcess:
            continue
    return found


def ui_settings(port: int) -> dict[str, str]:
    """The Spark settings of the application whose UI is on ``port``, from its REST API."""
    base = f"http://127.0.0.1:{port}/api/v1/applications"
    with urllib.request.urlopen(base, timeout=30) as answer:
        [application] = json.load(answer)
    with urllib.request.urlopen(f"{base}/{application['id']}/environment", timeout=30) as answer:
        return dict(json.load(answer)["sparkProperties"])


def test_a_local_run_listens_on_loopback_only_and_its_ui_cannot_kill(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import DAG

    from sluice_airflow.operators import StreamRunOperator

    monkeypatch.delenv("AIRFLOW_CONN_SLUICE_SPARK", raising=False)
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    faults = tmp_path / "faults"
    faults.mkdir()
    monkeypatch.setenv("SLUICE_FAULT_POINT", "before_commit:0")
    monkeypatch.setenv("SLUICE_FAULT_DIR", str(faults))
    catalog = write_catalog(tmp_path, events_stream())
    roots = roots_in(tmp_path)
    DemoProducer(roots.landing, seed=3).events_file(lines=20, now=dt.datetime(2026, 11, 23, tzinfo=dt.timezone.utc))
    with DAG("exposure", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        operator = StreamRunOperator(task_id="run", streams=["events"], catalog=str(catalog),
                                     landing_root=roots.landing, lake_root=roots.lake,
                                     checkpoint_root=roots.checkpoints)
    args = operator.application_args(run_id="exposure", summary_file=str(tmp_path / "summary.json"))
    submitted = threading.Thread(target=operator.submit, args=("stream_runner.py", args), kwargs={"name": "exposure"})
    submitted.start()
    try:
        deadline = time.monotonic() + 240
        while not (faults / "before_commit.reached").exists():
            assert submitted.is_alive() and time.monotonic() < deadline, "the run never reached its first batch"
            time.sleep(0.05)
        assert operator._hook is not None and operator._hook._submit_sp is not None
        sockets = listening(operator._hook._submit_sp.pid)
        ui = [port for _, port, _ in sockets if 4040 <= port < 4140]
        assert ui, f"the driver's UI is on (on loopback): {sockets}"
        settings = ui_settings(ui[0])
    finally:
        (faults / "before_commit.release").touch()
        submitted.join(timeout=240)
    assert sockets, "the driver listens on something (its RPC, its UI): the test must see it"
    exposed = [entry for entry in sockets if not is_loopback(entry[0])]
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert operator._hook.run_summary is not None and operator._hook.run_summary.ok
    assert settings.get("spark.ui.killEnabled") == "false"


def test_the_ui_kill_setting_and_addresses_reach_spark_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command and environment the hook gives spark-submit: loopback for a local master, the cluster's own
    addresses for a cluster master, and the task's own settings always win."""
    from airflow.sdk.exceptions import AirflowFailException

    from sluice_airflow.hooks import SluiceSparkSubmitHook

    monkeypatch.delenv("AIRFLOW_CONN_SLUICE_SPARK", raising=False)
    monkeypatch.delenv("SLUICE_SPARK_UI_ADDRESS", raising=False)
    local = SluiceSparkSubmitHook(conn_id="sluice_spark")
    command = local._build_spark_submit_command("app.py")
    for setting in ("spark.ui.killEnabled=false", "spark.driver.bindAddress=127.0.0.1",
                    "spark.driver.host=127.0.0.1"):
        assert setting in command
    assert local._env is not None and local._env["SPARK_LOCAL_IP"] == "127.0.0.1"

    monkeypatch.setenv("SLUICE_SPARK_UI_ADDRESS", "0.0.0.0")
    own = SluiceSparkSubmitHook(conn_id="sluice_spark", conf={"spark.driver.host": "10.1.2.3"})
    command = own._build_spark_submit_command("app.py")
    assert "spark.driver.host=10.1.2.3" in command and "spark.driver.host=127.0.0.1" not in command
    assert own._env is not None and own._env["SPARK_LOCAL_IP"] == "0.0.0.0"

    monkeypatch.setenv("SLUICE_SPARK_UI_ADDRESS", "every address")
    with pytest.raises(AirflowFailException, match=r"SLUICE_SPARK_UI_ADDRESS: .* is an IP address .*'every address'"):
        SluiceSparkSubmitHook(conn_id="sluice_spark")._build_spark_submit_command("app.py")

    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_SPARK", '{"conn_type": "spark", "host": "spark://10.0.0.1", "port": 7077}')
    cluster = SluiceSparkSubmitHook(conn_id="sluice_spark")
    command = cluster._build_spark_submit_command("app.py")
    assert "spark.ui.killEnabled=false" in command
    assert not any(part.startswith(("spark.driver.bindAddress", "spark.driver.host")) for part in command)
    assert "SPARK_LOCAL_IP" not in (cluster._env or {})



def test_the_warm_server_of_make_run_proves_itself_and_listens_on_loopback_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make run WARM=1`'s own session (the devserver's warm session, as `make run` spawns it): it is ready when it
    answers a signed ping, and then nothing of it listens beyond loopback."""
    from sluice.cli.devserver import WARM_PORT, spawn_session, wait_for_warm, warm_environment

    roots = roots_in(tmp_path)
    for variable, root in (("SLUICE_LANDING_ROOT", roots.landing), ("SLUICE_LAKE_ROOT", roots.lake),
                           ("SLUICE_CHECKPOINT_ROOT", roots.checkpoints)):
        monkeypatch.setenv(variable, root)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    server_env, _ = warm_environment(WARM_PORT)
    leader = spawn_session("warm", server_env)
    try:
        assert wait_for_warm(leader, WARM_PORT, server_env["SLUICE_WARM_TOKEN"]), "the warm server never answered"
        sockets = listening(leader.pid)
    finally:
        os.killpg(leader.pid, signal.SIGTERM)
        try:
            leader.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(leader.pid, signal.SIGKILL)
            leader.wait()
    assert ("127.0.0.1", WARM_PORT, "python") in {(ip, port, name[:6]) for ip, port, name in sockets}
    exposed = [entry for entry in sockets if not is_loopback(entry[0])]
    assert not exposed, f"listening beyond loopback: {exposed}"
