"""Voxwire behind Ray Serve's proxy against the same server direct (uvicorn), one run.

    python -m voxwire.benchmarks.studies.ray_proxy [--rounds 10] [--readers 4] [--held 64]

- TTFA at concurrency 1: one sentence, client-side (speak sent to first audio frame),
  direct and through Ray's proxy in alternating rounds; the ratio of the medians.
- Stalled readers: clients that ask for a long answer and never read (tiny receive
  buffers): with playback progress (``played: 0`` after the speak) direct and behind the
  proxy, and without it behind the proxy: the server's RSS growth per reader and, behind
  the proxy, the audio computed per reader, half-way through ``--stall-seconds`` and at
  its end.
- Streams held: ``--held`` sockets opened on one replica at once, each answered ``ready``,
  then one short utterance on each of 8 of them at once; then twice as many on two
  replicas, and how many each replica holds.

Ray runs locally with 2 CPUs, one replica of one CPU (two for the last measure); results
go to benchmarks/studies/results/ray/ as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import orjson
import websockets

from voxwire.benchmarks.machine import facts
from voxwire.benchmarks.memory import LONG_TEXT, SENTENCE, SETTINGS
from voxwire.benchmarks.process import free_port, launch_voxwire, rss_mb, stop, wait_http

RESULTS = Path(__file__).resolve().parent / "results" / "ray"
TTFA_TEXT = "The quick brown fox jumps over the lazy dog."
WINDOW_S = 3.0  # the default flow_window_seconds


async def ttfa_ms(url: str) -> float:
    async with websockets.connect(url, max_size=None) as ws:
        await ws.recv()
        start = time.perf_counter()
        await ws.send(orjson.dumps({"type": "speak", "ctx": "t", "text": TTFA_TEXT}).decode())
        first = None
        while True:
            m = await ws.recv()
            if isinstance(m, bytes) and first is None:
                first = time.perf_counter()
            elif isinstance(m, str) and orjson.loads(m)["type"] == "done":
                break
        assert first is not None
        return (first - start) * 1000


async def stalled(url: str, pid_rss, readers: int, progress: bool, seconds: float, probe=None) -> dict[str, Any]:
    """``readers`` stalled sockets; RSS (and, with ``probe``, audio computed ahead) half-way
    through ``seconds`` and at its end."""
    idle = pid_rss()
    host, port = url.split("//")[1].split("/")[0].split(":")
    sockets = []
    for i in range(readers):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        ws = await websockets.connect(url, sock=sock, max_queue=1, max_size=None)
        await ws.recv()
        await ws.send(orjson.dumps({"type": "speak", "ctx": f"s{i}", "text": LONG_TEXT, **SETTINGS}).decode())
        if progress:
            await ws.send(orjson.dumps({"type": "progress", "ctx": f"s{i}", "played": 0}).decode())
        sockets.append(ws)
    out: dict[str, Any] = {"readers": readers, "progress": progress, "idle_rss_mb": round(idle, 1)}
    for at in (round(seconds / 2), round(seconds)):
        await asyncio.sleep(seconds / 2)
        out[f"rss_mb_at_{at}s"] = round(pid_rss(), 1)
        out[f"per_reader_mb_at_{at}s"] = round((pid_rss() - idle) / readers, 2)
        if probe is not None:
            p = await probe()
            rate = p["engine_rate"]
            ahead = [u["produced_samples"] / rate for u in p["utterances"]]
            out[f"computed_s_per_reader_at_{at}s"] = round(statistics.mean(ahead), 2) if ahead else 0.0
    for ws in sockets:
        ws.transport.abort()
    await asyncio.sleep(3)
    return out


async def held(url: str, count: int, probe=None, replicas: int = 1) -> dict[str, Any]:
    """``count`` sockets held at once, every one answered ``ready``; then one short
    utterance on each of 8 of them at once. With ``probe``, the sockets each replica holds
    (a handle's call reaches a replica of Ray's choosing: asked until all have answered)."""
    sockets = []
    for _ in range(count):
        ws = await websockets.connect(url, max_size=None)
        assert orjson.loads(await ws.recv())["type"] == "ready"
        sockets.append(ws)

    async def one(ws) -> float:
        start = time.perf_counter()
        await ws.send(orjson.dumps({"type": "speak", "ctx": "h", "text": SENTENCE}).decode())
        while not (isinstance(m := await ws.recv(), str) and orjson.loads(m)["type"] == "done"):
            pass
        return time.perf_counter() - start

    by_replica: dict[str, int] = {}
    for _ in range(50 if probe is not None else 0):
        state = await probe()
        by_replica[state["replica"]] = state["connections"]
        if len(by_replica) == replicas:
            break
    took = await asyncio.gather(*(one(ws) for ws in sockets[:8]))
    for ws in sockets:
        await ws.close()
    out = {"held": count, "all_ready": True, "speaking_at_once": 8, "slowest_utterance_s": round(max(took), 2)}
    if by_replica:
        out["sockets_by_replica"] = sorted(by_replica.values())
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    from voxwire.server.ray_app import Voxwire

    direct_port, ray_port = free_port(), free_port()
    direct = launch_voxwire(direct_port, "--cache-mb", "0")  # loads while Ray starts
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024**2, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": ray_port})
        app = Voxwire.options(num_replicas=1, ray_actor_options={"num_cpus": 1}, max_ongoing_requests=args.held + 8)
        serve.run(app.bind({"engine": "piper", "cache_mb": 0}), name="bench", route_prefix="/")
        handle = serve.get_app_handle("bench")
        wait_http(f"http://127.0.0.1:{direct_port}/readyz", direct, timeout=600)

        async def probe() -> dict[str, Any]:
            return await handle.probe.remote()

        replica_pid = (await probe())["pid"]
        urls = {"direct": f"ws://127.0.0.1:{direct_port}/v1/stream", "ray": f"ws://127.0.0.1:{ray_port}/v1/stream"}
        for url in urls.values():  # warm-up
            await ttfa_ms(url)
        ttfa: dict[str, list[float]] = {"direct": [], "ray": []}
        for _ in range(args.rounds):
            for name, url in urls.items():
                ttfa[name].append(await ttfa_ms(url))
        medians = {k: statistics.median(v) for k, v in ttfa.items()}
        t = args.stall_seconds
        result: dict[str, Any] = {
            "command": "python -m voxwire.benchmarks.studies.ray_proxy " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
            "machine": facts(),
            "ray": ray.__version__,
            "ttfa_ms": {k: {"median": round(m, 1), "all": [round(x, 1) for x in ttfa[k]]} for k, m in medians.items()},
            "ttfa_ratio_ray_over_direct": round(medians["ray"] / medians["direct"], 3),
            "stalled": {
                "direct_progress": await stalled(urls["direct"], lambda: rss_mb(direct.pid), args.readers, True, t),
                "ray_progress": await stalled(urls["ray"], lambda: rss_mb(replica_pid), args.readers, True, t, probe),
                "ray_no_progress": await stalled(urls["ray"], lambda: rss_mb(replica_pid), args.readers, False, t, probe),
            },
            "window_s": WINDOW_S,
        }
        if args.held:
            result["held_one_replica"] = await held(urls["ray"], args.held)
            # Two replicas of one CPU each, on the same 2 CPUs: twice the sockets.
            serve.run(app.options(num_replicas=2).bind({"engine": "piper", "cache_mb": 0}), name="bench", route_prefix="/")
            result["held_two_replicas"] = await held(urls["ray"], 2 * args.held, probe, replicas=2)
        return result
    finally:
        serve.shutdown()
        ray.shutdown()
        stop(direct)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--held", type=int, default=64, help="sockets held on one replica (0: skip)")
    parser.add_argument("--stall-seconds", type=float, default=80.0)
    args = parser.parse_args()
    result = asyncio.run(main(args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"ray_proxy-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    cli()
