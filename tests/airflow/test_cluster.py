"""Cluster mode, proven: a real Spark standalone master and worker on 127.0.0.1, started from the pip-installed
Spark, and the real ingest DAG submitting to it through the Airflow connection.

The Delta writes of the rs engine happen in the executor's Python workers; the project's code reaches them as the
``--py-files`` archive the operator builds. The table must be exact, and the cluster is stopped afterwards.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.cli.demo_producer import DemoProducer
from tests.airflow.test_dag_e2e import xcom_value
from tests.helpers import expected_events, free_port, table_rows

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]


def wait_for(condition: object, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def master_state(ui_port: int) -> dict[str, object]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as response:
            return json.load(response)  # type: ignore[no-any-return]
    except OSError:
        return {}


class Cluster:
    def __init__(self, master_port: int, ui_port: int, work: Path) -> None:
        self.master_port, self.ui_port, self.work = master_port, ui_port, work

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    folder = tmp_path_factory.mktemp("standalone")
    cluster = Cluster(free_port(), free_port(), folder / "work")
    env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOG_DIR": str(folder / "logs"), "SPARK_NO_DAEMONIZE": "1"}
    spark_class = str(spark_home / "bin" / "spark-class")
    processes: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> None:
        log = (folder / f"{name}.log").open("wb")
        processes.append(subprocess.Popen([spark_class, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))

    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
              "--port", str(cluster.master_port), "--webui-port", str(cluster.ui_port))
        wait_for(lambda: master_state(cluster.ui_port).get("status") == "ALIVE", "the master")
        start("worker", "org.apache.spark.deploy.worker.Worker", cluster.url, "--host", "127.0.0.1",
              "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", "2", "--memory", "2g",
              "--work-dir", str(cluster.work))
        wait_for(lambda: master_state(cluster.ui_port).get("aliveworkers") == 1, "the worker to register")
        yield cluster
    finally:
        for process in reversed(processes):
            os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    assert all(process.poll() is not None for process in processes)


def test_the_ingest_dag_runs_on_a_standalone_cluster(standalone: Cluster, airflow_db: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    for variable, folder in (("SLUICE_LANDING_ROOT", "landing"), ("SLUICE_LAKE_ROOT", "lake"),
                             ("SLUICE_CHECKPOINT_ROOT", "checkpoints")):
        monkeypatch.setenv(variable, str(tmp_path / folder))
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_SPARK", json.dumps(
        {"conn_type": "spark", "host": "spark://127.0.0.1", "port": standalone.master_port}))
    DemoProducer(tmp_path / "landing", seed=47, malformed_rate=0.05).produce(
        files=3, lines=60, now=dt.datetime(2026, 11, 22, 9, tzinfo=dt.timezone.utc))
    dag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags")).get_dag("ingest_events_bronze")

    run = dag.test()

    assert run.state == DagRunState.SUCCESS
    [summary] = xcom_value(dag.dag_id, run.run_id, "run_stream")
    assert summary["app_id"].startswith("app-"), f"{summary['app_id']} is not a standalone application"
    [stream] = summary["streams"]
    # The bundled stream rescues an amount that is no number, then quarantines the purchase that lacks one
    # (purchase_has_amount): the same rows are dead letters as under schema_evolution none.
    good, bad = expected_events(tmp_path / "landing" / "events", rescue=False)
    assert (stream["status"], stream["output_rows"], stream["dead_letter_rows"]) == ("succeeded", len(good), bad)
    lake = tmp_path / "lake" / "bronze" / "events"
    assert sorted(row[0] for row in table_rows(str(lake), ["event_id"])) == sorted(row[0] for row in good)

    # The executor ran in the worker, and fetched the project's code archive from the driver.
    [app] = [folder for folder in standalone.work.iterdir() if folder.name == summary["app_id"]]
    shipped = [path.name for path in app.rglob("sluice-code-*.zip")]
    assert shipped, f"no code archive in the executor's folder {app}"
    finished = master_state(standalone.ui_port).get("completedapps")
    assert isinstance(finished, list) and summary["app_id"] in [item["id"] for item in finished]
