"""
### Backfill (manual)

Replays a time range of one stream's source into the stream's own Delta tables, without touching the live
stream's checkpoint. Trigger it with the form:

- `stream`, `start`, `end` (ISO 8601 with an offset, or naive plus `timezone`), `select_by` (`event_time` or
  `file_time`), `mode` (`append` or `replace`), `dry_run` (on by default), `max_files_per_trigger`, `reason`.
- `plan` validates the params and lists what the backfill would read, without Spark. A bad param fails it with
  the field's name, before anything is read.
- `backfill` runs a bounded availableNow Spark job with its own checkpoint under
  `<checkpoint root>/_backfill/<stream>/<run id>`, holding the stream's lock (it waits for a running stream).
  `replace` swaps the range in one commit; `append` adds only files the tables do not hold. Files the live stream
  has not read yet are left to it. The summary is the task's XCom value.

Nothing in the form names a path, a Spark setting or a command: all of it comes from the catalog.
"""

from __future__ import annotations

from sluice_airflow.backfill_dag import backfill_dag

dag = backfill_dag(doc=__doc__)
