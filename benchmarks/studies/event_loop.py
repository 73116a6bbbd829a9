"""First audio under uvicorn's two event loops: uvloop and asyncio's own, same run.

    python -m voxwire.benchmarks.studies.event_loop

Two ``voxwire serve`` processes, one with uvloop hidden from it (uvicorn then falls back
to asyncio's loop), take fresh sentences in turn. Each answer gives two figures: first
audio as the client measured it, and as the server did (``done.ttfa_ms``). Their
difference is the time the event loop took to deliver what the engine had made: with
asyncio's loop every socket call releases the GIL, and the inference thread may then keep
it for a switch interval (README.md, Dependencies).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys

from voxwire.benchmarks.process import free_port, stop, wait_http

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()
WITHOUT_UVLOOP = "import sys; sys.modules['uvloop'] = None; from voxwire.cli import main; sys.exit(main(sys.argv[1:]))"


def launch(port: int, uvloop: bool) -> subprocess.Popen[bytes]:
    command = ["-m", "voxwire"] if uvloop else ["-c", WITHOUT_UVLOOP]
    return subprocess.Popen([sys.executable, *command, "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def measure(ports: dict[str, int], sentences: int) -> dict[str, tuple[list[float], list[float]]]:
    from voxwire_client.sync import synthesize_async

    figures: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in ports}
    for i in range(sentences):
        order = list(ports) if i % 2 else list(reversed(ports))  # neither always goes first
        for name in order:
            text = f"The {WORDS[i % 16]} report number {i} arrived late on {WORDS[i * 7 % 16]} day, and nobody read it."
            result = await synthesize_async(f"{text} ({name})", f"ws://127.0.0.1:{ports[name]}/v1/stream")
            figures[name][0].append(result.ttfa_ms)
            figures[name][1].append(result.done["ttfa_ms"])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=24)
    args = parser.parse_args(argv)
    ports = {"uvloop": free_port(), "asyncio": free_port()}
    procs = {name: launch(port, uvloop=name == "uvloop") for name, port in ports.items()}
    try:
        for name, proc in procs.items():
            wait_http(f"http://127.0.0.1:{ports[name]}/readyz", proc)
        figures = asyncio.run(measure(ports, args.sentences))
    finally:
        for proc in procs.values():
            stop(proc)
    print(f"first audio, p50 of {args.sentences - 2} fresh sentences (the first two are warm-up)")
    print(f"{'loop':8} {'client (ms)':>12} {'server (ms)':>12} {'difference':>11}")
    for name, (client, server) in figures.items():
        c, s = statistics.median(client[2:]), statistics.median(server[2:])
        print(f"{name:8} {c:12.1f} {s:12.1f} {c - s:11.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
