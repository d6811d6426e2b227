"""Sluice's operators: stream runs, backfills and redrives through spark-submit (or the warm server), checkpoint
health checks and repairs, and the Delta maintenance. Each is a few lines over the core (:mod:`sluice.operations`) and
the hooks (:mod:`sluice_airflow.hooks`)."""

from sluice.operations.gate import DEFAULT_LOCK_WAIT_SECONDS
from sluice_airflow.operators.backfill import BackfillOperator, BackfillPlanOperator
from sluice_airflow.operators.base import DEFAULT_SPARK_CONN_ID, SluiceOperator, SparkAppOperator, gate_failure
from sluice_airflow.operators.checkpoint import CheckpointHealthCheckOperator, CheckpointRepairOperator
from sluice_airflow.operators.maintenance import DeltaMaintenanceOperator
from sluice_airflow.operators.redrive import RedriveOperator, RedrivePlanOperator
from sluice_airflow.operators.stream import StreamRunOperator

__all__ = ["DEFAULT_LOCK_WAIT_SECONDS", "DEFAULT_SPARK_CONN_ID", "BackfillOperator", "BackfillPlanOperator",
           "CheckpointHealthCheckOperator", "CheckpointRepairOperator", "DeltaMaintenanceOperator", "RedriveOperator",
           "RedrivePlanOperator", "SluiceOperator",
           "SparkAppOperator", "StreamRunOperator", "gate_failure"]
