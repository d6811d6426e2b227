"""The driver's class-data-sharing archive on a real JVM (sluice.operations.jvm): a recorded archive maps into
spark-submit's driver with Spark's classes in it, and a torn one (which crashes the JVM that maps it) is never
installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sluice.cli.jvm import train
from sluice.operations import jvm

pytestmark = pytest.mark.skipif(jvm.archive_path() is None or jvm.sharing_refusal() is not None,
                                reason=f"no driver archive here: {jvm.sharing_refusal() or 'turned off, or no java'}")


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive `make venv` recorded; recorded into a temporary cache (a real training run) when there is none."""
    found = jvm.usable_archive()
    if found is not None:
        return found
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLUICE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        return jvm.build_archive(train)


def test_the_recorded_archive_maps_into_sparks_driver_with_sparks_classes(archive: Path) -> None:
    shown = subprocess.run([jvm.spark_submit(), "--version"], capture_output=True, text=True, env={
        **os.environ, jvm.SUBMIT_OPTS: f"-Xshare:on -XX:SharedArchiveFile={archive} -Xlog:class+load=info"})
    output = shown.stdout + shown.stderr
    assert shown.returncode == 0, output[-3000:]  # -Xshare:on: a JVM that cannot map it refuses to start
    assert "org.apache.spark.deploy.SparkSubmit source: shared objects file (top)" in output


def test_a_torn_archive_is_never_installed(archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "cache"))
    whole = archive.read_bytes()

    def torn(options: list[str], timeout: float) -> str:  # a training run whose JVM died while writing
        Path(options[0].removeprefix("-XX:ArchiveClassesAtExit=")).write_bytes(whole[:len(whole) // 2])
        return ""

    with pytest.raises(RuntimeError, match="a JVM cannot map the new archive") as refused:
        jvm.build_archive(torn)
    reason = str(refused.value)
    assert "SIGBUS" in reason or "shared archive" in reason, reason  # the JVM's own words: it crashed, or refused
    assert list((tmp_path / "cache").iterdir()) == [], "neither the file nor a record is left"
    assert jvm.driver_java_options(small=False) == [jvm.COMPILE_HUGE_METHODS]
