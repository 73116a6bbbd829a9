"""The browser client and the demo page in a real headless Chromium, against the real
server (Piper, joe voice) on loopback.

Headless Chromium with no sound device still runs an AudioContext: it renders into a fake
output stream in real time (checked in the fixture), so the worklet's counters and
its output are as real as on a laptop, minus the loudspeaker.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RunningServer

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--autoplay-policy=no-user-gesture-required",
]
WAIT_MS = 60_000  # for one utterance to play out: a few seconds of speech, with room for a busy CPU

# The first sentence is long enough to be split at its clause, and no later segment is
# longer than the audio already ahead of it, so at Piper's usual RTF (0.2) the audio is
# always early and an underrun is the player's fault.
TEXT = "Streaming speech should start at once, while the rest is still being computed. Then each chunk plays as it arrives."
SHORT = "This one is short."
LONG = " ".join([TEXT] * 4)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).is_file():
        pytest.fail(
            f"Chromium is missing at {CHROMIUM}: install it with `apt-get install -y chromium` "
            "(.ci/run does this on a fresh machine); these tests never download a browser"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the Python package `playwright` is missing: pip install -e '.[test]'")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=30_000)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser, piper_server: RunningServer):
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.goto(piper_server.http + "/")  # as a newcomer would: the redirect to the demo, no configuration
    page.wait_for_selector("body[data-state=idle]", timeout=15_000)
    audio = page.evaluate("""async () => {
        const p = window.voxwireDemo.player;
        await p.start();
        return {state: p.context.state, rate: p.sampleRate, node: !!p.node};
    }""")
    assert audio["state"] == "running", f"the AudioContext does not run in headless Chromium: {audio}"
    assert audio["node"]
    yield page
    context.close()
    assert not errors, errors


def click_speak(page, text: str, words: bool = False) -> None:
    page.fill("#text", text)
    page.set_checked("#stream-words", words)
    page.click("#speak")


def wait_played(page, index: int = -1) -> dict:
    """Wait until run `index` has played out; its figures, from the page and the worklet."""
    page.wait_for_function(f"window.voxwireDemo.runs.at({index})?.result")
    return page.evaluate(f"""() => {{
        const d = window.voxwireDemo, r = d.runs.at({index});
        return {{result: r.result, done: r.done, started: r.started, error: r.error, pieces: r.pieces,
                 ttfa: r.ttfaMs, ttfs: r.ttfsMs, arrivals: r.arrivals, context_rate: d.player.sampleRate,
                 stats: d.player.stats}};
    }}""")


def expected_samples(run: dict) -> float:
    """What the server said it sent, in samples at the AudioContext's rate."""
    return run["done"]["samples"] * run["context_rate"] / run["started"]["sample_rate"]


def assert_played_all(run: dict) -> None:
    expected = expected_samples(run)
    played = run["result"]["played"]
    assert played >= 0.95 * expected, f"played {played} of {expected:.0f} samples"
    assert played <= expected + 256, f"played {played}, more than the {expected:.0f} sent"


def assert_no_underrun_unless_late(run: dict) -> None:
    """No underrun once playing, unless the audio itself came late.

    The player is to blame for a stall only if every chunk arrived before it was due: due
    at the first sound plus the audio before it. On a CPU busy with other work the server
    can fall behind real time; then the stall must be counted instead (a player that hid
    it would be lying). Within 30 ms either way, either outcome is fair.
    """
    before = [0.0] + [a["ms"] for a in run["arrivals"][:-1]]
    leads = [run["ttfs"] + start - a["t"] for start, a in zip(before[1:], run["arrivals"][1:])]
    lead = min(leads, default=float("inf"))
    result = run["result"]
    if lead >= 30:
        assert result["underruns"] == 0 and result["stalledSamples"] == 0, (f"audio was {lead:.0f} ms ahead", result)
    elif lead <= -30:
        assert result["underruns"] >= 1 and result["stalledSamples"] > 0, (f"audio came {-lead:.0f} ms late", result)


# A recorder: a second worklet that keeps what the player's node outputs, block by block.
RECORDER = """async () => {
    const p = window.voxwireDemo.player;
    const code = `registerProcessor('recorder', class extends AudioWorkletProcessor {
        process(inputs) { const x = inputs[0][0]; if (x) this.port.postMessage(x.slice()); return true; } });`;
    await p.context.audioWorklet.addModule(URL.createObjectURL(new Blob([code], {type: 'text/javascript'})));
    const rec = new AudioWorkletNode(p.context, 'recorder', {channelCount: 1, channelCountMode: 'explicit'});
    const blocks = [];
    rec.port.onmessage = (e) => blocks.push(e.data);
    p.node.connect(rec);
    rec.connect(p.context.destination);
    window.recorded = blocks;
    window.received = [];
    const play = p.play.bind(p);  // and what arrives for every utterance the player is given
    p.play = (u) => { u.on('audio', (a) => window.received.push(a.samples)); return play(u); };
}"""

