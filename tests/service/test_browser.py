"""The web console and the API pages in a real browser: Debian's chromium driven by Playwright.

One ``mbn serve`` process with an API key and a model whose bundle holds a map; one browser.
Every page is checked for console errors and saved as a screenshot (to a temporary directory,
or to ``MBN_SCREENSHOTS``: ``MBN_SCREENSHOTS=docs/screenshots`` refreshes the README's).
Needs chromium (``apt-get install chromium``, which scripts/test does) and the ``playwright``
package (the dev extra); Playwright's own browser downloads are never used.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from servicetest import FAST_JOBS_ENV, REPO, TINY_PARAMS, Server, serving, wait_for

from mbn_core.pipeline.training import train_bundle

# Slow: a Chromium driving the console against a served model.
pytestmark = pytest.mark.slow

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (dev extra)")

KEY = "console-test-key-0123456789"
CHROMIUM = os.environ.get("MBN_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
MAP_ROWS = 600  # training rows of the served model; all of them on its map
VIEWPORT = {"width": 1280, "height": 860}
PLACED_RGB = (255, 0, 255)  # console.js PLACED_COLOR


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("MBN_SCREENSHOTS")
    directory = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    if not directory.is_absolute():
        directory = REPO / directory
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, digits) -> Iterator[Server]:
    x, y = digits
    data_dir = tmp_path_factory.mktemp("console-data")
    (data_dir / "models").mkdir()
    params = {**TINY_PARAMS, "map_points": MAP_ROWS, "max_epochs": 20}
    train_bundle(
        x[:MAP_ROWS], data_dir / "models" / "m-digits", name="digits", params=params, y=y[:MAP_ROWS]
    )
    env = {
        **FAST_JOBS_ENV,
        "MBN_DATA_DIR": str(data_dir),
        "MBN_API_KEYS": KEY,
        "MBN_DEMO_MODEL": "false",
    }
    with serving(env, data_dir / "server.log", ready=False, wait=180) as server:
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"no chromium at {CHROMIUM}: apt-get install chromium (scripts/test does), or set "
            "MBN_TEST_CHROMIUM"
        )
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


# How long a wait for the page (a selector, a navigation) may take before the test fails:
# each wait ends on its event, so this is only a hang detector, long enough for a busy machine
# (load 6 on 2 cores), where Playwright's 30 s failed the map's exact embedding.
WAIT_MS = 300_000


class Page:
    """A browser tab on the server that records console errors and every request's URL."""

    def __init__(self, browser: Any, server: Server, key: str | None = KEY) -> None:
        self.context = browser.new_context(viewport=VIEWPORT)
        self.context.set_default_timeout(WAIT_MS)
        self.context.set_default_navigation_timeout(WAIT_MS)
        if key is not None:
            self.context.add_init_script(f"sessionStorage.setItem('mbn.apiKey', {key!r})")
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        # Nothing may come from outside: a request elsewhere fails (and is recorded above).
        self.page.route(
            "**/*",
            lambda route: route.continue_() if self.local(route.request.url) else route.abort(),
        )
        self.server = server

    def local(self, url: str) -> bool:
        # blob: and data: URLs are made in the page (ReDoc's search worker is a blob).
        return url.startswith((self.server.url, "blob:", "data:"))

    def open(self, path: str) -> Any:
        self.page.goto(f"{self.server.url}{path}")
        return self.page

    def assert_clean(self) -> None:
        outside = [url for url in self.requests if not self.local(url)]
        assert outside == [], outside
        assert self.errors == [], self.errors

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tab(browser: Any, server: Server) -> Iterator[Page]:
    page = Page(browser, server)
    yield page
    page.close()


def api(server: Server) -> httpx.Client:
    return server.client(headers={"Authorization": f"Bearer {KEY}"})


