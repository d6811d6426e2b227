"""The driver JVM's options for a run (sluice.operations.jvm): which archive, when it is passed, the light JIT of a
small run, and what the operator puts on spark-submit's command line. No JVM starts here; tests/spark/test_jvm.py
records and maps a real archive."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.catalog import load_catalog
from sluice.constants import DeltaEngine
from sluice.operations import jvm
from tests.helpers import events_stream, roots_in, write_catalog
from tests.unit.test_kafka_secrets import FakeSparkSubmit, FakeTaskInstance, kafka_catalog, make_operator


@pytest.fixture
def fake_spark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A Spark home with two jars, a java binary, and a cache folder: what the archive's name depends on. The files
    the tests make are private to the user whatever the machine's umask (a test says where it matters)."""
    previous = os.umask(0o022)
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    for name in ("spark-core.jar", "spark-sql.jar"):
        (home / "jars" / name).write_bytes(b"jar")
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    monkeypatch.setenv("SPARK_HOME", str(home))
    monkeypatch.setenv("JAVA_HOME", str(java.parent.parent))
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(jvm.ARCHIVE_SWITCH, raising=False)
    for name in jvm._CLASSPATH_ENV:
        monkeypatch.delenv(name, raising=False)
    yield home
    os.umask(previous)


def install(archive: Path, size: int | None = None) -> None:
    """An archive as build_archive leaves it: the file, and its size recorded beside it."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(b"x" * 64)
    archive.with_suffix(".json").write_text(json.dumps({"size": 64 if size is None else size}), encoding="utf-8")


def test_the_archive_is_named_by_the_jvm_the_jars_and_the_classpath_environment(
        fake_spark: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = jvm.archive_path()
    assert first is not None and first.parent == Path(os.environ["SLUICE_CACHE_DIR"])
    assert jvm.archive_path() == first
    (fake_spark / "jars" / "spark-sql.jar").write_bytes(b"a longer jar")
    second = jvm.archive_path()
    assert second != first, "reinstalled jars need another archive"
    monkeypatch.setenv("SPARK_CONF_DIR", "/etc/spark")
    assert jvm.archive_path() not in (first, second), "a conf folder on the classpath changes it too"
    monkeypatch.setenv(jvm.ARCHIVE_SWITCH, "off")
    assert jvm.archive_path() is None


def test_only_a_whole_installed_archive_is_passed(fake_spark: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = jvm.archive_path()
    assert archive is not None
    assert jvm.usable_archive() is None and jvm.driver_java_options(small=False) == [jvm.COMPILE_HUGE_METHODS]
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"x" * 64)
    assert jvm.usable_archive() is None, "no record: not installed by build_archive (a partial copy)"
    install(archive, size=128)
    assert jvm.usable_archive() is None, "truncated since it was recorded: a JVM would crash on it"
    install(archive)
    assert jvm.usable_archive() == archive
    assert jvm.driver_java_options(small=False) == [f"-XX:SharedArchiveFile={archive}", jvm.COMPILE_HUGE_METHODS]
    assert jvm.driver_java_options(small=True) == [f"-XX:SharedArchiveFile={archive}", jvm.COMPILE_HUGE_METHODS,
                                                  jvm.LIGHT_JIT]
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(archive.parent.parent / "a cache"))
    install(jvm.archive_path())  # type: ignore[arg-type]
    assert jvm.usable_archive() is None, "Spark splits the options on spaces: such a path is not passed"


def test_the_options_go_before_what_spark_submit_opts_holds_already() -> None:
    assert jvm.submit_env([], {jvm.SUBMIT_OPTS: "-Dmine=1"}) == {}
    assert jvm.submit_env(["-Xa"], {}) == {jvm.SUBMIT_OPTS: "-Xa"}
    assert jvm.submit_env(["-Xa", "-Xb"], {jvm.SUBMIT_OPTS: " -Dmine=1 "}) == {jvm.SUBMIT_OPTS: "-Xa -Xb -Dmine=1"}


def test_no_archive_where_the_jvm_refuses_a_folder_on_the_classpath(fake_spark: Path) -> None:
    archive = jvm.archive_path()
    assert archive is not None
    install(archive)
    (fake_spark / "conf").mkdir()
    assert jvm.usable_archive() == archive, "an empty conf folder is fine"
    (fake_spark / "conf" / "spark-defaults.conf").write_text("spark.ui.killEnabled false\n")
    assert jvm.usable_archive() is None
    with pytest.raises(RuntimeError, match=f"{fake_spark / 'conf'} is a folder on the Spark driver's classpath"):
        jvm.build_archive(lambda options, timeout: pytest.fail("no training run"))


def fake_spark_submit(folder: Path, exit_code: int) -> str:
    script = folder / f"spark-submit-{exit_code}"
    script.write_text(f"#!/bin/sh\necho checked \"$SPARK_SUBMIT_OPTS\"\nexit {exit_code}\n")
    script.chmod(0o755)
    return str(script)


def test_an_archive_is_installed_whole_and_replaces_the_old_one_of_its_spark(
        fake_spark: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jvm, "spark_submit", lambda: fake_spark_submit(tmp_path, 0))
    old = jvm.archive_path()
    assert old is not None
    install(old)
    json_record = json.loads(old.with_suffix(".json").read_text())
    old.with_suffix(".json").write_text(json.dumps({**json_record, "spark_home": str(jvm.spark_home())}))
    other = old.with_name("spark-driver-other.jsa")  # another venv's Spark: kept
    install(other)
    (tmp_path / "other-spark").mkdir()
    other.with_suffix(".json").write_text(json.dumps({"size": 64, "spark_home": str(tmp_path / "other-spark")}))
    gone = old.with_name("spark-driver-gone.jsa")  # a removed venv's: deleted
    install(gone)
    gone.with_suffix(".json").write_text(json.dumps({"size": 64, "spark_home": str(tmp_path / "removed-venv")}))
    (fake_spark / "jars" / "spark-sql.jar").write_bytes(b"upgraded")
    trained: list[tuple[list[str], float]] = []

    def train(options: list[str], timeout: float) -> str:
        trained.append((options, timeout))
        Path(options[0].removeprefix("-XX:ArchiveClassesAtExit=")).write_bytes(b"classes" * 100)
        return ""

    archive = jvm.build_archive(train)
    assert archive == jvm.archive_path() != old
    assert jvm.usable_archive() == archive and archive.read_bytes() == b"classes" * 100
    assert not old.exists() and not old.with_suffix(".json").exists(), "the replaced archive of this Spark is gone"
    assert other.exists() and not gone.exists() and not gone.with_suffix(".json").exists()
    assert sorted(path.name for path in archive.parent.iterdir() if path.name.startswith(".")) == []
    assert jvm.build_archive(train) == archive and len(trained) == 1, "a usable archive is not recorded again"
    jvm.build_archive(train, force=True)
    assert len(trained) == 2


def test_an_archive_the_check_refuses_is_not_installed(fake_spark: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jvm, "spark_submit", lambda: fake_spark_submit(tmp_path, 1))

    def train(options: list[str], timeout: float) -> str:
        Path(options[0].removeprefix("-XX:ArchiveClassesAtExit=")).write_bytes(b"torn")
        return ""

    with pytest.raises(RuntimeError, match="a JVM cannot map the new archive: checked -Xshare:on"):
        jvm.build_archive(train)
    archive = jvm.archive_path()
    assert archive is not None and list(archive.parent.iterdir()) == []
    with pytest.raises(RuntimeError, match="wrote no archive; its JVM said:\nError: non-empty directory"):
        jvm.build_archive(lambda options, timeout: "Error: non-empty directory '/opt/spark/conf/'")
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "a cache"))
    with pytest.raises(RuntimeError, match="has a space or a quote"):
        jvm.build_archive(lambda options, timeout: pytest.fail("no training run"))


def test_an_archive_others_could_swap_is_not_used(fake_spark: Path, tmp_path: Path) -> None:
    archive = jvm.archive_path()
    assert archive is not None
    install(archive)
    record = archive.with_suffix(".json")
    assert jvm.usable_archive() == archive and jvm.archive_refusal() is None
    archive.parent.chmod(0o777)
    assert jvm.usable_archive() is None
    assert jvm.archive_refusal() == f"{archive.parent} has mode 777: others can write to it"
    archive.parent.chmod(0o755)
    record.chmod(0o664)
    assert jvm.archive_refusal() == f"{record} has mode 664: others can write to it", "the record says the size"
    record.chmod(0o644)
    archive.chmod(0o666)
    assert jvm.usable_archive() is None
    archive.chmod(0o444)
    planted = tmp_path / "planted.jsa"
    planted.write_bytes(archive.read_bytes())
    archive.unlink()
    archive.symlink_to(planted)
    assert jvm.archive_refusal() == f"{archive} is a link"


def test_a_build_under_a_loose_umask_gives_an_archive_runs_use(fake_spark: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jvm, "spark_submit", lambda: fake_spark_submit(tmp_path, 0))
    archive = jvm.archive_path()
    assert archive is not None
    archive.parent.mkdir(mode=0o775)
    archive.parent.chmod(0o775)  # this user's own cache folder, made by an older build under umask 002

    def train(options: list[str], timeout: float) -> str:
        Path(options[0].removeprefix("-XX:ArchiveClassesAtExit=")).write_bytes(b"classes")
        return ""

    previous = os.umask(0o002)
    try:
        assert jvm.build_archive(train) == archive
    finally:
        os.umask(previous)
    assert jvm.usable_archive() == archive
    assert stat.S_IMODE(archive.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(archive.with_suffix(".json").stat().st_mode) == 0o644


def test_a_small_run_is_measured_by_the_lag_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.kinds.files import FilesKind
    from sluice.kinds.kafka import KafkaSourceKind
    from sluice.lag.observe import unread_bytes

    monkeypatch.delenv("SLUICE_JIT_SMALL_RUN_MAX_BYTES", raising=False)
    parquet = events_stream("parquet", source={**events_stream()["source"], "format": "parquet", "path": "pq"})
    automatic = events_stream("automatic", sink={"path": "bronze/automatic", "engine": "auto"})
    adding = events_stream("adding", source={**events_stream()["source"], "schema_evolution": "add_new_columns"})
    merged = events_stream("merged", sink={"path": "bronze/merged", "engine": "rs", "mode": "merge",
                                           "keys": ["event_id"], "sequence_by": "event_time"})
    notified = events_stream("notified", source={**events_stream()["source"], "path": "s3a://landing/events",
                                                 "notifications": {"queue": "landing-events"}})
    catalog = load_catalog(write_catalog(tmp_path, events_stream("events"), events_stream("other", checkpoint="o"),
                                         parquet, merged, adding, automatic, notified))
    roots = roots_in(tmp_path)
    landing = tmp_path / "landing" / "events"
    landing.mkdir(parents=True)
    (landing / "a.json").write_bytes(b"{}\n" * 1000)  # 3,000 bytes unread
    events = catalog.select(["events"])
    monkeypatch.setenv("SLUICE_JIT_SMALL_RUN_MAX_BYTES", "3000")
    assert jvm.small_run(events, roots)
    assert not jvm.small_run(catalog.select(["events", "other"]), roots), "6,000 bytes in all: over the limit"
    (landing / "b.json").write_bytes(b"{}\n")
    assert not jvm.small_run(events, roots), "one byte over the limit"
    monkeypatch.setenv("SLUICE_JIT_SMALL_RUN_MAX_BYTES", "0")
    assert not jvm.small_run(events, roots), "0 turns the light JIT off"
    monkeypatch.setenv("SLUICE_JIT_SMALL_RUN_MAX_BYTES", "lots")
    assert not jvm.small_run(events, roots)
    monkeypatch.delenv("SLUICE_JIT_SMALL_RUN_MAX_BYTES")
    assert jvm.small_run(catalog.select(["events", "other"]), roots), "far under the default limit"
    assert not jvm.small_run(catalog.select(["parquet"]), roots), "compressed bytes do not measure the work"
    assert not jvm.small_run(catalog.select(["merged"]), roots), "a merge reads its table"
    assert not jvm.small_run(catalog.select(["adding"]), roots), "add_new_columns types new columns with Spark jobs"
    assert not jvm.small_run(events, roots, engine=DeltaEngine.JVM), "the JVM's Delta writer was never measured"
    with monkeypatch.context() as patched:
        patched.setattr(FilesKind, "backlog", lambda *args: pytest.fail("the landing folder was listed"))
        assert not jvm.small_run(catalog.select(["notified"]), roots), "notifications spare the folder's listing"
    automatic = catalog.select(["automatic"])
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    monkeypatch.setenv("SLUICE_JARS_DIR", str(tmp_path / "resolved"))  # nothing resolved with Maven yet
    (tmp_path / "spark" / "jars").mkdir(parents=True)
    assert jvm.small_run(automatic, roots), "auto is rs without delta-spark's jars"
    assert not jvm.small_run(automatic, roots, own_jars=True), "auto may find delta-spark in the task's own jars"
    assert jvm.small_run(automatic, roots, engine=DeltaEngine.RS, own_jars=True)
    (tmp_path / "resolved" / "spark").mkdir(parents=True)
    (tmp_path / "resolved" / "spark" / "delta-spark_2.13-4.4.0.jar").write_bytes(b"jar")
    assert not jvm.small_run(automatic, roots), "auto is the JVM's writer where `make venv` resolved delta-spark"
    (tmp_path / "resolved" / "spark" / "delta-spark_2.13-4.4.0.jar").unlink()
    (tmp_path / "spark" / "jars" / "delta-spark_2.13-4.4.1.jar").write_bytes(b"jar")
    assert not jvm.small_run(automatic, roots), "auto is the JVM's writer where delta-spark's jars are"
    assert jvm.small_run(automatic, roots, engine=DeltaEngine.RS)
    (tmp_path / "kafka").mkdir()
    [clicks] = load_catalog(kafka_catalog(tmp_path / "kafka")).select(["clicks"])
    monkeypatch.setattr(KafkaSourceKind, "backlog", lambda *args: pytest.fail("the broker was asked"))
    assert unread_bytes(clicks, roots) is None, "a Kafka topic cannot tell its bytes"
    assert not jvm.small_run([clicks], roots, engine=DeltaEngine.RS)


def test_the_operator_starts_a_small_runs_driver_with_the_archive_and_the_light_jit(
        tmp_path: Path, fake_spark: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow.providers.apache.spark.hooks.spark_submit as provider

    monkeypatch.setattr(provider, "subprocess", types.SimpleNamespace(**{**vars(subprocess), "Popen": FakeSparkSubmit}))
    monkeypatch.delenv("SLUICE_JIT_SMALL_RUN_MAX_BYTES", raising=False)
    monkeypatch.setenv(jvm.SUBMIT_OPTS, "-Dmine=1")
    archive = jvm.archive_path()
    assert archive is not None
    install(archive)
    catalog = write_catalog(tmp_path, events_stream("clicks"))
    roots = roots_in(tmp_path)
    (tmp_path / "landing" / "events").mkdir(parents=True)
    (tmp_path / "landing" / "events" / "a.json").write_bytes(b"{}\n" * 10)
    user = {"spark.driver.extraJavaOptions": "-Dtheirs=1"}

    def launched(**kwargs: object) -> tuple[list[str], str]:
        FakeSparkSubmit.calls = []
        operator = make_operator(catalog, ["clicks"], landing_root=roots.landing, lake_root=roots.lake,
                                 checkpoint_root=roots.checkpoints, **kwargs)
        operator.execute({"run_id": "manual__1", "ti": FakeTaskInstance()})
        [(arguments, env)] = FakeSparkSubmit.calls
        return arguments, env[jvm.SUBMIT_OPTS]

    arguments, options = launched(conf=user)
    logs = jvm.log_options()[0]  # Spark's own log at WARN
    assert options == f"-XX:SharedArchiveFile={archive} {jvm.COMPILE_HUGE_METHODS} {jvm.LIGHT_JIT} {logs} -Dmine=1"
    at = arguments.index("spark.driver.extraJavaOptions=-Dtheirs=1")
    assert arguments[at - 1] == "--conf", "the task's own options go to spark-submit as they were"
    assert user == {"spark.driver.extraJavaOptions": "-Dtheirs=1"}
    monkeypatch.setenv("SLUICE_JIT_SMALL_RUN_MAX_BYTES", "10")
    arguments, options = launched()
    assert options == f"-XX:SharedArchiveFile={archive} {jvm.COMPILE_HUGE_METHODS} {logs} -Dmine=1", \
        "a large run keeps the full JIT"
    assert not any("extraJavaOptions" in argument for argument in arguments)


def test_a_refused_archive_is_named_in_the_log(fake_spark: Path, caplog: pytest.LogCaptureFixture) -> None:
    archive = jvm.archive_path()
    assert archive is not None
    with caplog.at_level(logging.INFO, logger=jvm.log.name):
        assert jvm.driver_java_options(small=False) == [jvm.COMPILE_HUGE_METHODS]
    [note] = caplog.records
    assert note.levelno == logging.INFO and "there is none at" in note.getMessage(), "none recorded: a note"
    install(archive)
    archive.with_suffix(".json").chmod(0o666)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=jvm.log.name):
        assert jvm.driver_java_options(small=True) == [jvm.COMPILE_HUGE_METHODS, jvm.LIGHT_JIT]
    [warning] = caplog.records
    assert warning.levelno == logging.WARNING and "has mode 666: others can write to it" in warning.getMessage()


def test_sparks_log_level_is_one_setting(caplog: pytest.LogCaptureFixture) -> None:
    assert jvm.log_options({}) == [f"-Dlog4j2.configurationFile=file:{jvm.LOG_CONFIG}"]
    config = jvm.LOG_CONFIG.read_text(encoding="utf-8")
    assert "rootLogger.level = ${env:SLUICE_SPARK_LOG_LEVEL:-WARN}" in config, "the driver reads the level itself"
    assert "logger.column.name = org.apache.spark.sql.Column" in config
    with caplog.at_level(logging.WARNING, logger=jvm.log.name):
        assert jvm.log_options({jvm.LOG_LEVEL_ENV: "loud"}) == jvm.log_options({})
    assert "SLUICE_SPARK_LOG_LEVEL must be one of" in caplog.text and "'LOUD'" in caplog.text


def test_auto_is_rs_for_a_stream_that_appends_text_files_on_arrival(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Where delta-spark's jars load, ``auto`` keeps the JVM's writer, except for a stream on arrival of the
    small-run shape: its runs take rs and so the small-run paths (the light JIT here; the driver's write in the
    driver). A merge on arrival, and a text append on a cron, stay on the JVM's writer."""
    from sluice.lag.observe import auto_takes_rs

    arrival = {"poll": "1s", "settle": "1s"}
    auto = {"engine": "auto"}
    catalog = load_catalog(write_catalog(
        tmp_path,
        events_stream("arriving", sink={"path": "bronze/arriving", **auto}, arrival=arrival),
        events_stream("scheduled", sink={"path": "bronze/scheduled", **auto}),
        events_stream("merging", sink={"path": "bronze/merging", **auto, "mode": "merge", "keys": ["event_id"],
                                       "sequence_by": "event_time"}, arrival=arrival),
        events_stream("parquet", source={**events_stream()["source"], "format": "parquet", "path": "pq"},
                      sink={"path": "bronze/parquet", **auto}, arrival=arrival)))
    assert [auto_takes_rs(catalog.get(name)) for name in ("arriving", "scheduled", "merging", "parquet")] == \
        [True, False, False, False]
    roots = roots_in(tmp_path)
    monkeypatch.delenv("SLUICE_JIT_SMALL_RUN_MAX_BYTES", raising=False)
    monkeypatch.setenv("SLUICE_JARS_DIR", str(tmp_path / "resolved"))
    (tmp_path / "resolved" / "spark").mkdir(parents=True)
    (tmp_path / "resolved" / "spark" / "delta-spark_2.13-4.4.0.jar").write_bytes(b"jar")
    assert jvm.small_run(catalog.select(["arriving"]), roots), "auto is rs for it, where delta-spark's jars are"
    assert not jvm.small_run(catalog.select(["scheduled"]), roots), "auto is the JVM's writer on a cron"
    assert not jvm.small_run(catalog.select(["arriving"]), roots, engine=DeltaEngine.JVM), "a run's override wins"
