"""The browser client and the demo page in a real headless Chromium, against the real
server (Piper, joe voice) on loopback.

Headless Chromium with no sound device still runs an AudioContext: it renders into a fake
output stream in real time (checked in the fixture), so the worklet's counters and
its output are as real as on a laptop, minus the loudspeaker.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RunningServer

pytestmark = pytest.mark.slow  # drives a real headless Chromium

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


@contextlib.contextmanager
def demo_page(browser, url: str, init_script: str | None = None, expected: str | None = None) -> Iterator[object]:
    """The demo page at `url`, connected, its audio running; no page or console error allowed,
    but for console errors that contain `expected`."""
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("console", lambda m: errors.append(f"console: {m.text}")
            if m.type == "error" and not (expected and expected in m.text) else None)
    if init_script:
        page.add_init_script(init_script)
    page.goto(url)
    page.wait_for_selector("body[data-state=idle]", timeout=15_000)
    audio = page.evaluate("""async () => {
        const p = window.voxwireDemo.player;
        await p.start();
        return {state: p.context.state, rate: p.sampleRate, node: !!p.node};
    }""")
    assert audio["state"] == "running", f"the AudioContext does not run in headless Chromium: {audio}"
    assert audio["node"]
    try:
        yield page
    finally:
        context.close()
    assert not errors, errors


@pytest.fixture
def page(browser, piper_server: RunningServer):
    # As a newcomer would: the redirect to the demo, no configuration.
    with demo_page(browser, piper_server.http + "/") as page:
        yield page


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
    it would be lying). Within 60 ms either way, either outcome is fair: a chunk still has
    to go from the page to the worklet's thread, which on two cores shared with the server
    took longer than 30 ms (an underrun with the audio 38 ms ahead, in a full test run).
    """
    before = [0.0] + [a["ms"] for a in run["arrivals"][:-1]]
    leads = [run["ttfs"] + start - a["t"] for start, a in zip(before[1:], run["arrivals"][1:])]
    lead = min(leads, default=float("inf"))
    result = run["result"]
    if lead >= 60:
        assert result["underruns"] == 0 and result["stalledSamples"] == 0, (f"audio was {lead:.0f} ms ahead", result)
    elif lead <= -60:
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
    from voxwire.server.config import AuthConfig, ServerConfig
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


# Issue 29, case 4: the demo's key leaves the browser only as the subprotocol. Given in the
# fragment it is in no request at all; given as ?token= it is in the two navigations that
# brought it (the server's logs redact it there) and in nothing after: no Referer, no
# socket URL, no reload, since the page moves it into the fragment.
@pytest.mark.timeout(60)
@pytest.mark.parametrize("given", ["#token=", "?token="])
def test_the_demo_pages_key_leaves_the_browser_only_as_the_subprotocol(browser, given):
    from voxwire.server.config import AuthConfig, ServerConfig
    from tests.conftest import run_server
    from tests.fixtures.engines import ToneEngine

    key = "k3y-0f-the-demo"
    with run_server(ServerConfig(auth=AuthConfig(api_keys=(key,))), engine=lambda: ToneEngine()) as server:
        context = browser.new_context()
        page = context.new_page()
        page.set_default_timeout(30_000)
        requests, sockets = [], []
        page.on("request", lambda r: requests.append(r))
        page.on("websocket", lambda ws: sockets.append(ws.url))
        page.goto(f"{server.http}/{given}{key}")
        page.wait_for_selector("body[data-state=idle]")
        click_speak(page, "one two three")
        assert_played_all(wait_played(page))
        assert page.evaluate("[location.search, location.hash]") == ["", f"#token={key}"]
        assert page.evaluate("window.voxwireDemo.vx._ws.protocol") == "voxwire.v1"
        page.reload()  # the key still in the page, and still in no request
        page.wait_for_selector("body[data-state=idle]")
        # The redirect from / moves a ?token= into the fragment: only the first load brings it.
        brought = {f"{server.http}/?token={key}"} if given[0] == "?" else set()
        assert {r.url for r in requests} & brought == brought
        for r in requests:
            if r.url not in brought:
                assert key not in r.url and key not in r.all_headers().get("referer", ""), (r.url, r.all_headers())
        assert len(sockets) == 2 and all(key not in url for url in sockets)
        context.close()


# Issue 20, item 11: the demo's figures are the current run's (the last Speak), never a
# sum over runs, even when runs queue behind one another or are stopped.

