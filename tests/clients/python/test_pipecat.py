"""VoxwireTTSService (voxwire_client/pipecat.py) in real Pipecat pipelines against the real
server (Piper) on loopback: speech and timed words from a TTSSpeakFrame and from an LLM's
streamed tokens (on Kokoro too, in a voice of its own), a barge-in, a dropped connection and a crash mid-turn (what reaches the
assistant's context), an outage longer than Pipecat's reconnecting (a server process
killed and started again), many turns on one socket, server errors, an unknown voice set
while running, and a refused API key; and a multi-speaker voice's speaker, set and
changed while running, and an unknown one (the scripted tone engine)."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from pathlib import Path

import numpy as np
import pytest
import websockets

pytest.importorskip("pipecat", reason="the client's pipecat extra (make test installs it)")

from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    MetricsFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
    TTSUpdateSettingsFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData, TTSUsageMetricsData
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMAssistantAggregator
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.tests.utils import run_test
from pipecat.utils.errors import ErrorCategory
from pipecat.workers.runner import WorkerRunner

from voxwire.server.config import AuthConfig, ServerConfig
from tests.conftest import free_port, run_server
from tests.fixtures.engines import WORD_SECONDS, ToneEngine, dominant_pitches, speaker_pitch
from tests.server.test_stream import ONE_LONG_SENTENCE, SENTENCE, SEVERAL, assert_speech
from voxwire_client.pipecat import VoxwireTTSService

SPEECH_FRAMES = (TTSStartedFrame, TTSAudioRawFrame, TTSTextFrame, TTSStoppedFrame)


TEN_WORDS = "/wˈʌn tˈuː θɹˈiː fˈɔːɹ fˈaɪv sˈɪks sˈɛvən ˈeɪt nˈaɪn tˈɛn/"
"""A lexicon's phonemes for ten words: a word said as these lasts seconds."""


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def llm_turn(text: str) -> list[Frame]:
    """An LLM's answer as Pipecat delivers it: one frame per token."""
    tokens = re.findall(r"\s*\S+", text)
    return [LLMFullResponseStartFrame(), *(LLMTextFrame(t) for t in tokens), LLMFullResponseEndFrame()]


def errors(frames: list[Frame]) -> list[ErrorFrame]:
    return [f for f in frames if isinstance(f, ErrorFrame)]


def assert_spoken(frames: list[Frame], text: str, rate: int) -> str:
    """One context, started and stopped, whose audio at ``rate`` is speech of the text's
    length and whose words come one by one, in order, at increasing times. Returns its id."""
    turn = [f for f in frames if isinstance(f, SPEECH_FRAMES)]
    assert isinstance(turn[0], TTSStartedFrame) and isinstance(turn[-1], TTSStoppedFrame), turn
    ctx = turn[0].context_id
    assert ctx and all(f.context_id == ctx for f in turn)
    audio = [f for f in turn if isinstance(f, TTSAudioRawFrame)]
    assert audio and {(f.sample_rate, f.num_channels) for f in audio} == {(rate, 1)}
    samples = np.frombuffer(b"".join(f.audio for f in audio), dtype="<i2").astype(np.float32) / 32768
    assert_speech(samples, rate, words=len(words(text)))
    timed = [f for f in turn if isinstance(f, TTSTextFrame)]
    assert [w for f in timed for w in words(f.text)] == words(text)
    assert len(timed) == len(words(text))  # one frame a word: timed by the server, not guessed at the end
    times = [f.pts for f in timed]
    assert all(times) and all(a < b for a, b in zip(times, times[1:]))
    # The words span the audio, as the server timed them: not bunched up, not beyond its end.
    seconds = samples.size / rate
    assert 0.5 * seconds < (times[-1] - times[0]) / 1e9 < seconds
    return ctx


