"""``voxwire bench --url`` against servers it did not start, on loopback: one it cannot
reach (a closed port, a wrong path), one that answers every utterance with an error, and
one that describes itself. No timing is checked here."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import numpy as np
import pytest

from voxwire.benchmarks.bench import VOXWIRE, VOXWIRE_OPENAI, VOXWIRE_WYOMING, main, row_name
from voxwire.benchmarks.probe import ServerFacts, probe
from voxwire.benchmarks.protocols import Target, kind_of
from voxwire.engine.base import SynthesisParams
from voxwire.server.config import ServerConfig
from tests.conftest import RunningServer, run_server
from tests.fixtures.engines import ToneEngine


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound and not listening, for the whole test: every connection to it
    is refused, and nothing else can take it meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.mark.parametrize("url", ["ws://127.0.0.1:{port}/v1/stream", "http://127.0.0.1:{port}/v1/audio/speech",
                                 "tcp://127.0.0.1:{port}", "http://127.0.0.1:{port}/synthesize"])
def test_a_closed_port_is_one_line_saying_the_server_cannot_be_reached(closed_port, tmp_path, capsys, url):
    url = url.format(port=closed_port)
    assert main(["--tiny", "--url", url, "--out", str(tmp_path / "out")]) == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"voxwire bench: cannot reach the server at {url}: Connection refused"]
    assert out == "" and not (tmp_path / "out").exists()  # no phase was run


@pytest.fixture(scope="module")
def tone_server() -> Iterator[RunningServer]:
    """Voxwire's three doors on the scripted tone engine, its cache off."""
    with run_server(ServerConfig(cache_mb=0, wyoming_port=0), engine=ToneEngine) as s:
        yield s


def wyoming_url(server: RunningServer) -> str:
    return f"tcp://127.0.0.1:{server.service.doors['wyoming'].port}"


def test_a_wrong_path_on_a_live_server_cannot_be_reached(tone_server, tmp_path, capsys):
    url = f"ws://127.0.0.1:{tone_server.port}/v1/nowhere"
    assert main(["--tiny", "--url", url, "--out", str(tmp_path / "out")]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"voxwire bench: cannot reach the server at {url}: ") and "404" in line, line


class FailingEngine(ToneEngine):
    """Loads and warms up, then fails every utterance."""

    def warmup(self) -> None:
        pass

    def synthesize(self, text: str, params: SynthesisParams) -> Iterator[np.ndarray]:
        raise RuntimeError("this engine fails every utterance")


@pytest.mark.slow  # the bench end to end, Whisper included
@pytest.mark.timeout(300)
def test_a_server_that_fails_every_utterance_gets_a_report_that_says_so(tmp_path):
    with run_server(ServerConfig(cache_mb=0), engine=FailingEngine) as s:
        assert main(["--tiny", "--url", s.ws, "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "results.json").read_text())
    single = r["servers"][VOXWIRE]["single"]
    assert single["utterances"] > 0 and single["errors"] == single["utterances"]
    (code,) = single["error_codes"]
    md = (tmp_path / "report.md").read_text()
    top = md.split("Command:")[0]
    assert f"No successful answer from {VOXWIRE} in any phase" in top and code in top, top
    # Every plot is drawn, saying there was nothing to draw rather than failing.
    for png in ("concurrency.png", "servers.png", "length.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # What a listener heard: nothing, which is no word error rate.
    assert f"| {VOXWIRE} | 2 | n/a |" in md


@pytest.mark.parametrize("door, name, said", [
    ("ws", VOXWIRE, ServerFacts(server="Voxwire", engine="tone", precision="fp32", said_by="its ready message")),
    ("openai", VOXWIRE_OPENAI, ServerFacts(server="Voxwire", engine="tone", precision="fp32", device="cpu",
                                           said_by="GET /readyz")),
])
def test_voxwire_says_its_engine_and_precision(tone_server, door, name, said):
    url = tone_server.ws if door == "ws" else f"{tone_server.http}/v1/audio/speech"
    facts = asyncio.run(probe(Target("", url)))
    assert facts == said
    assert row_name(kind_of(url), facts) == name


def test_over_wyoming_voxwire_names_itself_and_not_its_precision(tone_server):
    """Wyoming's info has no word for precision: it stays unsaid, never guessed."""
    facts = asyncio.run(probe(Target("", wyoming_url(tone_server))))
    assert (facts.server, facts.precision, facts.engine, facts.said_by) == ("voxwire", None, None, "Wyoming info")
    assert "tone" in (facts.description or "")
    assert row_name("wyoming", facts) == VOXWIRE_WYOMING


def test_other_servers_are_named_as_they_say_or_by_their_protocol():
    assert row_name("wyoming", ServerFacts(server="piper")) == "piper (Wyoming)"
    assert row_name("piper_http", ServerFacts(server="Piper HTTP")) == "Piper HTTP"
    assert row_name("openai", ServerFacts()) == "OpenAI-compatible server"


@pytest.mark.slow  # the bench end to end, Whisper included
@pytest.mark.timeout(300)
def test_a_url_report_names_the_server_with_its_engine_and_precision(tone_server, tmp_path):
    assert main(["--tiny", "--url", tone_server.ws, "--out", str(tmp_path), "--no-plots"]) == 0
    r = json.loads((tmp_path / "results.json").read_text())
    assert list(r["servers"]) == [VOXWIRE]
    row = r["servers"][VOXWIRE]
    assert (row["engine"], row["precision"], row["said_by"]) == ("tone", "fp32", "its ready message")
    assert (r["config"]["engine"], r["config"]["precision"]) == ("tone", "fp32")
    md = (tmp_path / "report.md").read_text()
    assert f"| {VOXWIRE} | v1 | fp32 |" in md
    assert (f"Server: {tone_server.ws}: Voxwire, engine tone, precision fp32, as its ready message says; "
            "device not said") in md


@pytest.mark.parametrize("door", ["ws", "openai", "wyoming"])
def test_the_voice_asked_for_reaches_the_server_on_every_protocol(tone_server, door):
    """``--voice``: each utterance names it, so a voice the server lacks is every
    utterance's error, and one it has is spoken (OpenAI's route is sent alloy otherwise)."""
    from voxwire.benchmarks.protocols import Opener

    url = {"ws": tone_server.ws, "openai": f"{tone_server.http}/v1/audio/speech",
           "wyoming": wyoming_url(tone_server)}[door]

    async def speak(voice: str | None):
        opener = Opener(Target("t", url, voice=voice))
        await opener.prepare()
        session = opener.session()
        try:
            return await session.speak("One voice, asked for by name.")
        finally:
            await session.close()

    spoken, refused = asyncio.run(speak("tone")), asyncio.run(speak("nobody"))
    assert spoken.error is None and spoken.audio_ms > 0
    assert refused.error is not None and refused.audio_ms == 0, refused
