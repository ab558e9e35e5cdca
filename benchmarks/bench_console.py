"""How fast the web console draws a model's map of 20,000 points, in headless Chromium.

Trains a small model on 20,000 MNIST digits with the default map (t-SNE of all 20,000 rows,
coloured by label), starts ``python -m service serve`` on it, and opens the map view in
Debian's chromium through Playwright several times. Reports per load, median over loads:

- ``render``: from the console's ``Plotly.newPlot`` call until the browser has painted the
  frame (two animation frames later): the cost of drawing the 20,000 points;
- ``page``: from navigation to that paint: page, Plotly, the key check, GET /models/{id}/map
  (about 0.7 MB of JSON) and the drawing together.

The training's own map cost (t-SNE seconds, from the manifest) is printed too.

    python benchmarks/bench_console.py [--rows 20000] [--loads 7] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_data import load_mnist
from bench_server import free_port

from mbn_core.pipeline.training import train_bundle

PARAMS = {
    "n_clusterings": 40,
    "k_max": 500,
    "hidden_layer_sizes": [64],
    "max_epochs": 5,
    "n_clusters": 10,
    "map_points": 20_000,
}
KEY = "bench-console-key-0123456789"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--loads", type=int, default=7)
    parser.add_argument("--data", default=None, help="MNIST .npz (default: bench_data)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--keep", default=None, help="directory to keep the data dir in")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    x, y = load_mnist(args.data)
    x, y = x[: args.rows].astype("float32") / 255.0, y[: args.rows]
    data_dir = Path(args.keep or tempfile.mkdtemp(prefix="bench-console-"))
    models = data_dir / "models"
    models.mkdir(parents=True, exist_ok=True)
    bundle = models / "m-mnist-map"
    if not bundle.exists():
        started = time.perf_counter()
        train_bundle(x, bundle, name="mnist-map", params=PARAMS, y=y)
        print(f"trained {args.rows} rows in {time.perf_counter() - started:.1f} s")
    manifest = json.loads((bundle / "manifest.json").read_text())
    print(f"map: {manifest['map']} (t-SNE seconds in training: {manifest['map']['seconds']})")

    port = free_port()
    env = {
        **os.environ,
        "MBN_DATA_DIR": str(data_dir),
        "MBN_API_KEYS": KEY,
        "MBN_DEMO_MODEL": "false",
        "MBN_EMBEDDED_WORKER": "false",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(3000):  # start-up on a busy machine
            try:
                if httpx.get(f"{url}/health/live", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        renders, pages = [], []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium)
            for load in range(args.loads + 1):  # the first load warms caches; not counted
                context = browser.new_context(viewport={"width": 1280, "height": 800})
                context.add_init_script(f"sessionStorage.setItem('mbn.apiKey', '{KEY}')")
                page = context.new_page()
                started = time.perf_counter()
                page.goto(f"{url}/ui/#/map/m-mnist-map")
                page.wait_for_selector("body[data-map-render-ms]", timeout=120_000)
                page_ms = (time.perf_counter() - started) * 1000
                render_ms = float(page.get_attribute("body", "data-map-render-ms") or "nan")
                points = int(page.get_attribute("body", "data-map-points") or 0)
                context.close()
                if load == 0:
                    continue
                renders.append(render_ms)
                pages.append(page_ms)
                print(
                    f"load {load}: {points} points, render {render_ms:.0f} ms, "
                    f"page {page_ms:.0f} ms"
                )
            browser.close()
        version = subprocess.run(
            [args.chromium, "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        print(
            f"{version}: {points} points, median render {statistics.median(renders):.0f} ms "
            f"(min {min(renders):.0f}, max {max(renders):.0f}), median page "
            f"{statistics.median(pages):.0f} ms over {len(renders)} loads"
        )
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
