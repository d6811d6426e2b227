"""Spark's own log on a real driver: WARN by default through the log4j2 file Sluice ships (sluice.operations.jvm.
log_options), INFO again with SLUICE_SPARK_LOG_LEVEL=INFO, and never Column's "trivially true equals predicate"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.operations import jvm
from sluice.operations.loopback import driver_env

pytestmark = pytest.mark.spark

APP = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
frame = spark.range(3)
print("rows", frame.where(frame.id == frame.id).count())  # Column warns: a trivially true equals predicate
spark.stop()
"""


def launch(tmp_path: Path, level: str | None) -> tuple[str, str]:
    app = tmp_path / "app.py"
    app.write_text(APP, encoding="utf-8")
    env = {**os.environ, **driver_env("local[1]"), jvm.SUBMIT_OPTS: " ".join(jvm.log_options()),
           "PYSPARK_PYTHON": sys.executable}
    env.pop(jvm.LOG_LEVEL_ENV, None)
    if level is not None:
        env[jvm.LOG_LEVEL_ENV] = level
    done = subprocess.run([jvm.spark_submit(), "--master", "local[1]", str(app)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, done.stderr


def test_sparks_log_is_warn_by_default_and_info_with_one_setting(tmp_path: Path) -> None:
    out, err = launch(tmp_path, None)
    assert "rows 3" in out
    assert " INFO " not in err, err[:2000]
    assert "trivially true" not in out + err
    out, err = launch(tmp_path, "INFO")
    assert "rows 3" in out
    assert err.count(" INFO ") > 20, "SLUICE_SPARK_LOG_LEVEL=INFO brings Spark's INFO lines back"
    assert "trivially true" not in out + err, "Column's warning stays silenced"