# Output against input: equal sample for sample, except for zeros inserted by stalls.
COMPARE = """() => {
    const cat = (parts) => { const n = parts.reduce((s, x) => s + x.length, 0), out = new Float32Array(n);
        let at = 0; for (const x of parts) { out.set(x, at); at += x.length; } return out; };
    const got = cat(window.recorded), sent = cat(window.received);
    const firstLoud = (x) => x.findIndex((v) => Math.abs(v) > 1e-3);
    const shift = firstLoud(got) - firstLoud(sent);
    let before = 0;
    for (let j = 0; j < shift; j++) before = Math.max(before, Math.abs(got[j]));
    let i = 0, j = Math.max(shift, 0), inserted = 0, mismatched = 0, peak = 0;
    while (i < sent.length && j < got.length) {
        if (got[j] === sent[i]) { peak = Math.max(peak, Math.abs(got[j])); i++; j++; }
        else if (got[j] === 0) { inserted++; j++; }  // silence played during a stall
        else { mismatched++; i++; j++; }
    }
    let after = 0;
    for (; j < got.length; j++) after = Math.max(after, Math.abs(got[j]));
    return {sent: sent.length, matched_to: i, recorded: got.length, shift, mismatched, inserted, peak, before, after};
}"""


@pytest.mark.timeout(120)
def test_speak_plays_the_whole_utterance_without_an_underrun(page):
    page.evaluate(RECORDER)
    click_speak(page, TEXT)
    run = wait_played(page)
    assert run["error"] is None
    assert_played_all(run)
    assert_no_underrun_unless_late(run)
    assert 0 < run["ttfa"] <= run["ttfs"], (run["ttfa"], run["ttfs"])
    # What the worklet output is exactly what arrived, in order: no gap, repeat or click
    # at any of the seams between chunks, and silence before and after.
    page.wait_for_timeout(100)  # the recorder's last blocks are a message away
    cmp = page.evaluate(COMPARE)
    assert run["started"]["sample_rate"] == run["context_rate"]  # asked for: nothing to resample
    assert cmp["sent"] == run["done"]["samples"]
    assert cmp["shift"] >= 0 and cmp["mismatched"] == 0 and cmp["matched_to"] == cmp["sent"], cmp
    assert cmp["inserted"] == run["result"]["stalledSamples"], cmp  # 0 unless the audio came late
    assert cmp["peak"] > 0.1 and cmp["before"] == 0 and cmp["after"] == 0, cmp
    # The page shows the worklet's figures.
    assert page.inner_text("#underruns").split()[0] == str(run["stats"]["underruns"])
    assert page.inner_text("#played").startswith(f"{run['result']['played']:,} (")
    assert page.inner_text("#ttfa").endswith(" ms") and page.inner_text("#server-ttfa").endswith(" ms")
    colored = page.evaluate("""() => {
        const c = document.getElementById('timeline'), px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let green = 0, blue = 0;
        for (let i = 0; i < px.length; i += 4) {
            if (px[i + 1] > 120 && px[i] < 60 && px[i + 2] < 160) green++;
            if (px[i + 2] > 200 && px[i] < 80) blue++;
        }
        return {green, blue};
    }""")
    assert colored["green"] > 200 and colored["blue"] > 200, colored  # both lines are drawn


@pytest.mark.timeout(120)
def test_stop_halts_playback_at_once(page, piper_server):
    click_speak(page, LONG)
    rate = page.evaluate("window.voxwireDemo.player.sampleRate")
    page.wait_for_function(f"window.voxwireDemo.player.stats.played > {rate}")  # one second in
    page.click("#stop")
    at_stop = page.evaluate("window.voxwireDemo.stoppedAt.played")
    page.wait_for_timeout(150)
    soon = page.evaluate("window.voxwireDemo.player.stats")
    page.wait_for_timeout(500)
    later = page.evaluate("window.voxwireDemo.player.stats")
    # At most a stats period (20 ms) and a message hop more was played after the click.
    assert soon["played"] - at_stop <= 0.06 * rate, (at_stop, soon)
    assert later["played"] == soon["played"], (soon, later)
    assert later["state"] == "idle" and later["buffered"] == 0
    assert at_stop < 2 * rate  # stopped a second in, of the text's ~20 s
    run = page.evaluate("(({state}) => ({state}))(window.voxwireDemo.current.u)")
    assert run["state"] == "cancelled"
    page.wait_for_function("window.voxwireDemo.current.result")
    assert page.evaluate("window.voxwireDemo.current.result.dropped") is True
    # The server stopped computing too.
    page.wait_for_timeout(500)
    assert piper_server.service.worker.active == 0
    assert piper_server.service.admission.utterances == 0


@pytest.mark.timeout(120)
def test_two_utterances_back_to_back_both_play(page):
    click_speak(page, TEXT)
    page.wait_for_function("window.voxwireDemo.player.stats.played > 0")
    click_speak(page, SHORT)  # while the first still plays: it is queued behind it
    first = wait_played(page, 0)
    second = wait_played(page, 1)
    assert first["error"] is None and second["error"] is None
    assert_played_all(first)
    assert_played_all(second)
    assert first["done"]["ctx"] != second["done"]["ctx"]
    assert_no_underrun_unless_late(first)
    assert_no_underrun_unless_late(second)
    total = page.evaluate("window.voxwireDemo.player.stats.played")
    assert total == first["result"]["played"] + second["result"]["played"]
    # And one more after both have finished, on the same socket.
    click_speak(page, SHORT)
    third = wait_played(page, 2)
    assert_played_all(third)


