"""python -m sluice <command>: Sluice's command-line tools.

    python -m sluice status [--record] [--json]              lag, health and trend of every stream
    python -m sluice health [--stream NAME ...] [--json]     the checkpoint health gate, without running
    python -m sluice repair ACTION --stream NAME             history, backup, quarantine-offsets, repin-query-id, reset
    python -m sluice maintain [--stream NAME ...]            compact, vacuum and checkpoint the Delta tables
    python -m sluice redrive --stream NAME [--dry-run] ...   dead letters again through the current definition, once
    python -m sluice demo                                    the demo: files in, one run, the tables printed
    python -m sluice demo-producer --landing-root DIR ...    demo events into a landing zone or a Kafka topic
    python -m sluice warm run --stream NAME | ping           a run on the warm server (warm mode), or its status
    python -m sluice kafka-broker --folder DIR               a local Kafka broker (KRaft, 127.0.0.1) for tests, demos
    python -m sluice iceberg-rest --folder DIR               a local Iceberg REST catalog (127.0.0.1) for tests
    python -m sluice jars [--force]                          resolve the JVM jars (include/jvm/pom.xml) with Maven
    python -m sluice jvm-classes                             compile Sluice's own JVM classes (include/jvm/drift)
    python -m sluice jvm-archive [--force]                   record the Spark driver's class archive (faster starts)
    python -m sluice pyspark-bytecode                        bytecode in the PySpark zip Spark's Python processes load
    python -m sluice catalog-schema [--write | --check]      the catalog's JSON Schema, generated from the code
    python -m sluice --version                               the installed version

Each command's module is imported only when it runs.
"""

from __future__ import annotations

import importlib
import os
import sys

COMMANDS = {"status": "sluice.cli.status", "health": "sluice.cli.health", "repair": "sluice.cli.repair",
            "maintain": "sluice.cli.maintain", "redrive": "sluice.cli.redrive",
            "demo": "sluice.cli.demo", "demo-producer": "sluice.cli.demo_producer",
            "warm": "sluice.cli.warm", "jars": "sluice.cli.jars", "kafka-broker": "sluice.cli.kafka_broker",
            "iceberg-rest": "sluice.cli.iceberg_rest",
            "jvm-archive": "sluice.cli.jvm", "jvm-classes": "sluice.cli.jvm_classes",
            "pyspark-bytecode": "sluice.cli.pyspark_bytecode", "catalog-schema": "sluice.cli.catalog_schema"}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(__doc__)  # asked for: on stdout, for a pager or grep
        return 0
    if args and args[0] == "--version":
        from sluice import __version__

        print(f"sluice {__version__}")
        return 0
    if not args or args[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    command = importlib.import_module(COMMANDS[args[0]])
    try:
        code = int(command.main(args[1:]) or 0)
    except BrokenPipeError:
        if not _reader_gone():
            raise
        # The reader of stdout went away (``| head``) before the command ended: it did not finish, as a shell's
        # command killed by SIGPIPE does not.
        _silence_stdout()
        return SIGPIPE_EXIT
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:  # the reader had what it wanted; the command's own outcome stands
        _silence_stdout()
    return code


SIGPIPE_EXIT = 128 + 13


def _reader_gone() -> bool:
    """Whether stdout is a pipe or socket that nobody reads any more (a broken stderr is another matter)."""
    import select

    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return False
    poller = select.poll()
    poller.register(descriptor, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that Python's own flush at exit does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


if __name__ == "__main__":
    raise SystemExit(main())
