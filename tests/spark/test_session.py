"""What the session does to cut a cold driver's fixed costs (sluice_spark.session).

The classes whose static initialisers cost the most load ahead on the other core: their threads start, end and
report the class ready, and only where they can help. A Column operation is one round trip to the JVM. How much
either saves is timing: bench/bench_run_cost.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sluice_spark.session import (
    CASE_MAPPINGS_CLASS,
    DATAFRAME_DEBUGGING,
    GATEWAY_PORT_ENV,
    SESSION_EXTENSION_CLASS,
    missing_classes,
    preload_case_mappings,
    preload_session_classes,
)


def test_a_column_operation_is_one_round_trip_to_the_jvm(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sluice's sessions leave PySpark's DataFrame debugging off: with it on, each Column operation also sends its
    Python call site to the JVM, about eleven Py4J round trips instead of one."""
    from py4j.clientserver import ClientServerConnection
    from pyspark.errors.utils import is_debugging_enabled
    from pyspark.sql import functions as F

    assert spark.conf.get(DATAFRAME_DEBUGGING) == "false"
    assert not is_debugging_enabled()  # PySpark's own answer, cached for the process
    amount, currency = F.col("amount"), F.col("currency")
    commands: list[str] = []
    send = ClientServerConnection.send_command
    this_thread = threading.get_ident()

    def counted(connection: Any, command: str) -> Any:
        # This thread's calls only: Py4J's finalizer thread frees Java objects through the same connections.
        if threading.get_ident() == this_thread and command.startswith("c\n"):
            commands.append(command)
        return send(connection, command)

    monkeypatch.setattr(ClientServerConnection, "send_command", counted)
    ((amount >= 0) & currency.isNotNull()).alias("valid")
    called = [command.split("\n")[2] for command in commands]  # Py4J's call command: c, the object, the method
    assert called == ["geq", "isNotNull", "and", "as"], commands


def test_sparks_case_mappings_load_ahead_once_per_jvm(spark: Any, caplog: pytest.LogCaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The costly initialisation of Spark's ICU case mappings starts in a thread, once per JVM, and not at all when
    the session turned them off."""
    # The class Spark's ICU case mappings run through is there (and the test for it tells one that is not).
    assert missing_classes(spark, ["org.example.NoSuchClass", CASE_MAPPINGS_CLASS]) == ["org.example.NoSuchClass"]
    monkeypatch.setattr(spark.sparkContext, "_sluice_case_mappings", False, raising=False)  # as a fresh JVM
    off = spark.newSession()
    off.conf.set("spark.sql.icu.caseMappings.enabled", "false")
    assert preload_case_mappings(off) is None
    with caplog.at_level("DEBUG", logger="sluice_spark.session"):
        thread = preload_case_mappings(spark)
        assert thread is not None
        thread.join(timeout=120)
    assert not thread.is_alive()
    assert "case mappings ready" in caplog.text, caplog.text
    assert preload_case_mappings(spark.newSession()) is None  # the same JVM


def test_the_sessions_slowest_class_loads_ahead_only_where_the_jvm_runs_already(
        spark: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under spark-submit the driver's JVM is up before Python starts: the preload connects to its gateway and starts
    mllib's session extension loading before the session. Anywhere else the JVM would start without the session's
    settings, and under Spark Connect no session is built in it: nothing happens."""
    import pyspark.core.context as context
    from pyspark import SparkContext

    assert not missing_classes(spark, [SESSION_EXTENSION_CLASS])
    monkeypatch.delenv(GATEWAY_PORT_ENV, raising=False)
    assert preload_session_classes() is None
    monkeypatch.setenv(GATEWAY_PORT_ENV, "0")
    monkeypatch.setenv("SPARK_REMOTE", "sc://localhost")
    assert preload_session_classes() is None
    monkeypatch.delenv("SPARK_REMOTE")

    # As in a spark-submitted Python process: no gateway yet, and connecting gives the JVM's (this session's here).
    gateway, connected = SparkContext._gateway, []
    monkeypatch.setattr(SparkContext, "_gateway", None)
    monkeypatch.setattr(SparkContext, "_jvm", None)
    monkeypatch.setattr(context, "launch_gateway", lambda conf=None, **_: connected.append(conf) or gateway)
    with caplog.at_level("DEBUG", logger="sluice_spark.session"):
        thread = preload_session_classes()
        assert thread is not None
        thread.join(timeout=120)
    assert connected == [None] and SparkContext._jvm is not None
    assert not thread.is_alive()
    assert "mllib's SQL functions ready" in caplog.text, caplog.text


def test_each_spark_function_is_looked_up_in_the_jvm_once(spark: Any, monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Any) -> None:
    """PySpark finds a SQL function (``F.when``, ``F.lit``...) in the JVM through two reflection round trips before
    each call; Sluice's sessions keep what they found. The bundled stream's frame built a second time calls hundreds
    of them but looks up only a few (those PySpark finds on other paths: a literal's, a name's, an operator's), and is
    the same frame."""
    from pyspark.sql.functions import builtin

    from sluice.catalog import DEFAULT_CATALOG, load_catalog
    from sluice.paths import Roots
    from sluice_spark.runner import build_routed_frame
    from tests.helpers import py4j_commands

    stream = load_catalog(DEFAULT_CATALOG).get("events_bronze")
    roots = Roots(landing=str(tmp_path / "landing"), lake=str(tmp_path / "lake"),
                  checkpoints=str(tmp_path / "checkpoints"))
    first, columns = build_routed_frame(spark, stream, roots)
    called: list[str] = []
    find = builtin._get_jvm_function

    def counted(name: str, sc: Any) -> Any:
        called.append(name)
        return find(name, sc)

    monkeypatch.setattr(builtin, "_get_jvm_function", counted)
    # Py4J's reflection command, its member lookup, the class, then the member's name.
    lookups = py4j_commands(monkeypatch, "r\nm\norg.apache.spark.sql.functions\n")
    again, columns_again = build_routed_frame(spark, stream, roots)
    assert len(called) > 100 and len(lookups) < len(called) / 10, (len(called), lookups)
    assert (again.schema, columns_again) == (first.schema, columns)
