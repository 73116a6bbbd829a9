"""Fixtures shared by the whole suite: real servers on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests explore the same examples on every run, so CI is reproducible; run
# with HYPOTHESIS_PROFILE=explore to search afresh.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False, max_examples=5000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The worker's thread checks are on in every test (engine/worker_lock.py): a call from
# the wrong thread fails there instead of racing under load.
os.environ.setdefault("VOXWIRE_CHECK_THREADS", "1")

from voxwire.engine.base import Engine
from voxwire.engine.registry import EngineOptions
from voxwire.engine.worker import Worker
from voxwire.engine.worker_options import WorkerOptions
from voxwire.server.app import create_app
from voxwire.server.config import ServerConfig
from voxwire.server.doors import DOORS
from voxwire.server.doors.base import Door
from voxwire.server.limits import Limits
from voxwire.server.run import http_server
from voxwire.server.sockets import listening_socket
from voxwire.server.service import Service


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Loopback:
    """Something serving Voxwire's routes on a loopback port (the server, or a proxy)."""

    host: str
    port: int

    @property
    def http(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://{self.host}:{self.port}/v1/stream"


@dataclass
class RunningServer(Loopback):
    service: Service


@contextlib.contextmanager
def run_server(
    config: ServerConfig, engine: Callable[[], Engine] | None = None, doors: Sequence[type[Door]] = DOORS,
) -> Iterator[RunningServer]:
    """A real uvicorn server on 127.0.0.1, in a thread of the test process, so tests can
    read the worker's counters while talking to it over real sockets."""
    make_worker = (lambda: Worker(engine, WorkerOptions(
        max_queue_seconds=config.limits.max_queue_seconds, max_utterance_seconds=config.limits.max_utterance_seconds,
    ))) if engine else None
    app = create_app(config, make_worker, doors)
    # The socket the server makes for itself (server/run.py), with its capped send buffer.
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    # The HTTP server `voxwire serve` runs (server/run.py): its parser (h11, strict), its
    # header and body deadlines and its bound on open connections, not uvicorn's defaults.
    server = http_server(app, "127.0.0.1", port, log_level="warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(2400):  # two minutes: loading the engine on a busy 2-core machine
        if server.started or not thread.is_alive():
            break
        threading.Event().wait(0.05)
    if not server.started:
        raise RuntimeError("the test server did not start")
    try:
        yield RunningServer("127.0.0.1", port, app.state.service)
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="session")
def piper_server() -> Iterator[RunningServer]:
    """The real embedded engine (Piper, joe voice) behind a real server."""
    # No result cache here: these tests are about the engine path; tests/server/test_cache.py has its own.
    with run_server(ServerConfig(engine=EngineOptions(name="piper"), cache_mb=0)) as s:
        yield s


@pytest.fixture(scope="session")
def piper_wyoming_server() -> Iterator[RunningServer]:
    """The real embedded engine with the Wyoming door on a free port too."""
    # A step timeout well above the default: on a loaded 2-core machine one Piper step of
    # a long sentence has taken over 30 s, and a replaced worker is not what is tested.
    config = ServerConfig(engine=EngineOptions(name="piper"), cache_mb=0, wyoming_port=0, step_timeout=300)
    with run_server(config) as s:
        yield s


@pytest.fixture(scope="session")
def reference_voices(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Random-weight Piper voices made by piper-tts's own training code and export
    (tests/fixtures/piper_voices.py), by name: ``speakers`` (medium, four speakers),
    ``x_low`` (16 kHz, one speaker), ``high`` (resblock 1, four upsamplings, two
    speakers) and ``german`` (low, espeak-ng's ``de``). Each is ``NAME.onnx`` with
    ``NAME.onnx.json`` beside it, in one folder."""
    from tests.fixtures.piper_voices import make_voice

    folder = tmp_path_factory.mktemp("piper-voices")
    return {
        "speakers": make_voice(folder, "speakers", "medium", ("alice", "bob", "carol", "dave"), seed=1),
        "x_low": make_voice(folder, "x_low", "x_low", seed=2),
        "high": make_voice(folder, "high", "high", ("p225", "p226"), seed=3),
        "german": make_voice(folder, "german", "low", espeak_voice="de", seed=4),
    }


@pytest.fixture
def tone_server() -> Iterator[RunningServer]:
    """A server around the scripted tone engine, with small limits to run into."""
    from tests.fixtures.engines import ToneEngine

    limits = Limits(max_utterances_per_socket=3, max_utterances_total=6, max_text_chars=2000, max_message_bytes=16384)
    with run_server(ServerConfig(limits=limits, cache_mb=0), engine=lambda: ToneEngine(step_delay=0.01)) as s:
        yield s


@pytest.fixture(scope="module")
def speakers_server() -> Iterator[RunningServer]:
    """The tone engine with a multi-speaker voice ("chorus": alice, bob, carol; each
    speaker's pitches in a band of their own) behind every door (Wyoming too), with a
    result cache, which must never give one speaker's audio for another."""
    from tests.fixtures.engines import SpeakersToneEngine

    with run_server(ServerConfig(cache_mb=16, wyoming_port=0), engine=lambda: SpeakersToneEngine()) as s:
        yield s


@pytest.fixture(scope="session")
def kokoro_server() -> Iterator[RunningServer]:
    """Kokoro-82M (the voxwire[kokoro] wheels' int8 graph and five voices) behind a real
    server, streaming in windows, with the Wyoming door on a free port too."""
    options = EngineOptions(name="kokoro", precision="fp32", kokoro_decode="windows")
    with run_server(ServerConfig(engine=options, cache_mb=0, wyoming_port=0, step_timeout=300)) as s:
        yield s


@pytest.fixture(scope="session")
def cosyvoice_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """CosyVoice2 on a tiny random-weight model directory in the released layout."""
    from voxwire.engine.cosyvoice2.tiny import make_tiny_model_dir

    model_dir = make_tiny_model_dir(tmp_path_factory.mktemp("cv2_server"))
    options = EngineOptions(
        name="cosyvoice2", model_dir=model_dir, voices_dir=tmp_path_factory.mktemp("cv2_voices"),
        extra={"cpu_threads": 1, "seed": 0},
    )
    with run_server(ServerConfig(engine=options, cache_mb=0)) as s:
        yield s
