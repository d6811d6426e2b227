"""
### Sluice ingest DAGs

One DAG per stream of the catalog (`include/sluice/streams.yaml`, or `SLUICE_CATALOG`). Each run starts a Spark
application that processes everything that arrived since the stream's checkpoint with `trigger(availableNow=True)`,
commits it exactly once to Delta, and stops. The run summary is the task's XCom value.
"""

from __future__ import annotations

from sluice_airflow.dag_factory import ingest_dags

globals().update(ingest_dags(doc=__doc__))
