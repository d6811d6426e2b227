"""The manual redrive DAG: a trigger form with typed params, the selection counted without Spark, then the redrive."""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from sluice.catalog import Catalog, load_catalog
from sluice.operations.backfill import DATE_TIME_PATTERN, MAX_REASON_LENGTH, TIME_ZONE_PATTERN
from sluice.operations.redrive import DAG_ID as REDRIVE_DAG_ID
from sluice.operations.redrive import redrive_refusal
from sluice_airflow.dag_factory import sluice_dag
from sluice_airflow.operators.redrive import RedriveOperator, RedrivePlanOperator


def redrive_params(streams: list[str]) -> dict[str, Param]:
    """The trigger form. What a schema cannot say (until after since, a stream whose dead letters can be redriven)
    the API server's trigger check refuses (:mod:`sluice_airflow.trigger_check`), and ``plan`` again."""
    return {
        "stream": Param(streams[0] if streams else "", type="string", enum=streams, title="Stream",
                        description="The catalog stream whose dead letters go again through its current definition"),
        "reason": Param(None, type=["null", "string"], maxLength=MAX_REASON_LENGTH, pattern=r"^[^\x00-\x1f\x7f]*$",
                        title="Reason starts with",
                        description="Only dead letters whose reason starts with this text (the Streams page lists "
                                    "them); empty for all"),
        "since": Param(None, type=["null", "string"], pattern=DATE_TIME_PATTERN, title="Ingested since (inclusive)",
                       description="ISO 8601, e.g. 2026-03-29T00:00:00+01:00; empty for no bound"),
        "until": Param(None, type=["null", "string"], pattern=DATE_TIME_PATTERN, title="Ingested until (exclusive)",
                       description="ISO 8601, after since; empty for no bound"),
        "timezone": Param(None, type=["null", "string"], pattern=TIME_ZONE_PATTERN, title="Time zone of naive times",
                          description="An IANA name (e.g. Europe/Berlin) for since and until without an offset"),
        "dry_run": Param(True, type="boolean", title="Dry run",
                         description="Judge the selected rows and report what would land; commit nothing"),
    }


def redrive_dag(catalog: Catalog | None = None, *, doc: str = "") -> DAG:
    streams = [stream.name for stream in (catalog or load_catalog()) if redrive_refusal(stream) is None]
    with sluice_dag(
        REDRIVE_DAG_ID,
        description="Send a stream's dead letters again through its current definition, exactly once, or dry run",
        schedule=None,
        tags=["redrive"],
        doc=doc,
        retry_delay=timedelta(minutes=1),
        params=redrive_params(streams),
    ) as dag:
        plan = RedrivePlanOperator(task_id="plan")
        run = RedriveOperator(task_id="redrive")
        plan >> run
    return dag
