"""The Streams page over hostile data, through Airflow's API server with Sluice's plugin: bad rows of the lag history
are skipped (every stream still shows, no HTTP 500), and markup in any field the routes return never reaches the
page's HTML as markup. The page's own script renders the routes' JSON under Node (``page_sinks.js``), with a stand-in
for the three DOM calls it makes; what it writes to ``innerHTML`` is parsed as a browser would."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.test_streams_page import build_world, token
from tests.unit.test_hostile_reads import MARKUP, plant_rows

pytestmark = pytest.mark.airflow
NODE = shutil.which("node")
SINKS = Path(__file__).with_name("page_sinks.js")
# The elements the page builds itself; anything else in its HTML came from data.
PAGE_TAGS = {"table", "thead", "tbody", "tr", "th", "td", "a", "div", "span", "br", "svg", "polyline", "circle",
             "title", "line", "text", "tspan", "h2", "p", "b", "pre"}
LOCAL_HREF = re.compile(r"/(?![/\\])|#")
PAYLOADS = (MARKUP, "<script>alert(1)</script>", "javascript:alert(1)", "' onmouseover='alert(1)",
            "</title><img src=x onerror=alert(1)>")


@pytest.fixture
def client(spark: Any, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    world = build_world(spark, tmp_path, monkeypatch)
    catalog, roots = world["catalog"], world["roots"]
    plant_rows(roots, catalog, at=time.time())
    # A landing-zone file whose name is markup: its path reaches the checkpoint findings the page lists.
    Path(roots.landing, "events", MARKUP.replace("/", "") + ".json").symlink_to("/etc/hostname")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    with TestClient(create_app()) as test_client:
        yield test_client


class Elements(HTMLParser):
    """The tags and attribute names of an HTML fragment, as a browser's parser reads them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attributes += [(name, value or "") for name, value in attrs]


def rendered(page: str, responses: dict[str, Any], hash_: str) -> list[tuple[str, str]]:
    """What the page's script writes into the DOM over ``responses``."""
    script = re.search(r"<script>(.*)</script>", page, re.S)
    assert script is not None
    done = subprocess.run([NODE or "node", str(SINKS)], input=json.dumps([script.group(1), responses, hash_]),
                          capture_output=True, text=True, timeout=60, check=True)
    return [tuple(sink) for sink in json.loads(done.stdout)]


def hostile(value: Any, payloads: Iterator[str]) -> Any:
    """``value`` with every leaf, numbers and nulls too, replaced by the next payload."""
    if isinstance(value, dict):
        return {key: hostile(item, payloads) for key, item in value.items()}
    if isinstance(value, list):
        return [hostile(item, payloads) for item in value]
    return next(payloads)


def cycle(items: tuple[str, ...]) -> Iterator[str]:
    while True:
        yield from items


def assert_no_markup_from_data(sinks: list[tuple[str, str]]) -> None:
    html = [text for kind, text in sinks if kind == "html"]
    assert html and not [text for kind, text in sinks if kind == "text"], sinks  # rendered, no error shown
    for fragment in html:
        elements = Elements()
        elements.feed(fragment)
        assert set(elements.tags) <= PAGE_TAGS, set(elements.tags) - PAGE_TAGS
        assert not [name for name, _ in elements.attributes if name.startswith("on")]
        # Links go to a path of this server or to a stream of the page, never javascript: or another site.
        assert not [value for name, value in elements.attributes if name == "href" and not LOCAL_HREF.match(value)]


def test_bad_lag_rows_are_skipped_and_every_stream_still_shows(client: Any) -> None:
    headers = token(client)
    listed = client.get("/sluice/api/streams", headers=headers)
    assert listed.status_code == 200, listed.text
    assert [(entry["stream"], type(entry["last_batch_id"])) for entry in listed.json()["streams"]] == [
        ("clicks", int), ("orders", type(None))]
    detail = client.get("/sluice/api/streams/clicks", headers=headers)
    assert detail.status_code == 200, detail.text
    assert all(isinstance(point["files"], int) for point in detail.json()["backlog"])


@pytest.mark.skipif(NODE is None, reason="needs Node to run the page's script (Debian's nodejs)")
def test_markup_in_any_field_never_reaches_the_page_as_markup(client: Any) -> None:
    from sluice.catalog import load_catalog
    from sluice.paths import Roots
    from sluice.storage import runlog
    from sluice.storage.lock import StreamLock

    headers = token(client)
    page = client.get("/sluice/streams").text
    # The maintenance ran and a run holds the stream's lock, so that the page's other operations and its RUNNING
    # line are fed too.
    roots = Roots.from_env()
    runlog.log_operation(roots.lake, stream="clicks", run_id="delta_maintenance/scheduled__1/maintain",
                         kind="maintenance", started=time.time() - 5, status="SUCCESS", error=None, note={})
    checkpoint = load_catalog().get("clicks").checkpoint_path(roots)
    with StreamLock(checkpoint, "clicks", "ingest_clicks/manual__9/run_stream"):
        real = {"/sluice/api/streams": client.get("/sluice/api/streams", headers=headers).json(),
                "/sluice/api/streams/clicks": client.get("/sluice/api/streams/clicks", headers=headers).json()}
    detail = real["/sluice/api/streams/clicks"]
    # Every list the page shows holds a row, so that each of its fields is fed too.
    assert all([detail["runs"], detail["backlog"], detail["dead_letters"]["reasons"], detail["dead_letters"]["samples"],
                detail["health"]["findings"], detail["versions"], real["/sluice/api/streams"]["streams"][0]["trend"],
                detail["operations"], detail["health"]["running"],
                real["/sluice/api/streams"]["streams"][0]["running"]])

    as_served = rendered(page, real, "#clicks")
    assert_no_markup_from_data(as_served)
    assert "&lt;img src=x onerror=alert(1)&gt;" in "".join(text for _, text in as_served)  # the planted name

    for payloads in [cycle(PAYLOADS[i:] + PAYLOADS[:i]) for i in range(len(PAYLOADS))]:
        fed = {url: hostile(body, payloads) for url, body in real.items()}
        fed["/sluice/api/streams/" + "%22%3E%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E"] = fed.pop(
            "/sluice/api/streams/clicks")
        sinks = rendered(page, fed, "#" + MARKUP)
        assert_no_markup_from_data(sinks)
        shown = "".join(text for _, text in sinks)
        assert "&lt;img src=x onerror=alert(1)&gt;" in shown and "&lt;script&gt;" in shown
