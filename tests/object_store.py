"""A real S3-compatible server for the object-storage tests: moto's server mode on 127.0.0.1, in its own venv.

The venv (``.venv-moto``, pinned by ``tests/requirements-moto.txt``) is created on first use: moto pins botocore,
which the project does not otherwise need. Each test gets its own bucket, and the environment a deployment would
give Sluice (``AWS_*``), so that obstore and delta-rs find the store the way they do in production.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
MOTO_VENV = PROJECT / ".venv-moto"
REQUIREMENTS = PROJECT / "tests" / "requirements-moto.txt"


def moto_python() -> Path:
    """The moto venv's interpreter, installed from the pinned requirements when they changed."""
    python = MOTO_VENV / "bin" / "python"
    stamp = MOTO_VENV / ".installed"
    wanted = REQUIREMENTS.read_text(encoding="utf-8")
    if not stamp.exists() or stamp.read_text(encoding="utf-8") != wanted:
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--clear", str(MOTO_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r",
                        str(REQUIREMENTS)], check=True)
        stamp.write_text(wanted, encoding="utf-8")
    return python


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen[bytes]

    def create_bucket(self) -> str:
        name = f"sluice-{uuid.uuid4().hex[:12]}"
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT"), timeout=10)
        return name

    def environment(self) -> dict[str, str]:
        """What a deployment sets for Sluice to reach the store (test credentials: moto accepts any)."""
        return {"AWS_ACCESS_KEY_ID": "sluice-test", "AWS_SECRET_ACCESS_KEY": "sluice-test-secret",
                "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true",
                "AWS_CONDITIONAL_PUT": "etag"}


def start_s3_server(log: Path) -> Iterator[S3Server]:
    python = moto_python()
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with open(log, "wb") as output:
        process = subprocess.Popen([str(python), "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                   stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2)
                break
            except (urllib.error.URLError, ConnectionError, OSError) as exc:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not start: {log.read_text(errors='replace')[-2000:]}") \
                        from exc
                time.sleep(0.1)  # a server start has no event to await
        yield S3Server(endpoint, process)
    finally:
        process.terminate()
        process.wait(timeout=10)


def uri(bucket: str, *parts: str) -> str:
    return "/".join([f"s3://{bucket}", *parts])


def upload(local: Path, target: str) -> None:
    """Copy a local folder up, file by file (Spark's checkpoint, a Delta table)."""
    from sluice.storage.store import folder

    destination = folder(target)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            relative = path.relative_to(local)
            destination.child(*relative.parts[:-1]).write_bytes(relative.parts[-1], path.read_bytes())