# An underrun made on purpose in the first utterance the player is given, whatever the
# server's speed: its audio passes until the player has enough to start, and the rest (and
# its `done`) is held back until the player has stalled on it.
STARVE_FIRST = """() => {
    const p = window.voxwireDemo.player;
    const play = p.play.bind(p);
    let first = true;
    p.play = (u) => {
        if (first) {
            first = false;
            const emit = u.emit.bind(u), held = [];
            let passedMs = 0, open = false;
            u.emit = (type, v) => {
                if (open || (type !== 'audio' && type !== 'done')) return emit(type, v);
                if (type === 'audio' && passedMs < p.startMs) {
                    passedMs += (v.samples.length / v.sampleRate) * 1000;
                    return emit(type, v);
                }
                held.push([type, v]);
            };
            p.on('stats', (s) => {
                if (open || s.state !== 'stalled') return;
                open = true;
                for (const [type, v] of held.splice(0)) emit(type, v);
            });
        }
        return play(u);
    };
}"""

# Every value the page shows as "samples played", with what the run it describes had
# received when it was shown (a MutationObserver runs in the task that rendered it).
WATCH_PLAYED = """() => {
    const d = window.voxwireDemo;
    window.shownPlayed = [];
    new MutationObserver(() => {
        const run = d.current, shown = document.getElementById('played').textContent.split(' ')[0];
        window.shownPlayed.push({run: d.runs.indexOf(run), shown: Number(shown.replaceAll(',', '')),
                                 received: run ? run.u.samples : 0});
    }).observe(document.getElementById('played'), {childList: true, characterData: true, subtree: true});
}"""

# The figures the page shows, as numbers.
SHOWN = """() => {
    const text = (id) => document.getElementById(id).textContent;
    return {played: Number(text('played').split(' ')[0].replaceAll(',', '')),
            underruns: Number(text('underruns').split(' ')[0]),
            chunks: Number(text('chunks')), state: document.body.dataset.state};
}"""

# Points of a run's timeline where the played line is above the received one.
PLAYED_ABOVE_RECEIVED = """(i) => {
    const r = window.voxwireDemo.runs[i];
    return r.played.filter((p) => p.ms > (r.arrivals.filter((a) => a.t <= p.t).at(-1)?.ms ?? 0) + 1e-6);
}"""


@pytest.mark.timeout(120)
def test_a_second_run_shows_its_own_figures_not_the_sum(page):
    page.evaluate(STARVE_FIRST)
    page.evaluate(WATCH_PLAYED)
    click_speak(page, TEXT)
    # The first run has stalled once and plays again: then Speak again, queued behind it.
    page.wait_for_function("""(() => { const s = window.voxwireDemo.player.stats;
        return s.underruns >= 1 && s.state === 'playing'; })()""")
    click_speak(page, SHORT)
    first = wait_played(page, 0)
    second = wait_played(page, 1)
    assert first["result"]["underruns"] >= 1 and first["result"]["played"] > 0, first["result"]
    assert second["error"] is None
    assert_played_all(second)
    assert second["started"]["sample_rate"] == second["context_rate"]  # received and played count the same samples
    shown = page.evaluate(SHOWN)
    assert abs(shown["played"] - second["result"]["played"]) <= 128, (shown, second["result"])
    assert shown["underruns"] == second["result"]["underruns"], (shown, first["result"], second["result"])
    assert shown["chunks"] == len(second["arrivals"])
    over = [w for w in page.evaluate("window.shownPlayed") if w["run"] == 1 and w["shown"] > w["received"]]
    assert not over, over[:5]  # never more played than the run had received
    assert not page.evaluate(PLAYED_ABOVE_RECEIVED, 1)
    assert shown["state"] == "idle"


@pytest.mark.timeout(120)
def test_after_quick_speaks_and_stop_the_figures_are_the_last_runs_and_the_page_is_idle(page):
    for _ in range(5):
        click_speak(page, TEXT)
    rate = page.evaluate("window.voxwireDemo.player.sampleRate")
    base = page.evaluate("window.voxwireDemo.player.stats.played")
    page.wait_for_function(f"window.voxwireDemo.player.stats.played > {base + rate // 4}")  # the first plays
    page.click("#stop")
    assert page.evaluate("document.body.dataset.state") == "idle"
    page.wait_for_function("window.voxwireDemo.runs.every((r) => r.result)")
    last = wait_played(page, 4)
    assert last["result"]["dropped"] is True
    shown = page.evaluate(SHOWN)
    assert shown["played"] == last["result"]["played"] == 0, (shown, last["result"])  # it never reached the speaker
    received = page.evaluate("window.voxwireDemo.runs[4].u.samples")
    assert shown["played"] <= received
    assert shown["chunks"] == len(last["arrivals"])
    assert shown["underruns"] == last["result"]["underruns"] == 0
    assert not page.evaluate(PLAYED_ABOVE_RECEIVED, 4)
    assert shown["state"] == "idle"
    assert page.evaluate("window.voxwireDemo.player.stats.state") == "idle"


