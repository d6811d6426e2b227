"""The manual checkpoint-repair DAG: pick a stream and an action in the trigger form, confirm, and run."""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from sluice.catalog import Catalog, load_catalog
from sluice.repair import ACTIONS
from sluice_airflow.dag_factory import START_DATE
from sluice_airflow.operators import CheckpointHealthCheckOperator, CheckpointRepairOperator


def repair_dag(catalog: Catalog | None = None, *, doc: str = "") -> DAG:
    streams = [stream.name for stream in (catalog or load_catalog())]
    with DAG(
        dag_id="checkpoint_repair",
        description="Explicit checkpoint repair: backup, quarantine a torn offsets file, re-pin the query id",
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args={"owner": "data-eng", "retries": 1, "retry_delay": timedelta(seconds=30)},
        tags=["sluice", "maintenance"],
        doc_md=doc,
        params={
            "stream": Param(streams[0] if streams else "", type="string", enum=streams,
                            description="The catalog stream whose checkpoint to repair"),
            "action": Param("backup", type="string", enum=list(ACTIONS),
                            description="backup: copy the checkpoint beside it. quarantine-offsets: move a torn, "
                                        "uncommitted latest offsets file aside. repin-query-id: restore the query id "
                                        "recorded in the Delta table"),
            "confirm": Param(False, type="boolean", description="Tick to confirm: the action changes the checkpoint"),
        },
    ) as dag:
        repair = CheckpointRepairOperator(
            task_id="repair",
            stream="{{ params.stream }}",
            action="{{ params.action }}",
            confirm="{{ params.confirm }}",
        )
        after = CheckpointHealthCheckOperator(task_id="health_after_repair", stream="{{ params.stream }}")
        repair >> after
    return dag
