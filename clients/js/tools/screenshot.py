"""Regenerate docs/demo.png: the demo page after speaking, in headless Chromium.

    .venv/bin/python -m clients.js.tools.screenshot [--url http://127.0.0.1:8000/] [-o docs/demo.png]

Run it as a module from the repository root, as above: it reuses the browser tests' launch
recipe and server fixture (tests/), which are importable from there and not installed.

Without --url it starts its own server (Piper, joe voice) on a free loopback port. It
speaks a short warm-up utterance before the one it shows, so the figures are a warm
server's.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from tests.clients.js.test_browser import CHROMIUM, CHROMIUM_ARGS  # one launch recipe

ROOT = Path(__file__).resolve().parents[3]


@contextlib.contextmanager
def own_server():
    from voxwire.engine.registry import EngineOptions
    from voxwire.server.config import ServerConfig
    from tests.conftest import run_server

    with run_server(ServerConfig(engine=EngineOptions(name="piper"))) as s:
        yield s.http + "/"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="a running server's demo page (default: start one)")
    ap.add_argument("-o", "--output", default=str(ROOT / "docs" / "demo.png"))
    args = ap.parse_args()

    from playwright.sync_api import sync_playwright

    with (contextlib.nullcontext(args.url) if args.url else own_server()) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 960, "height": 660}, device_scale_factor=1)
        page.goto(url)
        page.wait_for_selector("body[data-state=idle]", timeout=15_000)
        # One short utterance first, so the figures are a warm server's, as users see them.
        page.evaluate("async () => { const d = window.voxwireDemo; await d.speak('Warming up.').finished; }")
        page.click("#speak")
        page.wait_for_function("window.voxwireDemo.current?.result", timeout=120_000)
        page.wait_for_timeout(300)  # one more frame of figures and timeline
        page.screenshot(path=args.output, full_page=True)
        browser.close()
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