@pytest.mark.timeout(60)
def test_a_bad_voice_shows_a_clear_error(page):
    page.evaluate("document.getElementById('voice').add(new Option('Nobody', 'nobody', true, true))")
    click_speak(page, SHORT)
    page.wait_for_selector("#error:not([hidden])", timeout=10_000)
    shown = page.inner_text("#error")
    assert "unknown_voice" in shown and "nobody" in shown, shown
    run = wait_played(page)
    assert run["error"]["code"] == "unknown_voice" and run["error"]["terminal"] is True
    assert run["result"]["played"] == 0
    # The page recovers: a good voice speaks and the error goes away.
    page.select_option("#voice", "joe")
    click_speak(page, SHORT)
    page.wait_for_selector("#error", state="hidden", timeout=5_000)
    assert_played_all(wait_played(page))


@pytest.mark.timeout(120)
def test_text_fed_in_pieces_plays(page):
    click_speak(page, TEXT, words=True)
    run = wait_played(page)
    assert run["error"] is None
    assert run["pieces"] == len(TEXT.split()), run["pieces"]
    assert run["done"]["segments"] >= 2
    assert_played_all(run)


@pytest.mark.timeout(120)
def test_a_stream_rate_other_than_the_context_rate_is_resampled(page):
    """The server sends 16 kHz; the player resamples to the context's rate (44.1 or 48 kHz)."""
    run = page.evaluate("""async (text) => {
        const {vx, player} = window.voxwireDemo;
        const u = vx.speak(text, {sampleRate: 16000});
        const result = await player.play(u);
        return {result, done: u.figures, started: u.started, context_rate: player.sampleRate};
    }""", TEXT)
    assert run["started"]["sample_rate"] == 16000 != run["context_rate"]
    assert_played_all(run)
    assert abs(run["result"]["played"] - expected_samples(run)) <= 2, run  # the resampler keeps the length


@pytest.mark.timeout(120)
def test_word_timestamps_reach_the_browser_client(page):
    """The real server's `timestamps` events, surfaced by the JS client as `u.words`."""
    run = page.evaluate("""async () => {
        const {vx} = window.voxwireDemo;
        const u = vx.speak('The quick brown fox jumps over the lazy dog.', {timestamps: true});
        const events = [];
        u.on('timestamps', (words) => events.push(words.length));
        const done = await u.finished;
        return {words: u.words, events, audio_ms: done.audio_ms};
    }""")
    assert [w["word"] for w in run["words"]] == "The quick brown fox jumps over the lazy dog".split()
    starts = [w["start_ms"] for w in run["words"]]
    assert starts == sorted(starts) and run["words"][-1]["end_ms"] <= run["audio_ms"] + 1
    assert sum(run["events"]) == 9 and len(run["events"]) >= 2  # sent chunk by chunk


@pytest.mark.timeout(120)
def test_the_readme_embedding_example_works_as_written(browser, piper_server: RunningServer):
    js = Path(__file__).resolve().parents[3] / "clients" / "js"
    snippet = (js / "README.md").read_text().split("```html\n", 1)[1].split("```", 1)[0]
    assert snippet in (js / "example.html").read_text(), "example.html must hold the README's example verbatim"
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.goto(f"{piper_server.http}/client/example.html")
    page.evaluate("""async () => {
        const { Player } = await import('/client/player.js');  // the same module instance as the page's
        const play = Player.prototype.play;
        window.plays = [];
        Player.prototype.play = function (u) {
            const done = play.call(this, u);
            done.then((result) => window.plays.push({result, done: u.figures, started: u.started, context_rate: this.sampleRate}));
            return done;
        };
    }""")
    page.click("#say")
    page.wait_for_function("window.plays.length === 1")
    run = page.evaluate("window.plays[0]")
    context.close()
    assert not errors, errors
    assert_played_all(run)


@pytest.mark.timeout(60)
def test_a_server_with_api_keys_takes_the_pages_token_and_refuses_without(browser):
    from server.config import AuthConfig, ServerConfig
    from tests.conftest import run_server
    from tests.fixtures.engines import ToneEngine

    config = ServerConfig(auth=AuthConfig(api_keys=("s3cret",)))
    with run_server(config, engine=lambda: ToneEngine()) as server:
        context = browser.new_context()
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.goto(server.http + "/?token=s3cret")  # the redirect keeps the query
        page.wait_for_selector("body[data-state=idle]")
        assert page.evaluate("window.voxwireDemo.vx.voices.map((v) => v.id)") == ["tone"]
        click_speak(page, "one two three")
        run = wait_played(page)
        assert_played_all(run)
        page.goto(server.http + "/")  # no token: refused, and the page says so
        page.wait_for_selector("body[data-state=error]")
        shown = page.inner_text("#error")
        assert "connect_failed" in shown and "1008" in shown, shown
        context.close()