def colour_pixels(page: Any, rgb: tuple[int, int, int] | None = None) -> int:
    """Pixels of a screenshot of the map's plot area, decoded by the browser itself, that are
    coloured (not white or grey), or exactly ``rgb``."""
    box = page.locator("#map-plot .nsewdrag").first.bounding_box()
    png = page.screenshot(clip=box)
    return int(
        page.evaluate(
            """async ([bytes, rgb]) => {
                const blob = new Blob([new Uint8Array(bytes)], {type: "image/png"});
                const image = await createImageBitmap(blob);
                const canvas = new OffscreenCanvas(image.width, image.height);
                const context = canvas.getContext("2d");
                context.drawImage(image, 0, 0);
                const data = context.getImageData(0, 0, image.width, image.height).data;
                let count = 0;
                for (let i = 0; i < data.length; i += 4) {
                    const [r, g, b] = [data[i], data[i + 1], data[i + 2]];
                    if (rgb ? r === rgb[0] && g === rgb[1] && b === rgb[2]
                            : Math.max(r, g, b) - Math.min(r, g, b) > 40) count++;
                }
                return count;
            }""",
            [list(png), list(rgb) if rgb else None],
        )
    )


# ---------------------------------------------------------------------- auth


def test_without_a_key_only_the_prompt_shows_and_a_wrong_key_is_refused(
    browser: Any, server: Server, screenshots: Path
) -> None:
    tab = Page(browser, server, key=None)
    try:
        page = tab.open("/")
        page.wait_for_selector("#key-view:not([hidden])")
        assert page.url.endswith("/ui/")
        for hidden in ("#nav", "#models-view", "#map-view", "#jobs-view"):
            assert page.locator(hidden).is_hidden(), hidden
        assert tab.errors == []
        page.screenshot(path=screenshots / "console-key.png")

        page.fill("#key-input", "not-the-key-0123456789")
        page.click("#key-form button")
        page.wait_for_selector("#key-error:has-text('invalid API key')")
        assert page.locator("#models-view").is_hidden()
        assert page.evaluate("sessionStorage.getItem('mbn.apiKey')") is None
        # The only errors are the browser's notes of the refused calls.
        assert tab.errors and all("401" in error for error in tab.errors), tab.errors

        tab.errors.clear()
        page.fill("#key-input", KEY)
        page.click("#key-form button")
        page.wait_for_selector("#models-table tr[data-model-id='m-digits']")
        assert page.evaluate("sessionStorage.getItem('mbn.apiKey')") == KEY
        # The key stays with the tab: a new tab asks again.
        other_context = tab.context.browser.new_context()
        other_context.set_default_timeout(WAIT_MS)
        other = other_context.new_page()
        other.goto(f"{server.url}/ui/")
        other.wait_for_selector("#key-view:not([hidden])")
        other.context.close()
        tab.assert_clean()
    finally:
        tab.close()


# ---------------------------------------------------------------------- models and map


def test_models_page_lists_the_model_with_its_reports(tab: Page, screenshots: Path) -> None:
    page = tab.open("/ui/#/models")
    row = page.locator("#models-table tr[data-model-id='m-digits']")
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[0].startswith("digits") and "default" in cells[0]
    assert cells[1] == "m-digits"
    assert cells[3] == "64 → 10"
    assert cells[4] == str(MAP_ROWS)
    row.locator("details.report-fidelity summary").click()
    assert "r2" in row.locator("details.report-fidelity").inner_text()
    page.screenshot(path=screenshots / "console-models.png", full_page=True)
    tab.assert_clean()