# An AudioContext at 44.1 kHz, whatever the device's rate.
CONTEXT_44K = """(() => {
    const Base = window.AudioContext;
    window.AudioContext = class extends Base { constructor(opts = {}) { super({...opts, sampleRate: 44100}); } };
})();"""


# Every utterance reaches the player whole, at its `done`: so it plays straight through
# with no stall, however slow the server is today, and (at 44.1 kHz, where Piper's audio
# comes in whole render quanta) its last sample ends a render quantum.
WHOLE_BEFORE_PLAYING = """() => {
    const p = window.voxwireDemo.player;
    const play = p.play.bind(p);
    p.play = (u) => {
        // Holding the audio back means nothing plays, so playback progress would pace the
        // server to a stop: this utterance reports none, as a client without a player.
        u.played = undefined;
        const emit = u.emit.bind(u), held = [];
        u.emit = (type, v) => {
            if (type === 'audio') return held.push(v);
            if (type === 'done') for (const a of held.splice(0)) emit('audio', a);
            return emit(type, v);
        };
        return play(u);
    };
}"""


@pytest.mark.timeout(120)
def test_the_page_is_idle_once_playback_ends_at_44_1_khz(browser, piper_server):
    with demo_page(browser, piper_server.http + "/", init_script=CONTEXT_44K) as page:
        assert page.evaluate("window.voxwireDemo.player.sampleRate") == 44100
        page.evaluate(WHOLE_BEFORE_PLAYING)
        click_speak(page, TEXT)
        assert page.evaluate("document.body.dataset.state") == "speaking"
        # Read once the run's own `finished` handler has run: nothing plays or waits then.
        state = page.evaluate("""async () => {
            await window.voxwireDemo.current.finished;
            return document.body.dataset.state;
        }""")
        run = wait_played(page)
        assert run["started"]["sample_rate"] == 44100
        assert_played_all(run)
        assert run["result"]["underruns"] == 0
        assert state == "idle"


class DroppingProxy:
    """A TCP relay in front of the server that can cut every connection through it, as a
    network drop does (no close frame: the browser sees 1006), and refuse new ones."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.refuse = False
        self.accepted = 0
        self.refused = 0
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.refuse:
                self.refused += 1
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            with self._lock:
                self._socks += [client, upstream]
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def drop(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._stop.set()
        self.drop()
        self.listener.close()


@pytest.mark.timeout(120)
def test_a_connection_lost_while_idle_is_shown_at_once_and_reconnected(browser, piper_server):
    proxy = DroppingProxy(piper_server.port)
    try:
        url = f"ws://127.0.0.1:{proxy.port}/v1/stream"
        # Chromium logs each refused attempt itself: that is the test, not a page error.
        with demo_page(browser, f"{piper_server.http}/?url={url}", expected=f"WebSocket connection to '{url}' failed") as page:
            assert proxy.accepted == 1
            # What the page says at the end of the very task that learns of each close.
            page.evaluate("""() => {
                window.atClose = [];
                window.voxwireDemo.vx.on('close', () => queueMicrotask(() => window.atClose.push({
                    status: document.getElementById('status').textContent, state: document.body.dataset.state})));
            }""")
            proxy.refuse = True  # the server is away for a while: reconnecting must retry
            proxy.drop()
            page.wait_for_function("window.atClose.length >= 1", timeout=10_000)
            first = page.evaluate("window.atClose[0]")
            assert "connection lost" in first["status"] and "reconnecting" in first["status"], first
            assert first["state"] == "reconnecting", first
            page.wait_for_function("window.atClose.length >= 3", timeout=30_000)  # two attempts refused since
            assert proxy.refused >= 2
            assert all("reconnecting" in c["status"] for c in page.evaluate("window.atClose")), page.evaluate("window.atClose")
            proxy.refuse = False
            # It reconnects by itself, before anyone speaks.
            page.wait_for_selector("body[data-state=idle]", timeout=30_000)
            assert proxy.accepted == 2
            assert "connection lost" not in page.inner_text("#status")
            assert page.evaluate("window.voxwireDemo.vx.info !== null")
            click_speak(page, SHORT)
            run = wait_played(page)
            assert run["error"] is None
            assert_played_all(run)
            assert proxy.accepted == 2  # on the connection made before Speak
            assert page.is_hidden("#error")
    finally:
        proxy.close()
