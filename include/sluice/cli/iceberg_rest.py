"""A real Iceberg REST catalog on this machine, for the tests: Apache Iceberg's own server classes (iceberg-core's
``RESTCatalogAdapter`` behind its ``RESTCatalogServlet``, what the apache/iceberg-rest-fixture image serves) on Jetty,
over a JDBC catalog on SQLite, no Docker. It runs from the jars ``python -m sluice jars`` resolved
(:mod:`sluice.operations.jars`, the ``iceberg-rest`` set) and ``include/jvm/iceberg-rest/IcebergRestServer.java``, run
by Java's source-file mode (nothing to build).

It listens on 127.0.0.1 only, without authentication: a test server. Its catalog database and its warehouse (the
tables' metadata and data files) live in one folder.

    python -m sluice iceberg-rest --folder DIR     run one in the foreground until interrupted
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from sluice.cli.kafka_broker import HOST
from sluice.cli.local_jvm import LocalJvmProcess, die_with_parent, serve_until_stopped
from sluice.errors import SluiceError
from sluice.operations.jars import NEEDS_JARS, POM, REST_SET, jar_paths

SERVER_SOURCE = POM.parent / "iceberg-rest" / "IcebergRestServer.java"
_LISTENING = re.compile(rb"^listening (\d+)$", re.MULTILINE)


class LocalIcebergRestCatalog(LocalJvmProcess):
    """One REST catalog server whose database, warehouse and log live in ``folder``. :meth:`start` waits until it
    answers ``GET /v1/config`` and returns its URL; :meth:`stop` stops it (SIGTERM, then SIGKILL)."""

    def __init__(self, folder: str | os.PathLike[str], *, port: int = 0, java: str = "java",
                 classpath: list[str] | None = None, heap: str = "256m") -> None:
        self.folder = Path(folder)
        self.port = port
        self.java = java
        self.classpath = classpath
        self.heap = heap
        self.url: str | None = None


    @property
    def log_file(self) -> Path:
        return self.folder / "server.log"

    @property
    def warehouse(self) -> Path:
        return self.folder / "warehouse"

    def _classpath(self) -> str:
        jars = self.classpath if self.classpath is not None else jar_paths(REST_SET)
        if not jars:
            raise SluiceError(f"the Iceberg REST catalog server's jars are not installed; run `make venv` with Maven "
                              f"installed (`python -m sluice jars`). They serve {NEEDS_JARS}")
        return os.pathsep.join(jars)

    def start(self, timeout: float = 90.0) -> str:
        """Start the server and return its URL (``http://127.0.0.1:<port>``) once it answers."""
        classpath = self._classpath()
        self.warehouse.mkdir(parents=True, exist_ok=True)
        log = open(self.log_file, "ab")  # noqa: SIM115 - the server's process writes to it until it stops
        start = log.tell()
        self.process = subprocess.Popen(
            [self.java, f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
             "-cp", classpath, str(SERVER_SOURCE), HOST, str(self.port), self.warehouse.absolute().as_uri(),
             str((self.folder / "catalog.db").absolute())],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise SluiceError(f"the Iceberg REST catalog server exited with code {self.process.returncode} as it "
                                  f"started; its log: {self.log_file}\n{self._log_tail()}")
            with open(self.log_file, "rb") as read:
                read.seek(start)
                found = _LISTENING.search(read.read())
            if found and self._answers(f"http://{HOST}:{int(found.group(1))}"):
                self.url = f"http://{HOST}:{int(found.group(1))}"
                return self.url
            if time.monotonic() > deadline:
                self.stop()
                raise SluiceError(f"the Iceberg REST catalog server did not answer within {timeout:.0f} s; its log: "
                                  f"{self.log_file}\n{self._log_tail()}")
            time.sleep(0.2)

    @staticmethod
    def _answers(url: str) -> bool:
        try:
            with urllib.request.urlopen(f"{url}/v1/config", timeout=2) as response:
                return isinstance(json.loads(response.read()), dict)
        except (OSError, urllib.error.URLError, ValueError):
            return False

    @contextlib.contextmanager
    def running(self, timeout: float = 90.0) -> Iterator[str]:
        url = self.start(timeout)
        try:
            yield url
        finally:
            self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice iceberg-rest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", required=True, type=Path, help="the catalog's database, warehouse and log")
    parser.add_argument("--port", type=int, default=0, help="the port on 127.0.0.1 (default: a free one)")
    args = parser.parse_args(argv)
    server = LocalIcebergRestCatalog(args.folder, port=args.port)
    try:
        url = server.start()
    except SluiceError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    print(f"sluice: Iceberg REST catalog on {url} (warehouse {server.warehouse})", flush=True)
    serve_until_stopped(server)
    return 0