def test_the_runtime_panel_shows_the_exact_runtime_live(tab: Page, screenshots: Path) -> None:
    with api(tab.server) as client:
        exact = {"model": "m-digits", "inputs": [[0.0] * 64, [1.0] * 64], "mode": "exact"}
        assert client.post("/embed", json=exact).status_code == 200
    page = tab.open("/ui/#/models")
    page.locator("#runtime-panel summary").click()
    # Refreshed while open: the figures arrive from the runtime about once a second.
    page.wait_for_function(
        "/requests \\/ rows answered\\s+[1-9]/.test("
        "document.querySelector('#runtime-body').innerText)",
    )
    text = page.locator("#runtime-body").inner_text()
    assert "running (process" in text and "cpu" in text
    # The figures an operator watches: queue depth, rows per step (a
    # histogram), wait and compute time (histograms), restarts, the device.
    lines = dict(line.split("\t", 1) for line in text.splitlines() if "\t" in line)
    for label in ("queued requests / rows", "restarts", "device"):
        assert label in lines, text
    for label in ("rows per step", "wait before the first step", "compute time of a step"):
        assert lines[label].startswith("≤"), text  # a bucket with its count, not "—"
    assert page.locator("#runtime-panel").get_attribute("data-state") == "running"
    page.screenshot(path=screenshots / "console-runtime.png", full_page=True)
    tab.assert_clean()


def test_map_draws_its_points(tab: Page, screenshots: Path) -> None:
    page = tab.open("/ui/#/map/m-digits")
    page.wait_for_selector("body[data-map-render-ms]")
    plotted = page.evaluate(
        "() => document.getElementById('map-plot').data.reduce((n, t) => n + t.x.length, 0)"
    )
    with api(tab.server) as client:
        stored = client.get("/models/m-digits/map").json()["n_points"]
    assert plotted == stored >= 0.8 * MAP_ROWS  # the rows the method was fitted on
    assert page.locator("#map-plot .legendtext").count() == 10  # one entry per digit
    # The legend is not under Plotly's toolbar (it was: its first entries were hidden).
    page.hover("#map-plot")
    legend = page.locator("#map-plot .legend").bounding_box()
    toolbar = page.locator("#map-plot .modebar").bounding_box()
    assert legend is not None and toolbar is not None
    assert legend["y"] >= toolbar["y"] + toolbar["height"] or (
        legend["x"] >= toolbar["x"] + toolbar["width"]
    )
    # The points are on the canvas: thousands of coloured pixels in the plot.
    assert colour_pixels(page) > 1000
    # Hovering a point shows its details.
    box = page.locator("#map-plot .nsewdrag").first.bounding_box()
    assert box is not None
    for fx in np.linspace(0.2, 0.8, 7):
        for fy in np.linspace(0.2, 0.8, 7):
            page.mouse.move(box["x"] + fx * box["width"], box["y"] + fy * box["height"])
            if page.locator("#map-plot .hoverlayer .hovertext").count():
                break
        else:
            continue
        break
    assert "row" in (page.locator("#map-plot .hoverlayer").text_content() or "")
    page.screenshot(path=screenshots / "console-map.png", full_page=True)
    tab.assert_clean()


