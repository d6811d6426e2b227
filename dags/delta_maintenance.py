"""
### Delta maintenance

Nightly, for every table Sluice writes (each stream's sink, dead-letter and fan-out tables, then the run log), on
delta-rs without Spark:

- **compact** small files into files of the table's `delta.targetFileSize` (100 MiB when unset). The commit changes
  no data: a Delta-source stream reading the table sees nothing new.
- **vacuum** files removed longer ago than the table's `delta.deletedFileRetentionDuration` (7 days when unset).
  The `vacuum_retention_hours` param may keep them longer, never shorter. Skipped while a stream reading the table
  has versions left to read older than that.
- **checkpoint** the Delta log and delete commit files older than `delta.logRetentionDuration` (30 days).

Each stream's tables are maintained while holding its lock, waiting for a running stream to finish. Trigger it by
hand with `streams` to maintain only some, or `dry_run` to see what a vacuum would delete. The same from a shell:
`python -m sluice maintain`.
"""

from __future__ import annotations

from sluice_airflow.maintenance_dag import maintenance_dag

dag = maintenance_dag(doc=__doc__)
