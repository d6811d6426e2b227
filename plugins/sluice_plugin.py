"""Sluice's Airflow plugin: the Streams page (``/sluice/streams``) in the UI's navigation, and its JSON routes."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from sluice_airflow.streams_page import app


class SluicePlugin(AirflowPlugin):
    name = "sluice"
    fastapi_apps = [{"app": app, "url_prefix": "/sluice", "name": "Sluice streams"}]
    # Embedded in the UI at /plugin/streams, in the navigation's top level.
    external_views = [{"name": "Streams", "href": "/sluice/streams", "destination": "nav", "url_route": "streams",
                       "nav_top_level": True}]
