"""The Streams page of the Airflow UI and its JSON routes, mounted under ``/sluice`` by :mod:`sluice_plugin`.

- ``GET /sluice/api/streams``: every catalog stream the caller may see
  (:func:`sluice.operations.streams_view.overview`);
- ``GET /sluice/api/streams/{name}?days=30``: one stream's history
  (:func:`sluice.operations.streams_view.detail`);
- ``GET /sluice/streams``: the page, which reads the two routes; the UI's navigation embeds it.

The UI embeds the page in a sandboxed frame that may not navigate the UI; the page's links (a stream's DAG, its
trigger, the backfill form, the run that holds its lock) move the UI's own router instead (see the page's script), to
pages that Airflow 3.3's UI has (:func:`sluice.operations.streams_view.dag_links`).

The routes take Airflow's own login (the UI's session cookie, or a bearer token from ``POST /auth/token``): no
token, no data. A stream is visible to whoever may read its DAG (``ingest_<stream>``). Nothing here starts Spark.
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import get_user
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse

from sluice.catalog import cached_catalog
from sluice.model.stream import StreamSpec
from sluice.operations import streams_view
from sluice.paths import Roots

app = FastAPI(title="Sluice streams", description=__doc__)
# The caller, from the UI's session cookie or a bearer token; 401 without either.
User = Annotated[Any, Depends(get_user)]


def _visible(user: Any, streams: list[StreamSpec]) -> list[str]:
    """The streams whose DAG (their own, or their group's) ``user`` may read."""
    dag_ids = {stream.dag_id for stream in streams}
    allowed = get_auth_manager().filter_authorized_dag_ids(dag_ids=dag_ids, user=user, method="GET")
    return [stream.name for stream in streams if stream.dag_id in allowed]


@app.get("/api/streams")
def list_streams(user: User) -> dict[str, Any]:
    catalog = cached_catalog()
    visible = _visible(user, list(catalog))
    return {"streams": streams_view.overview(catalog, Roots.from_env(), visible)}


@app.get("/api/streams/{name}")
def stream_history(name: str, user: User, days: Annotated[float, Query(gt=0, le=366)] = 30) -> dict[str, Any]:
    catalog = cached_catalog()
    if name not in catalog.streams or not _visible(user, [catalog.streams[name]]):
        raise HTTPException(status_code=404, detail=f"no stream {name!r} that you may see")
    return streams_view.detail(catalog.get(name), Roots.from_env(), days=days)


@app.get("/streams", response_class=HTMLResponse)
def page() -> str:
    return resources.files("sluice_airflow").joinpath("streams_page.html").read_text(encoding="utf-8")
