"""A real warm server (``spark-submit spark_apps/warm_server.py``) for the tests, in its own process group."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from sluice.paths import Roots
from sluice.warm import TOKEN_ENV, WarmAddress
from tests.helpers import spark_submit, submit_options_env

SERVER = Path(__file__).resolve().parents[1] / "spark_apps" / "warm_server.py"


class Server:
    """A warm server in its own process group, its output in a file."""

    def __init__(self, folder: Path, catalog: Path, roots: Roots, *env: tuple[str, str],
                 args: tuple[str, ...] = ()) -> None:
        self.token = secrets.token_urlsafe(32)
        self.log = folder / f"server-{time.monotonic_ns()}.log"
        command = spark_submit(str(SERVER), "--catalog", str(catalog), *roots.as_args(), "--port", "0", *args)
        # The driver's options `make run WARM=1` gives its warm server (the class archive, Spark's log at WARN).
        environ = {**os.environ, **submit_options_env(), "PYSPARK_PYTHON": sys.executable,
                   "PYSPARK_DRIVER_PYTHON": sys.executable, TOKEN_ENV: self.token, **dict(env)}
        self.process = subprocess.Popen(command, env=environ, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                        start_new_session=True)
        try:
            self.address = WarmAddress.parse(self._ready(), self.token)
        except BaseException:
            self.kill()
            raise
        self.client_env = {**os.environ, TOKEN_ENV: self.token, "SLUICE_WARM_ADDRESS": str(self.address),
                           "SLUICE_CATALOG": str(catalog), "SLUICE_LANDING_ROOT": roots.landing,
                           "SLUICE_LAKE_ROOT": roots.lake, "SLUICE_CHECKPOINT_ROOT": roots.checkpoints}

    def _ready(self, timeout: float = 240) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.output().splitlines():
                if line.startswith("SLUICE_WARM_READY "):
                    return line.split()[1]
            if self.process.poll() is not None:
                raise AssertionError(f"warm server exited with {self.process.returncode}:\n{self.output()[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"warm server not ready in {timeout}s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def wait_for_line(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            assert time.monotonic() < deadline, f"{text!r} not in the server's log:\n{self.output()[-3000:]}"
            time.sleep(0.05)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)

    def stop(self) -> None:
        """SIGTERM to spark-submit's JVM alone, as ``docker stop`` sends its first process: the JVM stops, and the
        Python driver, which serves the runs, must notice and exit by itself, not linger on the port."""
        if self.process.poll() is not None:
            return
        driver = int(str(self.ping()["pid"]))
        self.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while alive(driver) or self.process.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(driver, signal.SIGKILL)
                raise AssertionError(f"the warm server outlived its SIGTERM:\n{self.output()[-3000:]}")
            time.sleep(0.1)

    def ping(self) -> dict[str, object]:
        from sluice.warm import ping

        return ping(self.address)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False
