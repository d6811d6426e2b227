"""Build one ingest DAG per catalog stream. DAG files call :func:`ingest_dags`; they hold no logic of their own."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Asset

from sluice.catalog import Catalog, load_catalog
from sluice.constants import HealthGate
from sluice.kinds import sink_kind
from sluice.model.stream import StreamSpec
from sluice_airflow.operators import CheckpointHealthCheckOperator, StreamRunOperator

START_DATE = pendulum.datetime(2026, 1, 1, tz="UTC")


def sluice_dag(dag_id: str, *, description: str, schedule: Any, tags: list[str], doc: str = "",
               owner: str = "data-eng", retries: int = 1, retry_delay: timedelta = timedelta(minutes=1),
               **kwargs: Any) -> DAG:
    """A DAG with the header every Sluice DAG shares: one start date, no catch-up (a stream reads what arrived,
    whatever the interval), one run at a time (each owns a checkpoint or its lock), retries, and the ``sluice``
    tag."""
    return DAG(dag_id=dag_id, description=description[:200], schedule=schedule, start_date=START_DATE, catchup=False,
               max_active_runs=1, default_args={"owner": owner, "retries": retries, "retry_delay": retry_delay},
               tags=["sluice", *tags], doc_md=doc, **kwargs)


def table_asset(stream: StreamSpec) -> Asset:
    """The Asset a stream's DAG produces: its Delta table (or what its sink's kind names, as a Kafka topic under its
    connection's name), so downstream DAGs can be scheduled on it.

    A table under the lake root is ``sluice://lake/<path>``: its identity must not change with the deployment's
    roots, or Airflow would see a new asset under the same name and deactivate the old one.
    """
    other = sink_kind(stream.sink).asset_uri(stream.sink)
    if other is not None:
        return Asset(name=f"sluice.{stream.name}", uri=other[0], group=other[1])
    path = stream.sink.table or ""
    if "://" in path:
        uri = path
    elif path.startswith("/"):
        uri = Path(path).as_uri()
    else:
        uri = f"sluice://lake/{path}"
    return Asset(name=f"sluice.{stream.name}", uri=uri, group="delta")


def arrival_asset(stream: StreamSpec) -> Asset:
    """The Asset of the data arriving at a stream's source, watched on the triggerer
    (:class:`~sluice_airflow.triggers.StreamArrivalTrigger`): each event it fires is new data, and starts the
    stream's DAG."""
    from airflow.sdk import AssetWatcher

    from sluice.connections.storage import DEFAULT_CONNECTION
    from sluice_airflow.triggers import StreamArrivalTrigger

    watcher = AssetWatcher(name=f"arrivals_{stream.name}",
                           trigger=StreamArrivalTrigger(stream=stream.name, storage_conn_id=DEFAULT_CONNECTION))
    return Asset(name=f"sluice.{stream.name}.arrivals", uri=f"sluice://arrivals/{stream.name}", group="arrivals",
                 watchers=[watcher])


def stream_schedule(stream: StreamSpec, catalog: Catalog | None) -> Any:
    """A stream's cron; for a stream that reads other streams' tables, those tables' Assets (data-aware: it runs
    after each update of any of them, so a join runs when either side has news); for a stream with ``arrival``,
    its arrival Asset; the Assets or the cron when it has both."""
    from airflow.sdk import AssetAny, AssetOrTimeSchedule, CronTriggerTimetable

    upstreams = [table_asset(upstream) for upstream in catalog.upstreams_of(stream)] if catalog is not None else []
    if stream.arrival is not None:
        upstreams.append(arrival_asset(stream))
    if not upstreams:
        return stream.schedule
    assets = AssetAny(*upstreams) if len(upstreams) > 1 else upstreams
    if stream.schedule is None:
        return assets
    return AssetOrTimeSchedule(timetable=CronTriggerTimetable(stream.schedule, timezone="UTC"), assets=assets)


def ingest_dag(stream: StreamSpec, *, catalog: Catalog | None = None, doc: str = "") -> DAG:
    """The scheduled DAG of one stream: a checkpoint health gate, then an availableNow run, on its cron or on the
    table it reads. The gate is a task of its own, or with ``health_gate: inline`` the run task's first step."""
    with sluice_dag(
        stream.dag_id,
        description=stream.description.strip() or f"Ingest {stream.name}",
        schedule=stream_schedule(stream, catalog),
        tags=["ingest", *stream.tags],
        doc=f"{doc}\n\n### Stream `{stream.name}`\n\n{stream.description}".strip(),
        owner=stream.owner,
        retries=2,
    ) as dag:
        gate = (CheckpointHealthCheckOperator(task_id="checkpoint_health", stream=stream.name)
                if stream.health_gate is HealthGate.TASK else None)
        run = StreamRunOperator(
            task_id="run_stream",
            streams=[stream.name],
            check_health=gate is None,
            outlets=[table_asset(stream)],
            execution_timeout=timedelta(hours=2),
        )
        if gate is not None:
            gate >> run
    return dag


def group_dag(group: str, streams: list[StreamSpec], *, doc: str = "") -> DAG:
    """The scheduled DAG of a group of streams: one health gate per stream (a task each, or the run task's first
    step with ``health_gate: inline``), then one availableNow run of every stream whose gate passed, in one Spark
    application (one JVM start for all of them). Each stream keeps its own lock, checkpoint and summary; a stream
    whose gate fails is left out of the run, and the run's task fails after the others ran, naming it."""
    names = ", ".join(stream.name for stream in streams)
    with sluice_dag(
        streams[0].dag_id,
        description=f"Ingest the streams of group {group}: {names}",
        schedule=streams[0].schedule,
        tags=["ingest", "group", *dict.fromkeys(tag for stream in streams for tag in stream.tags)],
        doc=f"{doc}\n\n### Group `{group}`\n\n" + "\n".join(
            f"- `{stream.name}`: {' '.join(stream.description.split())}" for stream in streams),
        owner=streams[0].owner,
        retries=2,
    ) as dag:
        inline = streams[0].health_gate is HealthGate.INLINE  # one kind of gate per group (the catalog checks)
        gates = {} if inline else {
            stream.name: CheckpointHealthCheckOperator(task_id=f"health_{stream.name}", stream=stream.name)
            for stream in streams}
        run = StreamRunOperator(
            task_id="run_streams",
            streams=[stream.name for stream in streams],
            health_gates={name: gate.task_id for name, gate in gates.items()} or None,
            check_health=inline,
            outlets=[table_asset(stream) for stream in streams],
            execution_timeout=timedelta(hours=2),
            trigger_rule="all_done",
        )
        list(gates.values()) >> run
    return dag


def ingest_dags(catalog: Catalog | None = None, *, doc: str = "") -> dict[str, DAG]:
    """Every stream's DAG, or its group's, by dag id."""
    catalog = catalog or load_catalog()
    groups: dict[str, list[StreamSpec]] = {}
    dags = []
    for stream in catalog:
        if stream.group is None:
            dags.append(ingest_dag(stream, catalog=catalog, doc=doc))
        else:
            groups.setdefault(stream.group, []).append(stream)
    dags += [group_dag(group, members, doc=doc) for group, members in groups.items()]
    return {dag.dag_id: dag for dag in dags}
