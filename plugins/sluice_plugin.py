"""Sluice's Airflow plugin: the Streams page (``/sluice/streams``) in the UI's navigation, and its JSON routes; and
the backfill's trigger check, which refuses bad backfill params when the run is triggered."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from sluice_airflow.streams_page import app
from sluice_airflow.trigger_check import BackfillTriggerCheck


class SluicePlugin(AirflowPlugin):
    name = "sluice"
    fastapi_apps = [{"app": app, "url_prefix": "/sluice", "name": "Sluice streams"}]
    fastapi_root_middlewares = [{"middleware": BackfillTriggerCheck, "name": "Sluice backfill trigger check"}]
    # Embedded in the UI at /plugin/streams, in the navigation's top level.
    external_views = [{"name": "Streams", "href": "/sluice/streams", "destination": "nav", "url_route": "streams",
                       "nav_top_level": True}]
