"""Opus in a real headless Chromium: the JS client decodes the server's Ogg Opus frames
with WebCodecs' AudioDecoder and its player plays them, against the real server (Piper)."""

from __future__ import annotations

import pytest

from tests.clients.js.test_browser import (  # noqa: F401  (browser: a fixture)
    TEXT,
    assert_no_underrun_unless_late,
    assert_played_all,
    browser,
    click_speak,
    demo_page,
    expected_samples,
    wait_played,
)
from tests.conftest import RunningServer

pytestmark = pytest.mark.slow  # drives a real headless Chromium


@pytest.mark.timeout(180)
def test_opus_is_decoded_in_the_browser_and_plays_whole(browser, piper_server: RunningServer):  # noqa: F811
    with demo_page(browser, piper_server.http + "/") as page:
        assert page.evaluate("typeof AudioDecoder === 'function'"), "this Chromium has no WebCodecs"
        # The demo's connection asks for Opus from now on (its defaults go in each speak).
        page.evaluate("window.voxwireDemo.vx.defaults.format = 'opus'")
        click_speak(page, TEXT)
        run = wait_played(page)
        assert run["error"] is None
        assert (run["started"]["format"], run["started"]["codec"], run["started"]["sample_rate"]) == ("opus", "opus", 48000)
        decoded = page.evaluate("window.voxwireDemo.runs.at(-1).u.samples")
        # Every sample the server encoded came out of the decoder: no more, no fewer.
        assert decoded == run["done"]["samples"], (decoded, run["done"])
        assert run["done"]["bytes"] < run["done"]["samples"] // 4  # compressed indeed
        assert_played_all(run)
        assert abs(run["result"]["played"] - expected_samples(run)) <= 2, (run["result"], expected_samples(run))
        assert_no_underrun_unless_late(run)
