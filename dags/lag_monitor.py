"""
### Sluice lag monitor

Every five minutes: the lag of every catalog stream, computed from its source and its checkpoint without a JVM
(files and bytes unread, Kafka offsets or Delta versions behind, seconds since the last commit), its status (OK,
WARN, CRITICAL, STALLED, STOPPED) from the catalog's `alerts` thresholds, and the observation kept in the lag
history. A status change is sent to the task log, to the JSON webhook of the `sluice_alert_webhook` connection
(Slack and Teams take it) when it exists, and by email to the stream's `alerts.email_to`. No repeats while the
status stays the same; a worse status escalates; the return to OK resolves. Streams with `alerts.catch_up` get a
run of their ingest DAG when they are CRITICAL or STOPPED and no run is active.
"""

from __future__ import annotations

from sluice_airflow.monitor import lag_monitor_dag

dag = lag_monitor_dag(doc=__doc__)
