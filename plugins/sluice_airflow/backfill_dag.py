"""The manual backfill DAG: a trigger form with typed params, a plan without Spark, then the bounded Spark job."""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from sluice.catalog import Catalog, load_catalog
from sluice.operations.backfill import DAG_ID as BACKFILL_DAG_ID
from sluice.operations.backfill import (
    DATE_TIME_PATTERN,
    DELTA_SELECT_BY,
    KAFKA_SELECT_BY,
    MAX_FILES_PER_TRIGGER,
    MAX_REASON_LENGTH,
    MODES,
    SELECT_BY,
    TIME_ZONE_PATTERN,
)
from sluice_airflow.dag_factory import sluice_dag
from sluice_airflow.operators import BackfillOperator, BackfillPlanOperator


def backfill_params(streams: list[str]) -> dict[str, Param]:
    """The trigger form: what JSON Schema can say is checked by Airflow when the run is triggered (a type, a stream
    of the catalog, a date-time's shape, the required start and end, which the form marks). What it cannot say (end
    after start, a range the stream allows, a mode the stream takes) the API server's trigger check refuses
    (:mod:`sluice_airflow.trigger_check`), and ``plan`` again for a run started another way."""
    return {
        "stream": Param(streams[0] if streams else "", type="string", enum=streams, title="Stream",
                        description="The catalog stream to backfill; it writes into the stream's own tables"),
        # Empty for a Delta source's version range; a file source's backfill without them is refused by the
        # trigger check.
        "start": Param(None, type=["null", "string"], format="date-time", pattern=DATE_TIME_PATTERN,
                       title="Start (inclusive)",
                       description="ISO 8601 with an offset, e.g. 2026-03-29T00:00:00+01:00; without one, the time "
                                   "zone below applies. Empty for a Delta source's version range"),
        "end": Param(None, type=["null", "string"], format="date-time", pattern=DATE_TIME_PATTERN,
                     title="End (exclusive)", description="ISO 8601, after start"),
        "start_version": Param(None, type=["null", "integer"], minimum=0,
                               title="Start version (Delta or Iceberg source)",
                               description="The first version of the upstream Delta table to backfill (included); "
                                           "of an Iceberg table, a snapshot's sequence number"),
        "end_version": Param(None, type=["null", "integer"], minimum=0, title="End version (Delta or Iceberg source)",
                             description="The last version to backfill (included); empty: the latest"),
        "offsets": Param(None, type=["null", "string"], title="Offsets (Kafka source)",
                         description='JSON: the first and last offset (both included) of each partition, e.g. '
                                     '{"0": [10, 50], "1": [0, 20]}; {"<topic>": {...}} for a stream of several '
                                     "topics"),
        "timezone": Param(None, type=["null", "string"], pattern=TIME_ZONE_PATTERN, title="Time zone of naive times",
                          description="An IANA name (e.g. Europe/Berlin) for start and end without an offset"),
        "select_by": Param(None, type=["null", "string"], enum=[None, *SELECT_BY, *DELTA_SELECT_BY, *KAFKA_SELECT_BY],
                           title="Select by",
                           description="Files: event_time (the default), rows whose event time is in the range; "
                                       "file_time, every row of the files modified in the range. A Delta or "
                                       "Iceberg source: version (the default), start_version to end_version; "
                                       "commit_time, the versions committed from start to end. A Kafka source: "
                                       "offset (the default), the offsets below; timestamp, the records from start "
                                       "to end"),
        "mode": Param("append", type="string", enum=list(MODES), title="Mode",
                      description="append: add the files the tables do not hold yet (running it twice adds "
                                  "nothing). replace: swap the range's rows from the files read, in one commit"),
        "dry_run": Param(True, type="boolean", title="Dry run",
                         description="Report the files, the rows to write and the rows to replace; write nothing"),
        "max_files_per_trigger": Param(None, type=["null", "integer"], minimum=1, maximum=MAX_FILES_PER_TRIGGER,
                                       title="Files per batch",
                                       description="append only: files per micro-batch (default: all at once)"),
        "reason": Param(None, type=["null", "string"], maxLength=MAX_REASON_LENGTH, pattern=r"^[^\x00-\x1f\x7f]*$",
                        title="Reason", description="Recorded in the Delta commit info of every backfill commit; one "
                                                    "line"),
    }


def backfill_dag(catalog: Catalog | None = None, *, doc: str = "") -> DAG:
    streams = [stream.name for stream in (catalog or load_catalog())]
    with sluice_dag(
        BACKFILL_DAG_ID,
        description="Replay a time range of a stream's source into its Delta table: append or replace, or dry run",
        schedule=None,
        tags=["backfill"],
        doc=doc,
        retry_delay=timedelta(minutes=1),
        params=backfill_params(streams),
    ) as dag:
        plan = BackfillPlanOperator(task_id="plan")
        run = BackfillOperator(task_id="backfill")
        plan >> run
    return dag
