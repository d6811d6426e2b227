"""The Streams page in a real browser: Airflow's API server with Sluice's plugin, Debian's Chromium driven by
Playwright for Python, over a lag history and a run log written by real runs.

Chromium comes from ``tests/chromium.sh`` (``make test`` runs it; it installs the Debian package as root). Without it
the test skips and says so. The screenshot stays under the test's temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import load_catalog
from sluice.paths import Roots
from sluice.storage.lock import StreamLock
from tests.airflow.test_backfill_trigger import serialize_dags
from tests.airflow.test_streams_page import build_world
from tests.helpers import free_port

pytestmark = pytest.mark.airflow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def http(url: str, body: dict[str, Any] | None = None, token: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, None
    except urllib.error.URLError:
        return 0, None  # not listening yet


@pytest.fixture
def api_server(spark: Any, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Airflow's API server (UI included) on a free port, with a password login, over the test's world and the
    DAGs of its catalog (written to the metadata database, as the DAG processor would)."""
    build_world(spark, tmp_path, monkeypatch)
    serialize_dags()
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
    from playwright.sync_api import expect, sync_playwright

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

        # orders is running: a real DAG run (queued: the DAG is paused) whose task holds the stream's lock.
        status, run = http(f"{base}/api/v2/dags/ingest_orders/dagRuns", {"logical_date": None}, login["access_token"])
        assert status == 200, run
        run_id = f"ingest_orders/{run['dag_run_id']}/run_stream"
        catalog, roots = load_catalog(), Roots.from_env()
        with StreamLock(catalog.get("orders").checkpoint_path(roots), "orders", run_id):
            # The page in the UI's navigation, embedded in Airflow's own shell.
            page.goto(f"{base}/plugin/streams")
            page.get_by_role("link", name="Streams").first.wait_for(timeout=60_000)
            frame = page.frame_locator("iframe")
            rows = frame.locator("#streams tbody tr")
            rows.first.wait_for(timeout=60_000)
            assert [rows.nth(i).get_attribute("data-stream") for i in range(rows.count())] == ["clicks", "orders"]
            assert frame.locator("tr[data-stream='clicks'] .badge").first.inner_text() == "WARN"
            orders = frame.locator("tr[data-stream='orders']")
            assert orders.locator(".badge.RUNNING").inner_text() == "RUNNING"
            assert orders.locator(".badge.FAIL").count() == 0
            assert run_id in orders.locator(".running").inner_text()

            frame.get_by_role("link", name="clicks").click()
            frame.locator("#backlog-chart").wait_for()
            assert frame.locator("#backlog-chart circle.point").count() == 5  # five observations in the lag history
            assert frame.locator("#runs-chart polyline.series[data-series='in']").get_attribute("data-points") == "2"
            page.screenshot(path=str(tmp_path / "streams-page.png"), full_page=True)

            # Every link lands, at the top level (not in the frame, whose address the UI would show under
            # /plugin/streams/), on a page of Airflow's UI that exists and shows what it is for.
            def lands(click: Callable[[Any], Any], path: str, visible: Callable[[], Any]) -> None:
                # The UI keeps the frame's own address after its route: this deep link opens the frame on clicks.
                page.goto(f"{base}/plugin/streams/sluice/streams#clicks")
                frame = page.frame_locator("iframe")
                frame.locator("#stream-title").wait_for(timeout=60_000)
                click(frame)
                page.wait_for_url(f"{base}{path}", timeout=30_000)
                visible().wait_for(timeout=60_000)

            trigger_button = lambda: page.get_by_test_id("trigger-dag-button").first  # noqa: E731
            lands(lambda frame: frame.locator("tr[data-stream='clicks'] a[data-link='run']").click(),
                  "/dags/ingest_clicks", trigger_button)
            assert page.get_by_text("ingest_clicks").first.is_visible()
            lands(lambda frame: frame.locator("#detail a[data-link='dag']").click(), "/dags/ingest_clicks",
                  trigger_button)
            lands(lambda frame: frame.locator("#detail a[data-link='run']").click(), "/dags/ingest_clicks",
                  trigger_button)
            lands(lambda frame: frame.locator("tr[data-stream='clicks'] a[data-link='backfill']").click(),
                  "/dags/backfill", trigger_button)
            lands(lambda frame: frame.locator("#detail a[data-link='backfill']").click(), "/dags/backfill",
                  trigger_button)
            page.screenshot(path=str(tmp_path / "backfill-dag.png"), full_page=True)

            # The backfill form marks the stream as required (a time range or a Delta source's version range
            # follows from the stream, so the trigger check asks for the one it lacks), and an end before its start
            # is refused in it at once, in one line: the trigger check answers the form's trigger.
            trigger_button().click()
            dialog = page.get_by_role("dialog")
            required = dialog.locator("label[data-required]")
            required.first.wait_for(timeout=30_000)
            assert "Stream" in {label.replace("*", "").strip() for label in required.all_inner_texts()}
            assert all(dialog.locator("label", has_text=label).count() for label in (
                "Start (inclusive)", "End (exclusive)"))

            def pick(label: str, date: str, time_of_day: str) -> None:
                field = dialog.locator("[data-part='root'][role='group']").filter(
                    has=page.locator("label", has_text=label))
                field.get_by_test_id("datetime-input").click()
                popover = page.locator("[data-scope='popover'][data-part='content'][data-state='open']")
                popover.locator("input").nth(0).fill(date)
                popover.locator("input").nth(1).fill(time_of_day)
                dialog.get_by_role("heading").click()  # closes the picker
                # Retried until the field shows it: the form renders the picked value after the click returns.
                expect(field.get_by_test_id("datetime-input")).to_contain_text(date.replace("/", "-")[:4],
                                                                              timeout=30_000)

            pick("Start (inclusive)", "2026/11/22", "12:00")
            pick("End (exclusive)", "2026/11/22", "10:00")
            page.screenshot(path=str(tmp_path / "backfill-form.png"), full_page=True)
            started = time.monotonic()
            dialog.get_by_role("button", name="Trigger").last.click()
            refusal = dialog.get_by_text("backfill refused, nothing was read or written: end: ")
            # At once: the trigger check answers the form's request (no run is made), within seconds on a loaded
            # machine.
            refusal.wait_for(timeout=30_000)
            assert time.monotonic() - started < 30
            assert "is not after start 2026-11-22T12:00:00+00:00" in refusal.inner_text()
            assert "Traceback" not in dialog.inner_text()
            page.screenshot(path=str(tmp_path / "backfill-refused.png"), full_page=True)
            task_page = f"/dags/ingest_orders/runs/{urllib.parse.quote(run['dag_run_id'], safe='')}/tasks/run_stream"
            lands(lambda frame: frame.locator("tr[data-stream='orders'] a[data-link='running']").click(),
                  task_page, lambda: page.get_by_text(run["dag_run_id"]).first)
            page.screenshot(path=str(tmp_path / "running-task.png"), full_page=True)
        browser.close()
    assert (tmp_path / "streams-page.png").stat().st_size > 10_000
