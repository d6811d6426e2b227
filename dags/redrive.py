"""
### Redrive (manual)

Sends one stream's dead letters again through the stream's *current* definition (schema, drift policy, transform,
rules, lookups), after a fix. Trigger it with the form:

- `stream`, `reason` (the dead letters whose reason starts with it; empty for all), `since` and `until` (their
  ingestion time, ISO 8601), `timezone`, `dry_run` (on by default).
- `plan` validates the params and counts the selected dead letters per reason, without Spark. A bad param fails it
  with the field's name, before anything is read.
- `redrive` runs one Spark job under the stream's lock. Rows that now pass land in the stream's table with their
  original `_source_file` and ingestion time, the redrive's run id in the commit info; rows that still fail stay
  dead letters with their new reason. A landed dead letter is marked with the run id (`redriven_by`) and is never
  redriven again. A retry of the task finishes an interrupted redrive: each row lands once.
"""

from __future__ import annotations

from sluice_airflow.redrive_dag import redrive_dag

dag = redrive_dag(doc=__doc__)