class Recorder(FrameProcessor):
    """Passes every frame on and keeps it, with its direction."""

    def __init__(self) -> None:
        super().__init__(enable_direct_mode=True)
        self.frames: list[tuple[Frame, FrameDirection]] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append((frame, direction))
        await self.push_frame(frame, direction)

    def seen(self, direction: FrameDirection = FrameDirection.DOWNSTREAM) -> list[Frame]:
        return [f for f, d in self.frames if d is direction]


async def until(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@asynccontextmanager
async def running(
    tts: VoxwireTTSService, rate: int = 16000, *after: FrameProcessor
) -> AsyncIterator[tuple[PipelineWorker, Recorder, Recorder]]:
    """A live pipeline ``[up, tts, down, *after]``: the test queues frames and watches both
    ends (errors travel upstream), where run_test would only show them once it has ended."""
    up, down = Recorder(), Recorder()
    worker = PipelineWorker(
        Pipeline([up, tts, down, *after]), params=PipelineParams(audio_out_sample_rate=rate),
        cancel_on_idle_timeout=False,
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def on_started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(started.wait(), 30)
        yield worker, up, down
    finally:
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(run, 30)


def stops(down: Recorder) -> int:
    return sum(isinstance(f, TTSStoppedFrame) for f in down.seen())


def count_connects(tts: VoxwireTTSService) -> list[int]:
    connects = [0]

    @tts.event_handler("on_connected")
    async def on_connected(tts: VoxwireTTSService) -> None:
        connects[0] += 1

    return connects


# -- speech, words and their times ------------------------------------------------------


@pytest.mark.parametrize("rate", [16000, 24000])
async def test_a_speak_frame_is_spoken_at_the_pipelines_rate_with_timed_words(piper_server, rate):
    down, up = await run_test(
        VoxwireTTSService(url=piper_server.ws),
        frames_to_send=[TTSSpeakFrame(SENTENCE)],
        pipeline_params=PipelineParams(audio_out_sample_rate=rate),
        start_timeout=30,
    )
    assert not errors(up)
    assert_spoken(down, SENTENCE, rate)


@pytest.mark.parametrize("rate", [16000, 24000])
async def test_an_llms_tokens_are_spoken_as_they_stream_with_metrics(piper_server, rate):
    down, up = await run_test(
        VoxwireTTSService(url=piper_server.ws),
        frames_to_send=llm_turn(SEVERAL),
        pipeline_params=PipelineParams(audio_out_sample_rate=rate, enable_metrics=True, enable_usage_metrics=True),
        start_timeout=30,
    )
    assert not errors(up)
    assert_spoken(down, SEVERAL, rate)
    # The response's end comes after its speech, as the assistant's context aggregator needs.
    assert isinstance(down[-1], LLMFullResponseEndFrame)
    metrics = [d for f in down if isinstance(f, MetricsFrame) for d in f.data if d.processor.startswith("Voxwire")]
    # (The pipeline's first MetricsFrame holds zeros for every processor.)
    [ttfb] = [d.value for d in metrics if isinstance(d, TTFBMetricsData) and d.value > 0]
    assert ttfb < 10  # from the first token to the first audio
    assert [d.value for d in metrics if isinstance(d, TTSUsageMetricsData)] == [len(SEVERAL)]


async def test_a_kokoro_voice_speaks_an_llms_tokens_with_timed_words(kokoro_server):
    """The Kokoro engine through the service: a voice of its own by name, streamed text,
    its 24 kHz audio at the pipeline's rate, and a word frame for each word at its time."""
    down, up = await run_test(
        VoxwireTTSService(url=kokoro_server.ws, settings=VoxwireTTSService.Settings(voice="jm_kumo")),
        frames_to_send=llm_turn(SEVERAL),
        pipeline_params=PipelineParams(audio_out_sample_rate=24000),
        start_timeout=30,
    )
    assert not errors(up)
    assert_spoken(down, SEVERAL, 24000)


async def test_a_lexicon_says_a_word_its_way_and_the_word_frames_keep_it_as_written(piper_server):
    text = "I use Postgres daily."

    async def turn(lexicon: dict[str, str] | None) -> tuple[float, list[str]]:
        down, up = await run_test(
            VoxwireTTSService(url=piper_server.ws, settings=VoxwireTTSService.Settings(lexicon=lexicon)),
            frames_to_send=[TTSSpeakFrame(text)], pipeline_params=PipelineParams(audio_out_sample_rate=24000),
            start_timeout=30,
        )
        assert not errors(up)
        audio = sum(len(f.audio) for f in down if isinstance(f, TTSAudioRawFrame)) / 2 / 24000
        return audio, [f.text for f in down if isinstance(f, TTSTextFrame)]

    plain, plain_words = await turn(None)
    said, said_words = await turn({"postgres": TEN_WORDS})
    assert said_words == plain_words == ["I", "use", "Postgres", "daily"]
    assert said > plain + 1.5  # nine more words heard


# -- many turns, one socket -------------------------------------------------------------


async def test_turns_share_one_socket(piper_server):
    admission = piper_server.service.admission
    await until(lambda: admission.connections == 0, "earlier tests' sockets to close")
    tts = VoxwireTTSService(url=piper_server.ws)
    connects = count_connects(tts)
    async with running(tts) as (worker, up, down):
        texts = ["Good morning.", "How can I help you today?", "Goodbye for now."]
        for i, text in enumerate(texts):
            await worker.queue_frames([TTSSpeakFrame(text)] if i % 2 == 0 else llm_turn(text))
            await until(lambda: stops(down) == i + 1, "the turn")
            assert admission.connections == 1
        assert connects == [1] and not errors(up.seen(FrameDirection.UPSTREAM))
    ends = [f for f in down.seen() if isinstance(f, TTSStoppedFrame)]
    assert len({f.context_id for f in ends}) == 3  # one utterance each


# -- barge-in ---------------------------------------------------------------------------


async def test_an_interruption_cancels_the_utterance_on_the_server(piper_server):
    worker_stats, service = piper_server.service.worker.stats, piper_server.service
    closed_before = worker_stats.streams_closed
    async with running(VoxwireTTSService(url=piper_server.ws)) as (worker, up, down):
        # Three long sentences, a minute of speech: the engine is inside one when the cancel comes.
        await worker.queue_frame(TTSSpeakFrame(" ".join([ONE_LONG_SENTENCE] * 3)))
        await until(lambda: any(isinstance(f, TTSAudioRawFrame) for f in down.seen()), "the first audio")
        ctx = next(f for f in down.seen() if isinstance(f, TTSStartedFrame)).context_id
        await worker.queue_frame(InterruptionFrame())
        await until(lambda: any(isinstance(f, InterruptionFrame) for f in down.seen()), "the interruption")
        # The server stopped computing: the engine's stream was closed, its slot given back.
        await until(lambda: service.worker.active == 0 and service.admission.utterances == 0, "the server to let go")
        assert worker_stats.streams_closed > closed_before
        await asyncio.sleep(0.5)  # time for any straggler to show
        seen = down.seen()
        cut = next(i for i, f in enumerate(seen) if isinstance(f, InterruptionFrame))
        assert not [f for f in seen[cut:] if isinstance(f, TTSAudioRawFrame) and f.context_id == ctx]
        heard = sum(len(f.audio) for f in seen[:cut] if isinstance(f, TTSAudioRawFrame)) / 2 / 16000
        assert heard < 10  # cut short
        # The service goes on: the next turn is spoken in full.
        stopped = stops(down)
        await worker.queue_frame(TTSSpeakFrame(SENTENCE))
        await until(lambda: stops(down) == stopped + 1, "the next turn")
        assert assert_spoken(down.seen()[cut + 1 :], SENTENCE, 16000) != ctx
        assert not errors(up.seen(FrameDirection.UPSTREAM))


async def test_first_clause_words_lets_a_clause_speak_before_its_sentence_ends(piper_server):
    # "Well," alone is a clause of one word: with first_clause_words 1 the server speaks
    # it while the LLM is still writing the sentence.
    tts = VoxwireTTSService(url=piper_server.ws, settings=VoxwireTTSService.Settings(first_clause_words=1))
    async with running(tts) as (worker, up, down):
        await worker.queue_frames([LLMFullResponseStartFrame(), LLMTextFrame("Well"), LLMTextFrame(","),
                                   LLMTextFrame(" I think")])
        await until(lambda: any(isinstance(f, TTSAudioRawFrame) for f in down.seen()), "the clause's audio")
        await worker.queue_frames([LLMTextFrame(" so."), LLMFullResponseEndFrame()])
        await until(lambda: stops(down) == 1, "the turn")
        assert not errors(up.seen(FrameDirection.UPSTREAM))


# -- a dropped connection ---------------------------------------------------------------


class Proxy:
    """A TCP proxy on loopback in front of the server, whose connections can be cut."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = ""
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Proxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"ws://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1/stream"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()

    def cut(self) -> None:
        """Drop every connection at once, as a dead network path would (no close handshake)."""
        for w in self._writers:
            w.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def test_a_dropped_connection_fails_the_turn_and_the_next_turn_reconnects(piper_server):
    async with Proxy(piper_server.port) as proxy:
        tts = VoxwireTTSService(url=proxy.url)
        connects = count_connects(tts)
        async with running(tts) as (worker, up, down):
            await worker.queue_frame(TTSSpeakFrame(ONE_LONG_SENTENCE))
            await until(lambda: any(isinstance(f, TTSAudioRawFrame) for f in down.seen()), "the first audio")
            proxy.cut()
            await until(lambda: errors(up.seen(FrameDirection.UPSTREAM)), "the turn's error")
            assert "lost its connection" in errors(up.seen(FrameDirection.UPSTREAM))[0].error
            await until(lambda: stops(down) == 1, "the failed turn to stop")
            failed = len(down.seen())
            await worker.queue_frame(TTSSpeakFrame(SENTENCE))
            await until(lambda: stops(down) == 2, "the next turn")
            assert_spoken(down.seen()[failed:], SENTENCE, 16000)
            assert connects == [2] and len(errors(up.seen(FrameDirection.UPSTREAM))) == 1


def spoken_words(frames: list[Frame], ctx: str) -> list[str]:
    return [w for f in frames if isinstance(f, TTSTextFrame) and f.context_id == ctx for w in words(f.text)]


def audio_seconds(frames: list[Frame], ctx: str, rate: int = 16000) -> float:
    return sum(len(f.audio) for f in frames if isinstance(f, TTSAudioRawFrame) and f.context_id == ctx) / 2 / rate


ANSWER = (
    "Sure, the museum opens at nine in the morning, and the guided tours of the old town start at ten "
    "from the front steps, where a guide with a yellow umbrella waits for the group. Tickets cost twelve "
    "dollars for adults and six for children, and you can buy them at the door or online before you come."
)


async def test_after_a_crash_mid_turn_the_context_holds_only_what_was_heard(piper_server):
    # The trial: the server was killed 0.3 s after the first audio. 1.53 s of audio and
    # six timed words had come; 5.8 s later TTSTextFrames came for the rest of the answer,
    # never heard, one clause was in neither, and an ErrorFrame said the context had
    # "completed with no audio". Here the connection drops the same way (no close frame)
    # while the LLM is still streaming the answer, and the assistant's context is read.
    context = LLMContext()
    async with Proxy(piper_server.port) as proxy:
        tts = VoxwireTTSService(url=proxy.url)
        async with running(tts, 16000, LLMAssistantAggregator(context)) as (worker, up, down):
            frames = llm_turn(ANSWER)

            async def llm() -> None:
                for frame in frames:
                    await worker.queue_frame(frame)
                    await asyncio.sleep(0.05)  # 20 tokens a second

            producer = asyncio.create_task(llm())
            await until(lambda: any(isinstance(f, TTSAudioRawFrame) for f in down.seen()), "the first audio")
            await asyncio.sleep(0.3)
            proxy.cut()
            await producer
            await until(lambda: any(isinstance(f, LLMFullResponseEndFrame) for f in down.seen()), "the turn's end")
            await until(lambda: context.get_messages(), "the assistant's message")
            await asyncio.sleep(1)  # time for anything still to come
            ctx = next(f for f in down.seen() if isinstance(f, TTSStartedFrame)).context_id
            heard, said = audio_seconds(down.seen(), ctx), spoken_words(down.seen(), ctx)
            [error] = errors(up.seen(FrameDirection.UPSTREAM))  # and no "completed with no audio"
            [message] = context.get_messages()
            # The next turn speaks (through the same proxy, reconnected).
            failed = len(down.seen())
            await worker.queue_frame(TTSSpeakFrame(SENTENCE))
            await until(lambda: stops(down) == 2, "the next turn")
            assert_spoken(down.seen()[failed:], SENTENCE, 16000)
    # What was heard, every word of it and nothing else: the first words of the answer,
    # as many as its audio can hold (Piper speaks about three words a second).
    assert 0 < heard < 10 and said == words(ANSWER)[: len(said)] and 1 <= len(said) <= 5 * heard + 1
    assert message["role"] == "assistant" and words(message["content"]) == said
    # The error says what happened (it read "connection closed (None): ").
    assert "lost its connection mid-utterance" in error.error and "connection lost" in error.error
    assert error.category is ErrorCategory.CONNECTIVITY


# -- an outage longer than Pipecat's reconnecting: a server killed and started again ------

SERVE_TONES = """
import sys
import uvicorn
from voxwire.engine.worker import Worker
from voxwire.server.app import create_app
from voxwire.server.config import ServerConfig
from voxwire.server.sockets import listening_socket
from tests.fixtures.engines import ToneEngine

app = create_app(ServerConfig(cache_mb=0), lambda: Worker(ToneEngine))
sock = listening_socket("127.0.0.1", int(sys.argv[1]))
uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on")).run(sockets=[sock])
"""


@contextmanager
def tone_server_process(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """The real server (tone engine) in a process of its own on ``port``, to be killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_TONES, str(port)], cwd=Path(__file__).resolve().parents[3],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(30)


async def listening(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120  # importing the server on a busy 2-core machine
    while True:
        assert proc.poll() is None, "the server process died"
        try:
            async with websockets.connect(url) as ws:
                await ws.recv()
                return
        except OSError:
            assert time.monotonic() < deadline, "the server did not start"
            await asyncio.sleep(0.1)


@pytest.mark.slow  # server processes of their own
async def test_the_next_turn_after_an_outage_longer_than_the_reconnect_window_speaks():
    # The trial: the server was killed mid-turn and started again 20 s later. Pipecat tried
    # three times (0, 4 and 8 s), gave up, and marked the service unusable; every later
    # turn was silent, with no ErrorFrame. Here the backoff is short (three tries within
    # about 1.5 s) and the outage is longer than all of it.
    port = free_port()
    url = f"ws://127.0.0.1:{port}/v1/stream"
    tts = VoxwireTTSService(url=url, reconnect_backoff_min_wait=0.2, reconnect_backoff_max_wait=0.5)
    usable: list[bool] = []

    @tts.event_handler("on_usable_changed")
    async def on_usable_changed(tts: VoxwireTTSService, is_usable: bool) -> None:
        usable.append(is_usable)

    with tone_server_process(port) as first, ExitStack() as later:
        await listening(url, first)
        async with running(tts) as (worker, up, down):
            await worker.queue_frame(TTSSpeakFrame("one two three."))
            await until(lambda: stops(down) == 1, "the first turn")
            first.send_signal(signal.SIGKILL)
            first.wait(30)
            await until(lambda: usable == [False], "Pipecat to give up", timeout=30)
            gave_up = errors(up.seen(FrameDirection.UPSTREAM))
            assert "failed to reconnect after 3 attempts" in gave_up[-1].error
            # A turn while the server is down: it cannot speak, and it says so.
            down_from = len(down.seen())
            await worker.queue_frame(TTSSpeakFrame("nobody hears this."))
            await until(lambda: len(errors(up.seen(FrameDirection.UPSTREAM))) > len(gave_up), "the turn's error")
            unspoken = errors(up.seen(FrameDirection.UPSTREAM))[-1]
            assert "did not speak this turn" in unspoken.error
            assert unspoken.category is ErrorCategory.CONNECTIVITY
            await until(lambda: stops(down) == 2, "the unspoken turn to end")
            assert not [f for f in down.seen()[down_from:] if isinstance(f, TTSAudioRawFrame)]
            # The server is back, on the same port: the next turn speaks.
            second = later.enter_context(tone_server_process(port))
            await listening(url, second)
            back_from = len(down.seen())
            await worker.queue_frame(TTSSpeakFrame("four five six."))
            await until(lambda: stops(down) == 3, "the turn after the outage", timeout=30)
            assert [f for f in down.seen()[back_from:] if isinstance(f, TTSAudioRawFrame)]
            assert usable == [False, True] and tts.is_usable


# -- errors -----------------------------------------------------------------------------


async def test_a_server_error_is_an_error_frame_naming_its_code_and_every_turn_says_so(piper_server):
    # A voice the server never spoke with, from the start: a setting to fix. The service
    # is unusable (Pipecat's verdict on a refused request) until the settings change, and
    # each turn says it was not spoken, rather than the silence of the trial.
    tts = VoxwireTTSService(url=piper_server.ws, settings=VoxwireTTSService.Settings(voice="nobody"))
    async with running(tts) as (worker, up, down):
        for turn in (1, 2):
            await worker.queue_frame(TTSSpeakFrame(SENTENCE))
            await until(lambda: stops(down) == turn and len(errors(up.seen(FrameDirection.UPSTREAM))) == turn, "turn")
        await asyncio.sleep(0.5)  # time for anything more to show
        [error, turn_error] = errors(up.seen(FrameDirection.UPSTREAM))
    assert "unknown_voice" in error.error and error.category is ErrorCategory.INVALID_REQUEST
    assert "did not speak this turn" in turn_error.error and "unknown_voice" in turn_error.error
    assert turn_error.category is ErrorCategory.INVALID_REQUEST and not tts.is_usable
    assert not [f for f in down.seen() if isinstance(f, TTSAudioRawFrame)]
    assert isinstance([f for f in down.seen() if isinstance(f, SPEECH_FRAMES)][-1], TTSStoppedFrame)


async def test_an_unknown_voice_set_while_running_falls_back_to_the_last_voice_spoken(piper_server):
    # The trial: TTSUpdateSettingsFrame(voice="amy") gave an ErrorFrame unknown_voice, and
    # the next turn was silent with no error at all.
    tts = VoxwireTTSService(url=piper_server.ws)
    async with running(tts) as (worker, up, down):
        await worker.queue_frame(TTSSpeakFrame(SENTENCE))
        await until(lambda: stops(down) == 1, "the first turn")
        await worker.queue_frame(TTSUpdateSettingsFrame(delta=VoxwireTTSService.Settings(voice="amy")))
        turns = ["Good morning, how can I help you today?", SEVERAL]
        for i, text in enumerate(turns):
            before = len(down.seen())
            await worker.queue_frames(llm_turn(text) if i == 0 else [TTSSpeakFrame(text)])
            await until(lambda: stops(down) == i + 2, "the turn")
            assert_spoken(down.seen()[before:], text, 16000)  # in the last voice that was spoken
        [error] = errors(up.seen(FrameDirection.UPSTREAM))  # once, for the turn that met it
        assert "unknown_voice" in error.error and "'amy'" in error.error and "'joe'" in error.error
        assert error.category is ErrorCategory.APPLICATION and tts.is_usable
        assert tts.settings.voice == "joe"
        # Nothing was left open on the server by the refused opening's following text.
        await until(lambda: piper_server.service.admission.utterances == 0, "the server to hold nothing")


@pytest.fixture(scope="module")
def locked():
    with run_server(ServerConfig(auth=AuthConfig(api_keys=("k1",))), engine=ToneEngine) as s:
        yield s


@pytest.mark.slow  # about 3 s each
@pytest.mark.parametrize("key", ["wrong", None])
async def test_a_refused_api_key_is_an_authentication_error_at_once(locked, key):
    tts = VoxwireTTSService(url=locked.ws, api_key=key)
    connects = count_connects(tts)
    began = time.monotonic()
    async with running(tts) as (worker, up, down):
        await until(lambda: errors(up.seen(FrameDirection.UPSTREAM)), "the error", timeout=5)
        [error] = errors(up.seen(FrameDirection.UPSTREAM))
        assert error.category is ErrorCategory.AUTHENTICATION and "1008" in error.error
        assert time.monotonic() - began < 5 and not tts.is_usable
        # A turn after it is not spoken, nor does it try again (no reconnect loop), but it
        # says so: an ErrorFrame of its own, not silence.
        await worker.queue_frame(TTSSpeakFrame("Hello there."))
        await until(lambda: len(errors(up.seen(FrameDirection.UPSTREAM))) == 2, "the turn's error", timeout=10)
        await asyncio.sleep(1)
        [_, turn] = errors(up.seen(FrameDirection.UPSTREAM))
        assert turn.category is ErrorCategory.AUTHENTICATION and "did not speak this turn" in turn.error
        assert "1008" in turn.error and connects == [0]
        assert not [f for f in down.seen() if isinstance(f, TTSAudioRawFrame)]


async def test_the_right_api_key_speaks(locked):
    down, up = await run_test(
        VoxwireTTSService(url=locked.ws, api_key="k1"),
        frames_to_send=[TTSSpeakFrame("Hello there.")],
        start_timeout=30,
    )
    assert not errors(up) and [f for f in down if isinstance(f, TTSAudioRawFrame)]


async def test_an_engine_without_word_timings_still_gives_the_spoken_text(locked):
    # The tone engine times no words (ready.features.timestamps is false): the text that
    # was spoken still reaches the assistant's context, as text frames after its audio.
    text = "Good morning. How can I help you today?"
    down, up = await run_test(
        VoxwireTTSService(url=locked.ws, api_key="k1"), frames_to_send=llm_turn(text), start_timeout=30
    )
    assert not errors(up)
    turn = [f for f in down if isinstance(f, SPEECH_FRAMES)]
    audio = [f for f in turn if isinstance(f, TTSAudioRawFrame)]
    rate = audio[0].sample_rate
    assert sum(len(f.audio) for f in audio) // 2 == pytest.approx(len(words(text)) * WORD_SECONDS * rate, rel=0.05)
    spoken = [f for f in turn if isinstance(f, TTSTextFrame)]
    assert [w for f in spoken for w in words(f.text)] == words(text)
    assert turn.index(spoken[0]) > turn.index(audio[0])  # after the audio it names


# -- a multi-speaker voice's speaker (the tone engine's "chorus") -----------------------------


SPEAKER_TURN = "oscar papa quebec."


def spoken_by(frames: list[Frame], speaker_id: int, text: str = SPEAKER_TURN) -> bool:
    """Whether the turn's audio in ``frames`` (at 16 kHz) is ``text`` as that speaker says it."""
    pcm = b"".join(f.audio for f in frames if isinstance(f, TTSAudioRawFrame))
    audio = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768
    return dominant_pitches(audio, 16000) == pytest.approx([speaker_pitch(w, speaker_id) for w in words(text)], abs=15)


async def test_the_speaker_setting_is_spoken_and_changes_while_running(speakers_server):
    tts = VoxwireTTSService(url=speakers_server.ws, settings=VoxwireTTSService.Settings(voice="chorus", speaker="bob"))
    async with running(tts) as (worker, up, down):
        await worker.queue_frame(TTSSpeakFrame(SPEAKER_TURN))
        await until(lambda: stops(down) == 1, "the first turn")
        second = len(down.seen())
        await worker.queue_frame(TTSUpdateSettingsFrame(delta=VoxwireTTSService.Settings(speaker=2)))
        await worker.queue_frames(llm_turn(SPEAKER_TURN))
        await until(lambda: stops(down) == 2, "the second turn")
        assert not errors(up.seen(FrameDirection.UPSTREAM))
        assert spoken_by(down.seen()[:second], 1) and spoken_by(down.seen()[second:], 2)


async def test_an_unknown_speaker_set_while_running_falls_back_to_the_last_speaker_spoken(speakers_server):
    tts = VoxwireTTSService(url=speakers_server.ws, settings=VoxwireTTSService.Settings(voice="chorus", speaker="bob"))
    async with running(tts) as (worker, up, down):
        await worker.queue_frame(TTSSpeakFrame(SPEAKER_TURN))
        await until(lambda: stops(down) == 1, "the first turn")
        await worker.queue_frame(TTSUpdateSettingsFrame(delta=VoxwireTTSService.Settings(speaker="dave")))
        for turn in (2, 3):
            before = len(down.seen())
            await worker.queue_frames(llm_turn(SPEAKER_TURN) if turn == 2 else [TTSSpeakFrame(SPEAKER_TURN)])
            await until(lambda: stops(down) == turn, "the turn")
            assert spoken_by(down.seen()[before:], 1)  # by the last speaker that was spoken
        [error] = errors(up.seen(FrameDirection.UPSTREAM))  # once, for the turn that met it
        assert "unknown_speaker" in error.error and "'dave'" in error.error and "'bob'" in error.error
        assert error.category is ErrorCategory.APPLICATION and tts.is_usable
        assert tts.settings.speaker == "bob"
        await until(lambda: speakers_server.service.admission.utterances == 0, "the server to hold nothing")


async def test_an_unknown_speaker_of_a_new_voice_falls_back_to_its_default_speaker(speakers_server):
    # "bob" was spoken in "chorus"; the new voice ("tone") has one speaker: its default.
    tts = VoxwireTTSService(url=speakers_server.ws, settings=VoxwireTTSService.Settings(voice="chorus", speaker="bob"))
    async with running(tts) as (worker, up, down):
        await worker.queue_frame(TTSSpeakFrame(SPEAKER_TURN))
        await until(lambda: stops(down) == 1, "the first turn")
        await worker.queue_frame(TTSUpdateSettingsFrame(delta=VoxwireTTSService.Settings(voice="tone")))
        before = len(down.seen())
        await worker.queue_frame(TTSSpeakFrame(SPEAKER_TURN))
        await until(lambda: stops(down) == 2, "the turn")
        assert spoken_by(down.seen()[before:], 0)
        [error] = errors(up.seen(FrameDirection.UPSTREAM))
        assert "unknown_speaker" in error.error and "'tone'" in error.error and "default speaker" in error.error
        assert tts.settings.voice == "tone" and tts.settings.speaker is None


async def test_an_unknown_speaker_from_the_start_is_a_setting_to_fix(speakers_server):
    tts = VoxwireTTSService(url=speakers_server.ws, settings=VoxwireTTSService.Settings(voice="chorus", speaker="dave"))
    async with running(tts) as (worker, up, down):
        await worker.queue_frame(TTSSpeakFrame(SPEAKER_TURN))
        await until(lambda: stops(down) == 1 and errors(up.seen(FrameDirection.UPSTREAM)), "the turn")
        [error] = errors(up.seen(FrameDirection.UPSTREAM))
    assert "unknown_speaker" in error.error and error.category is ErrorCategory.INVALID_REQUEST
    assert not tts.is_usable and tts.settings.speaker == "dave"
    assert not [f for f in down.seen() if isinstance(f, TTSAudioRawFrame)]
