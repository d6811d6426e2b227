"""A real S3-compatible server for the object-storage tests: moto's server mode on 127.0.0.1, in its own venv.

The venv (``.venv-moto``, pinned by ``tests/requirements-moto.txt``) is created on first use: moto pins botocore,
which the project does not otherwise need. Each test gets its own bucket, and the environment a deployment would
give Sluice (``AWS_*``), so that obstore and delta-rs find the store the way they do in production.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers import free_port

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


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen[bytes]
    log: Path

    def create_bucket(self) -> str:
        name = f"sluice-{uuid.uuid4().hex[:12]}"
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT"), timeout=10)
        return name

    def client(self, service: str) -> Any:
        """A boto3 client of the server (S3 or SQS) with the test credentials."""
        import boto3

        return boto3.client(service, endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="sluice-test", aws_secret_access_key="sluice-test-secret")

    def notifying_queue(self, bucket: str, prefix: str, *, visibility_seconds: int = 30) -> str:
        """A new SQS queue that the bucket notifies of each object created under ``prefix`` (S3 event
        notifications, as a deployment sets them up); its URL."""
        sqs = self.client("sqs")
        url = sqs.create_queue(QueueName=f"{bucket}-{uuid.uuid4().hex[:6]}",
                               Attributes={"VisibilityTimeout": str(visibility_seconds)})["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.client("s3").put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={
            "QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"],
                                     "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": prefix}]}}}]})
        self.lose_messages(str(url))  # S3's test event
        return str(url)

    def lose_messages(self, queue: str) -> int:
        """Take every visible message off the queue unread, as an operator's mistake or an expiry would; how many."""
        sqs, lost = self.client("sqs"), 0
        while messages := sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", []):
            for message in messages:
                sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
            lost += len(messages)
        return lost

    def log_offset(self) -> int:
        return self.log.stat().st_size

    def requests_since(self, offset: int) -> list[str]:
        """The requests the server logged after ``offset`` bytes of its log (``GET /bucket?list-type=2...``)."""
        with open(self.log, "rb") as handle:
            handle.seek(offset)
            text = handle.read().decode("utf-8", errors="replace")
        return [line.split('"')[1] for line in text.splitlines() if line.count('"') >= 2]

    def environment(self) -> dict[str, str]:
        """What a deployment sets for Sluice to reach the store (test credentials: moto accepts any)."""
        return {"AWS_ACCESS_KEY_ID": "sluice-test", "AWS_SECRET_ACCESS_KEY": "sluice-test-secret",
                "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true",
                "AWS_CONDITIONAL_PUT": "etag"}


@contextlib.contextmanager
def session_reaches(spark: Any, server: S3Server) -> Iterator[None]:
    """The test session's Hadoop reaches ``server`` through s3a for the block, as a spark-submit run would: the s3a
    settings a run's session takes from the environment (``s3a_settings``), and the test credentials, which s3a would
    read from the JVM's environment, fixed when the session started. The settings are taken back afterwards."""
    from sluice_spark.session import s3a_settings

    environment = server.environment()
    wanted = {key.removeprefix("spark.hadoop."): value for key, value in s3a_settings(environment).items()}
    wanted |= {"fs.s3a.access.key": environment["AWS_ACCESS_KEY_ID"],
               "fs.s3a.secret.key": environment["AWS_SECRET_ACCESS_KEY"]}
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    before = {key: hadoop.getRaw(key) for key in wanted}
    for key, value in wanted.items():
        hadoop.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                hadoop.unset(key)
            else:
                hadoop.set(key, value)


def start_s3_server(log: Path) -> Iterator[S3Server]:
    python = moto_python()
    port = free_port()
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
        yield S3Server(endpoint, process, log)
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



