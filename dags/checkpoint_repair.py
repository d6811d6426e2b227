"""
### Checkpoint repair (manual)

Explicit, never automatic. Trigger with a stream, an action and `confirm` ticked:

- `history` (read-only, no confirmation): the sink table's newest versions and the query and batch that wrote each.
- `backup`: copy the checkpoint to `<checkpoint>.backup-<time>` beside it.
- `quarantine-offsets`: move a torn latest `offsets/N` of an uncommitted batch aside, so Spark plans it again.
- `repin-query-id`: write the query id recorded in the stream's Delta table back into `metadata`.
- `reset` with `version`: resume the stream after that Delta version of its sink. The checkpoint is cut back to the
  batch that wrote it, the tables are restored to it, and the next run reads the rest again. Pause the stream's DAG
  first; docs/guides/checkpoint-health.md has the procedure step by step.

Every action backs up what it changes first and refuses while a run holds the stream's lock. The health check runs
again afterwards. The same actions run from a shell: `python -m sluice repair <action> --stream <name>`.
"""

from __future__ import annotations

from sluice_airflow.repair_dag import repair_dag

dag = repair_dag(doc=__doc__)
