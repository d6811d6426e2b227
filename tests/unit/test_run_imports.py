"""What a run imports: the stream runner's modules leave out the libraries a run of the bundled stream does not use
(each costs a cold driver its import time before the session starts; docs/performance/cost.md)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import PROJECT

# The runner's entry point and the modules it loads before the session, as spark_apps/stream_runner.py does.
IMPORTS = ("import sys; import stream_runner; from sluice.catalog import load_catalog; "
           "from sluice_spark.runner import run_or_refuse; from sluice_spark.session import configure_sluice; "
           "print(' '.join(sorted(name for name in ('pandas', 'airflow') if name in sys.modules)))")


def test_the_stream_runner_imports_neither_pandas_nor_airflow() -> None:
    path = os.pathsep.join([str(PROJECT / "include"), str(PROJECT / "spark_apps"), str(PROJECT),
                            os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], f"imported by the stream runner: {done.stdout}"
