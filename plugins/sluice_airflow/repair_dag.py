"""The manual checkpoint-repair DAG: pick a stream and an action in the trigger form, confirm, and run."""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from sluice.catalog import Catalog, load_catalog
from sluice.operations.repair import ACTIONS, MAX_DELTA_VERSION
from sluice_airflow.dag_factory import sluice_dag
from sluice_airflow.operators import CheckpointHealthCheckOperator, CheckpointRepairOperator


def repair_dag(catalog: Catalog | None = None, *, doc: str = "") -> DAG:
    streams = [stream.name for stream in (catalog or load_catalog())]
    with sluice_dag(
        "checkpoint_repair",
        description="Explicit checkpoint repair: history, backup, quarantine offsets, re-pin the query id, reset",
        schedule=None,
        tags=["maintenance"],
        doc=doc,
        retry_delay=timedelta(seconds=30),
        params={
            "stream": Param(streams[0] if streams else "", type="string", enum=streams,
                            description="The catalog stream whose checkpoint to repair"),
            "action": Param("history", type="string", enum=list(ACTIONS),
                            description="history (read-only): the sink's versions and the batch that wrote each. "
                                        "backup: copy the checkpoint beside it. quarantine-offsets: move a torn, "
                                        "uncommitted latest offsets file aside. repin-query-id: restore the query id "
                                        "recorded in the Delta table. reset: resume the stream after `version`, "
                                        "rolling the tables back to it"),
            "version": Param(None, type=["null", "integer"], minimum=0, maximum=MAX_DELTA_VERSION,
                             description="reset only: the sink table's Delta version to resume after (see history)"),
            "confirm": Param(False, type="boolean",
                             description="Tick to confirm: every action but history changes the checkpoint"),
        },
    ) as dag:
        repair = CheckpointRepairOperator(
            task_id="repair",
            stream="{{ params.stream }}",
            action="{{ params.action }}",
            confirm="{{ params.confirm }}",
            version="{{ params.version }}",
        )
        after = CheckpointHealthCheckOperator(task_id="health_after_repair", stream="{{ params.stream }}")
        repair >> after
    return dag
