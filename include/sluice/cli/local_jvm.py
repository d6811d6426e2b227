"""What the local JVM servers of the tests (:mod:`sluice.cli.kafka_broker`, :mod:`sluice.cli.iceberg_rest`) share: a
child that dies with its parent, its log's tail for an error, and a stop that ends its whole process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


def die_with_parent() -> None:
    """In the server's process before it execs: on Linux, SIGTERM it when the process that started it dies (a test
    run killed mid-way leaves no server behind); elsewhere nothing."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class LocalJvmProcess:
    """A server's process (started with ``start_new_session``) and its log file."""

    process: subprocess.Popen[bytes] | None = None

    @property
    def log_file(self) -> Path:
        raise NotImplementedError

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after ``timeout`` seconds."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def serve_until_stopped(server: LocalJvmProcess) -> None:
    """A command's foreground: wait until SIGTERM, Ctrl-C or the server's own exit, then stop the server."""
    stopped = False

    def stop(*_: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    try:
        while not stopped and server.process is not None and server.process.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
