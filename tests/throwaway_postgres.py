"""A throwaway PostgreSQL for a test module: ``tests/postgres.sh`` (the PG tier's own set-up) run around a command
that prints the database's URL and waits until the fixture closes its input, so the script's cleanup stops the
server and deletes its data. Where PostgreSQL cannot be had, the script says why and skips; so does the test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "postgres.sh"
_HOLD = "import os, sys; print(os.environ['SLUICE_TEST_AIRFLOW_DB'], flush=True); sys.stdin.read()"


@contextmanager
def throwaway_postgres() -> Iterator[str]:
    """The SQLAlchemy URL (psycopg2) of a fresh database on a private server, for as long as the block runs."""
    state = Path(tempfile.mkdtemp(prefix="sluice-pg-iceberg-")) / "state"  # its own: never another run's server
    state.parent.chmod(0o755)  # run as root, the script runs the server as `postgres`, which must enter it
    env = {**os.environ, "SLUICE_PG_STATE": str(state)}
    server = subprocess.Popen(["bash", str(SCRIPT), sys.executable, "-c", _HOLD], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert server.stdout is not None and server.stdin is not None
    url = server.stdout.readline().strip()
    try:
        if not url.startswith("postgresql"):
            _, errors = server.communicate(timeout=120)
            if server.returncode == 0 and "SKIPPED" in errors:
                pytest.skip(f"no PostgreSQL: {errors.strip().splitlines()[0]}")
            raise AssertionError(f"tests/postgres.sh failed ({server.returncode}): {errors[-2000:]}")
        yield url
    finally:
        if server.poll() is None:
            server.stdin.close()
            server.wait(timeout=120)
        shutil.rmtree(state.parent, ignore_errors=True)
