"""The Streams page in a real browser: Airflow's API server with Sluice's plugin, Debian's Chromium driven by
Playwright for Python, over a lag history and a run log written by real runs.

Chromium comes from ``tests/chromium.sh`` (``make test`` runs it; it installs the Debian package as root). Without it
the test skips and says so. The screenshot stays under the test's temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.test_streams_page import build_world

pytestmark = pytest.mark.airflow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def http(url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, None
    except urllib.error.URLError:
        return 0, None  # not listening yet


@pytest.fixture
def api_server(spark: Any, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Airflow's API server (UI included) on a free port, with a password login, over the test's world."""
    build_world(spark, tmp_path, monkeypatch)
    port = free_port()
    env = {**os.environ, "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
           "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}"}
    log = (tmp_path / "api-server.log").open("w")
    server = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "api-server", "--host", "127.0.0.1",
                               "--port", str(port), "--workers", "1"], env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while http(f"{base}/api/v2/monitor/health")[0] != 200:
            if server.poll() is not None or time.monotonic() > deadline:
                output = (tmp_path / "api-server.log").read_text()
                raise AssertionError(f"the API server did not come up:\n{output[-3000:]}")
            time.sleep(0.5)
        yield base
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
        log.close()


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium: tests/chromium.sh installs Debian's package as root")
def test_the_streams_page_in_chromium(api_server: str, tmp_path: Path) -> None:
    from airflow.configuration import AIRFLOW_HOME
    from playwright.sync_api import sync_playwright

    base = api_server
    password = json.loads((Path(AIRFLOW_HOME) / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()

        # No login, no data: the route answers 401 and the page says it cannot read the streams.
        assert page.goto(f"{base}/sluice/api/streams").status == 401
        page.goto(f"{base}/sluice/streams")
        page.wait_for_selector("#error:has-text('Cannot read the streams')")
        assert page.locator("#streams").count() == 0

        # Log in as the UI does: a token from the login, kept in the session cookie.
        status, login = http(f"{base}/auth/token", {"username": "admin", "password": password})
        assert status == 201
        context.add_cookies([{"name": "_token", "value": login["access_token"], "url": base}])

        # The page in the UI's navigation, embedded in Airflow's own shell.
        page.goto(f"{base}/plugin/streams")
        page.get_by_role("link", name="Streams").first.wait_for(timeout=60_000)
        frame = page.frame_locator("iframe")
        rows = frame.locator("#streams tbody tr")
        rows.first.wait_for(timeout=60_000)
        assert [rows.nth(i).get_attribute("data-stream") for i in range(rows.count())] == ["clicks", "orders"]
        assert frame.locator("tr[data-stream='clicks'] .badge").first.inner_text() == "WARN"

        frame.get_by_role("link", name="clicks").click()
        frame.locator("#backlog-chart").wait_for()
        assert frame.locator("#backlog-chart circle.point").count() == 5  # five observations in the lag history
        assert frame.locator("#runs-chart polyline.series[data-series='in']").get_attribute("data-points") == "2"
        page.screenshot(path=str(tmp_path / "streams-page.png"), full_page=True)
        browser.close()
    assert (tmp_path / "streams-page.png").stat().st_size > 10_000
