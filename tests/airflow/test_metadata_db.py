"""Airflow runs on the metadata database its tier names: SQLite by default, PostgreSQL under tests/postgres.sh."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.airflow


def test_airflow_uses_the_metadata_database_the_tier_names(airflow_db: Path) -> None:
    from airflow import settings
    from sqlalchemy import inspect
    from sqlalchemy.engine import make_url

    named = os.environ.get("SLUICE_TEST_AIRFLOW_DB")
    if named:
        url = make_url(named)
        assert settings.engine.dialect.name == url.get_backend_name(), "SLUICE_TEST_AIRFLOW_DB was not used"
        assert (settings.engine.url.host, settings.engine.url.port, settings.engine.url.database) == (
            url.host, url.port, url.database)
    else:
        assert settings.engine.dialect.name == "sqlite"
    assert settings.async_engine is not None
    assert settings.async_engine.dialect.name == settings.engine.dialect.name
    assert inspect(settings.engine).has_table("dag_run"), "airflow db migrate ran against this database"
