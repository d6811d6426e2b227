"""Test helpers: catalogs written into tmp_path, and oracles that do not use the code under test."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.cli.demo_producer import EVENT_SCHEMA
from sluice.operations.jars import spark_jars, submit_args
from sluice.paths import Roots

# A schema whose user_id may be NULL, and the four expectations of the rules issue's example.
RULES_SCHEMA = {
    "event_id": "string not null",
    "event_type": "string not null",
    "user_id": "string",
    "amount": "decimal(12,2)",
    "currency": "string",
    "event_time": "timestamp not null",
}
EXAMPLE_RULES = {
    "valid_amount": {"check": "amount IS NULL OR amount >= 0", "on_violation": "quarantine"},
    "known_currency": {"check": "currency IN ('EUR', 'USD', 'GBP')", "on_violation": "warn"},
    "not_from_the_future": {"check": "event_time <= current_timestamp() + INTERVAL 1 HOUR", "on_violation": "drop"},
    "has_user": {"check": "user_id IS NOT NULL", "on_violation": "fail"},
}


def events_stream(name: str = "events", **overrides: Any) -> dict[str, Any]:
    stream: dict[str, Any] = {
        "name": name,
        "source": {"type": "files", "format": "json", "path": "events",
                   "options": {"recursiveFileLookup": True, "pathGlobFilter": "*.json"}, "schema": dict(EVENT_SCHEMA)},
        "transform": "bronze_events",
        "sink": {"path": f"bronze/{name}", "partition_by": ["event_date"], "engine": "rs"},
        "checkpoint": f"bronze/{name}",
        "schedule": "*/5 * * * *",
    }
    stream.update(overrides)
    return stream


def write_catalog(folder: Path, *streams: dict[str, Any]) -> Path:
    path = folder / "catalog.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "streams": list(streams)}, sort_keys=False), encoding="utf-8")
    return path


def roots_in(folder: Path) -> Roots:
    return Roots(landing=str(folder / "landing"), lake=str(folder / "lake"), checkpoints=str(folder / "checkpoints"))


def expected_events(landing: Path, *, between: tuple[datetime, datetime] | None = None,
                    files: list[Path] | None = None, rescue: bool = True) -> tuple[list[tuple[Any, ...]], int]:
    """The good bronze rows and the dead-letter count, computed from the files with the json module alone.

    A line is good when it is a JSON object whose required fields are present. An amount that is not a number is
    rescued under ``rescue`` (the default drift policy: the row's amount is NULL), and makes the line a dead letter
    otherwise (``schema_evolution: none``).
    Rows are (event_id, lower-cased event_type, user_id, amount as Decimal or None, event date string).
    ``between`` keeps the good rows whose event time is in ``[start, end)``; ``files`` reads only those files.
    """
    good: list[tuple[Any, ...]] = []
    bad = 0
    for path in sorted(files if files is not None else landing.rglob("*.json")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if not isinstance(record, dict) or any(
                record.get(key) is None for key in ("event_id", "event_type", "user_id", "event_time")
            ):
                bad += 1
                continue
            amount = record.get("amount")
            try:
                parsed = None if amount is None else Decimal(str(amount)).quantize(Decimal("0.01"))
            except InvalidOperation:
                if not rescue:
                    bad += 1
                    continue
                parsed = None
            if between and not between[0] <= datetime.fromisoformat(record["event_time"]) < between[1]:
                continue
            good.append((record["event_id"], record["event_type"].strip().lower(), record["user_id"], parsed,
                         record["event_time"][:10]))
    return sorted(good, key=repr), bad


def table_rows(path: str, columns: list[str], *, version: int | None = None) -> list[tuple[Any, ...]]:
    """A Delta table's rows (current or as of ``version``), read with delta-rs (not with the writer under test)."""
    from sluice.storage.delta import read_table

    data = read_table(path, columns, version=version).to_pylist()
    return sorted((tuple(row[c] for c in columns) for row in data), key=repr)


def keep_pristine(folder: Path) -> Path:
    """Copy a world (landing, lake, checkpoints, catalog) beside itself, for :func:`fresh_world` to restore."""
    import shutil

    shutil.copytree(folder, folder.with_name("pristine"))
    return folder


def fresh_world(golden: Path) -> tuple[Any, Roots, Path]:
    """Restore the pristine copy of a world at the same path: Spark's file source log records absolute paths, so
    a checkpoint copied elsewhere would see every file as new. Returns its catalog, roots and folder."""
    import shutil

    from sluice.catalog import load_catalog

    shutil.rmtree(golden)
    shutil.copytree(golden.with_name("pristine"), golden)
    return load_catalog(golden / "catalog.yaml"), roots_in(golden), golden


needs_jvm_jars = pytest.mark.skipif(
    not spark_jars(), reason="needs the JVM jars (delta-spark, the Kafka connector, s3a): `make venv` with Maven")


def spark_submit(*arguments: str, master: str = "local[2]") -> list[str]:
    """A spark-submit command as Sluice's operators build one: the project's spark-submit, the resolved jars and
    their Delta settings, no UI, two shuffle partitions."""
    import sys

    return [str(Path(sys.executable).parent / "spark-submit"), "--master", master, "--conf", "spark.ui.enabled=false",
            "--conf", "spark.sql.shuffle.partitions=2", *submit_args(), *arguments]


def driver_options_env(catalog: Path, streams: list[str], roots: Roots) -> dict[str, str]:
    """``SPARK_SUBMIT_OPTS`` for a test's spark-submit of ``streams``, as Sluice's operators give a run's driver: the
    class archive, the light JIT when the run is small (:func:`sluice.operations.jvm.small_run`), Spark's log at WARN.
    A cold JVM spends most of a short run loading and compiling Spark's classes; a test's run is short."""
    from sluice.catalog import load_catalog
    from sluice.errors import SluiceError
    from sluice.operations.jvm import small_run

    try:
        selected = load_catalog(catalog).select(streams)
    except SluiceError:  # a catalog the run itself must refuse: no small run to tell
        selected = []
    return submit_options_env(small=bool(selected) and small_run(selected, roots))


def submit_options_env(*, small: bool = False) -> dict[str, str]:
    """``SPARK_SUBMIT_OPTS`` for a test's spark-submit, as the operators give a driver: the class archive, Spark's log
    at WARN, and the light JIT only for a ``small`` run. A backfill's, a redrive's and the warm server's run are not
    small (``make run WARM=1`` and the operators give them the full JIT)."""
    from sluice.operations.jvm import driver_java_options, log_options, submit_env

    return submit_env([*driver_java_options(small=small), *log_options()])


def load_spark_app(script: str) -> Any:
    """A Spark entry point of spark_apps/ (``stream_runner.py``...), loaded as a module: it imports pyspark, but
    starts no JVM. The scripts are no package modules, so they are not importable by name."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "spark_apps" / script
    spec = importlib.util.spec_from_file_location(script.removesuffix(".py"), path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_GIVEN_PORTS: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, for a server a test starts, from below the kernel's ephemeral range. A port
    ``bind(0)`` gives comes from that range, which is also where every outgoing connection takes its own port: in the
    seconds before a JVM or Airflow binds it, a client (a Python worker, a Kafka or S3 call) could take it."""
    import random
    import socket

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux: the IANA dynamic range starts at 49152
        low = 49152
    for _ in range(1000):
        port = random.randint(max(1024, low - 12000), low - 1)
        if port in _GIVEN_PORTS:  # given to a server that may not have bound it yet
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        _GIVEN_PORTS.add(port)
        return port
    raise AssertionError(f"no free port below {low} on {host}")


def py4j_commands(monkeypatch: pytest.MonkeyPatch, prefix: str) -> list[str]:
    """The Py4J commands starting with ``prefix`` that the calling thread sends from now on (until ``monkeypatch``
    is undone), each split into its lines: ``c`` calls a method (object, then method name), ``r`` looks a class's
    member up by reflection. Py4J's finalizer thread frees Java objects through the same connections: its commands
    are left out."""
    import threading

    from py4j.clientserver import ClientServerConnection

    sent: list[str] = []
    send = ClientServerConnection.send_command
    this_thread = threading.get_ident()

    def counted(connection: Any, command: str) -> Any:
        if threading.get_ident() == this_thread and command.startswith(prefix):
            sent.append(command)
        return send(connection, command)

    monkeypatch.setattr(ClientServerConnection, "send_command", counted)
    return sent
