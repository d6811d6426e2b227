"""Named crash points for recovery tests, off unless ``SLUICE_FAULT_POINT`` is set.

A recovery test sets ``SLUICE_FAULT_POINT=<point>[:<batch>][,...]`` and ``SLUICE_FAULT_DIR`` on a spark-submit run. When
the run reaches the point, this module writes ``<dir>/<point>.reached`` holding its own pid and then blocks, so the
test can SIGKILL the whole application at exactly that point, or kill something else (a warm run's client) and then
let the run go on by creating ``<dir>/<point>.release``. Production runs never set the variable.
"""

from __future__ import annotations

import os
import time

POINTS = ("executor_written", "before_commit", "between_commits", "after_commit", "run_logged", "notified_journaled")


def _wanted(point: str, batch_id: int | None) -> bool:
    """Whether ``SLUICE_FAULT_POINT`` (``point[:batch]``, several separated by commas) names this arrival."""
    for wanted in os.environ.get("SLUICE_FAULT_POINT", "").split(","):
        name, _, batch = wanted.strip().partition(":")
        if name == point and not (batch and batch_id is not None and int(batch) != batch_id):
            return True
    return False


def reach(point: str, batch_id: int | None = None) -> None:
    if not _wanted(point, batch_id):
        return
    folder = os.environ.get("SLUICE_FAULT_DIR")
    if not folder:
        return
    marker = os.path.join(folder, f"{point}.reached")
    # Only the first arrival blocks; the killed run's successor must pass through. The pid is written to a file of
    # its own and linked to the marker's name (which fails if it exists): a test that sees the marker reads the pid
    # whole, never an empty file created an instant before its write (it would then not kill the parked worker).
    written = f"{marker}.{os.getpid()}.tmp"
    with open(written, "w", encoding="utf-8") as handle:
        handle.write(str(os.getpid()))
    try:
        os.link(written, marker)
    except FileExistsError:
        return
    finally:
        os.remove(written)
    release = os.path.join(folder, f"{point}.release")
    while not os.path.exists(release):  # wait for the SIGKILL the test sends once it sees the marker
        time.sleep(0.05)