def test_embedded_rows_appear_on_the_map(
    tab: Page, server: Server, digits, screenshots: Path, tmp_path: Path
) -> None:
    x, _ = digits
    rows = x[MAP_ROWS : MAP_ROWS + 3]  # digits the model never saw
    page = tab.open("/ui/#/map/m-digits")
    page.wait_for_selector("body[data-map-render-ms]")
    before = colour_pixels(page, PLACED_RGB)

    page.fill("#embed-text", json.dumps(rows.tolist()))
    page.select_option("#embed-mode", "exact")
    page.click("#embed-form button[type=submit]")
    # The server's first exact request maps the model, which on a loaded machine takes longer
    # than any fixed wait: wait for its outcome, placed or refused (the test's own timeout
    # bounds it), then say which.
    page.wait_for_function(
        "document.body.dataset.placedRows === '3' || "
        "document.getElementById('embed-error').textContent !== ''",
        timeout=0,
    )
    assert page.inner_text("#embed-error") == ""
    placed = page.evaluate(
        "() => document.getElementById('map-plot').data.find(t => t.meta === 'placed')"
    )
    with api(server) as client:
        embedded = client.post(
            "/embed", json={"model": "m-digits", "inputs": rows.tolist(), "mode": "exact"}
        ).json()
        expected = client.post(
            "/models/m-digits/map/locate", json={"embeddings": embedded["embeddings"]}
        ).json()
    assert placed["x"] == expected["x"] and placed["y"] == expected["y"]
    assert colour_pixels(page, PLACED_RGB) > before
    assert "3 row(s) placed (exact mode)" in page.inner_text("#embed-result")
    page.screenshot(path=screenshots / "console-map-embed.png", full_page=True)

    # The same rows from an .npy file, fast mode.
    npy = tmp_path / "rows.npy"
    np.save(npy, rows.astype(np.float32))
    page.set_input_files("#embed-file", str(npy))
    page.select_option("#embed-mode", "fast")
    page.click("#embed-form button[type=submit]")
    page.wait_for_selector("#embed-result:has-text('(fast mode)')")
    placed = page.evaluate(
        "() => document.getElementById('map-plot').data.filter(t => t.meta === 'placed')"
    )
    assert len(placed) == 1 and len(placed[0]["x"]) == 3

    # A row of the wrong width: the API's message, in place.
    page.set_input_files("#embed-file", [])
    page.fill("#embed-text", "a,b\n1,2\n")
    page.click("#embed-form button[type=submit]")
    page.wait_for_selector("#embed-error:has-text('64')")
    tab.errors.clear()  # the refused call's 422 note
    assert page.locator("#embed-error").inner_text().strip() != ""

    # A first row with one bad cell is data to report, not a header to drop in silence.
    page.fill("#embed-text", "1,2x\n3,4\n")
    page.click("#embed-form button[type=submit]")
    page.wait_for_selector("#embed-error:has-text('row 1, column 2')")


# ---------------------------------------------------------------------- jobs


def submitted_job(tab: Page, server: Server) -> str:
    """The id of the job the form just queued; on an error or silence, a failure that says
    what the page and the server saw (a bare timeout said neither)."""
    page = tab.page
    try:
        page.wait_for_selector("#train-result:has-text('queued'), #train-error:not(:empty)")
    except sync_api.TimeoutError:
        pytest.fail(
            f"no answer to the form in {WAIT_MS // 1000} s; page errors {tab.errors}; "
            f"last requests {tab.requests[-5:]}\nserver log:\n{server.log_tail()}"
        )
    error = page.inner_text("#train-error")
    if error:
        pytest.fail(f"the form showed {error!r}; server log:\n{server.log_tail()}")
    return page.inner_text("#train-result").split()[1]


