"""The Delta maintenance DAG: every night, each stream's tables compacted, vacuumed and checkpointed under its lock,
and the run log's."""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from sluice.catalog import Catalog, load_catalog
from sluice.operations.maintenance import MAX_RETENTION_HOURS
from sluice_airflow.dag_factory import sluice_dag
from sluice_airflow.operators import DeltaMaintenanceOperator

# Nightly, off the hour, when few streams run.
SCHEDULE = "17 3 * * *"


def maintenance_dag(catalog: Catalog | None = None, *, doc: str = "", schedule: str | None = SCHEDULE) -> DAG:
    streams = [stream.name for stream in (catalog or load_catalog())]
    with sluice_dag(
        "delta_maintenance",
        description="Compact, vacuum and checkpoint every Delta table of the catalog and the run log, on delta-rs",
        schedule=schedule,
        tags=["maintenance"],
        doc=doc,
        retry_delay=timedelta(minutes=5),
        params={
            "streams": Param([], type="array", items={"type": "string", "enum": streams}, uniqueItems=True,
                             title="Streams", description="The streams whose tables to maintain; empty: every stream "
                                                          "and the run log"),
            "vacuum_retention_hours": Param(None, type=["null", "number"], minimum=0, maximum=MAX_RETENTION_HOURS,
                                            title="Vacuum retention (hours)",
                                            description="Keep removed files this long. Default, and the least "
                                                        "accepted: each table's delta.deletedFileRetentionDuration "
                                                        "(7 days when unset)"),
            "dry_run": Param(False, type="boolean", title="Dry run",
                             description="Report what would be vacuumed; change nothing"),
        },
    ) as dag:
        # One task per stream, each under its own lock: one stream's failure leaves the others maintained, and fails
        # the DAG run.
        for name in streams:
            DeltaMaintenanceOperator(task_id=f"maintain_{name}", stream=name)
        DeltaMaintenanceOperator(task_id="run_log", stream=None)
    return dag