def test_a_job_from_the_form_shows_progress_to_success_and_its_model_can_be_deleted(
    tab: Page, server: Server, digits, screenshots: Path, tmp_path: Path
) -> None:
    x, _ = digits
    data = tmp_path / "train.csv"
    np.savetxt(data, x[:400], delimiter=",", fmt="%g")
    page = tab.open("/ui/#/jobs")
    page.wait_for_selector("#jobs-view:not([hidden])")
    tab.assert_clean()

    page.set_input_files("#train-file", str(data))
    page.fill("#train-name", "from-form")
    # A bad value first: the API's own message appears beside the field.
    page.fill("[data-param='n_clusterings']", "0")
    page.click("#train-submit")
    page.wait_for_selector("[data-param='n_clusterings'].invalid")
    with api(server) as client:
        refused = client.post(
            "/train",
            files={"file": ("train.csv", data.read_bytes())},
            data={"name": "from-form", "params": json.dumps({"n_clusterings": 0})},
        )
    assert refused.status_code == 422
    message = refused.json()["error"]["message"]
    field = page.locator("[data-param='n_clusterings']").locator("xpath=..")
    assert field.locator(".field-error").inner_text() == message
    page.screenshot(path=screenshots / "console-jobs-error.png", full_page=True)
    tab.errors.clear()  # the 422's note

    params = {**TINY_PARAMS, "map_points": 300}
    page.fill("[data-param='n_clusterings']", str(params["n_clusterings"]))
    page.fill("[data-param='max_epochs']", str(params["max_epochs"]))
    page.fill("[data-param='n_clusters']", str(params["n_clusters"]))
    page.fill("[data-param='hidden_layer_sizes']", "32")
    page.fill("[data-param='map_points']", "300")
    # Record every state the job's row shows, from the page itself.
    page.evaluate(
        """() => {
            window.seen = [];
            new MutationObserver(() => {
                for (const row of document.querySelectorAll("#jobs-table tr[data-job-id]")) {
                    const bar = row.querySelector("progress");
                    window.seen.push([row.dataset.jobId, row.dataset.status, bar.value,
                                      row.children[3].textContent]);
                }
            }).observe(document.querySelector("#jobs-table tbody"), {childList: true});
        }"""
    )
    page.click("#train-submit")
    job_id = submitted_job(tab, server)
    row = f"#jobs-table tr[data-job-id='{job_id}']"
    page.wait_for_selector(f"{row}[data-status='running']")
    page.screenshot(path=screenshots / "console-jobs.png", full_page=True)
    page.wait_for_selector(f"{row}[data-status='succeeded']")
    seen = [s for s in page.evaluate("window.seen") if s[0] == job_id]
    running = [s for s in seen if s[1] == "running"]
    # Which fractions and phases a 1 s poll catches depends on the job's speed; what must hold
    # is that the row showed the job running, then succeeded with a full bar.
    assert running, seen
    assert all(0 <= s[2] < 100 for s in running), seen
    assert seen[-1][1] == "succeeded" and seen[-1][2] == 100
    assert page.locator(f"{row} td").nth(5).inner_text() == "0 s"  # nothing remaining
    tab.assert_clean()

    with api(server) as client:
        model_id = client.get(f"/jobs/{job_id}").json()["model_id"]
    # Its map is one click away, and it can be deleted (after confirming).
    page.click(f"{row} a:has-text('Map')")
    page.wait_for_selector("body[data-map-points='300']")
    page.goto(f"{server.url}/ui/#/models")
    model_row = page.locator(f"#models-table tr[data-model-id='{model_id}']")
    model_row.wait_for()
    model_row.locator("button:has-text('Delete')").click()
    page.click("#delete-dialog button[value=cancel]")
    assert model_row.count() == 1
    model_row.locator("button:has-text('Delete')").click()
    page.screenshot(path=screenshots / "console-delete.png")
    page.click("#delete-confirm")
    model_row.wait_for(state="detached")
    with api(server) as client:
        wait_for(lambda: client.get(f"/models/{model_id}").status_code == 404, 10, "the deletion")
    # The job no longer links to the deleted model's (empty) map.
    page.goto(f"{server.url}/ui/#/jobs")
    page.wait_for_selector(f"{row} [data-model-deleted]")
    assert page.locator(f"{row} a:has-text('Map')").count() == 0
    tab.assert_clean()


# ---------------------------------------------------------------------- API pages


def test_api_pages_work_without_internet(browser: Any, server: Server, screenshots: Path) -> None:
    tab = Page(browser, server, key=None)
    try:
        page = tab.open("/docs")
        page.wait_for_selector(".swagger-ui .opblock-summary-path[data-path='/embed']")
        assert page.locator(".swagger-ui .opblock").count() >= 10
        assert "MBN embedding service" in page.inner_text(".swagger-ui .info .title")
        page.screenshot(path=screenshots / "api-docs.png")
        tab.assert_clean()

        page = tab.open("/redoc")
        page.get_by_role("heading", name="Embed rows with a model").wait_for()
        page.screenshot(path=screenshots / "api-redoc.png")
        # ReDoc 2 always adds an "API docs by Redocly" logo from its CDN; offline it is a
        # missing image (refused above), nothing else.
        logo = "https://cdn.redoc.ly/redoc/logo-mini.svg"
        tab.requests = [url for url in tab.requests if url != logo]
        assert all("ERR_FAILED" in error for error in tab.errors), tab.errors
        tab.errors.clear()
        tab.assert_clean()
    finally:
        tab.close()
