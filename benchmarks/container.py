"""Voxwire's container image against ``voxwire serve`` on the same machine: start-up time
to ``/readyz`` and first audio through the socket, in the same run.

    python -m voxwire.benchmarks.container --image localhost/voxwire:latest

The image is deploy/Dockerfile's, built beforehand (deploy/README.md, "Container"). Each
round starts both servers in turn on loopback ports (the container with host networking
and a read-only root, as tests/deploy/test_container.py runs it), times each from launch
to a 200 from ``/readyz``, then the first audio of a few fresh sentences, then stops them.
The same helpers start and watch the container in that test.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import time
import uuid
from collections.abc import Sequence

from voxwire.benchmarks.process import free_port, launch_voxwire, stop, wait_http

# Debian's podman prefers crun and systemd's cgroup manager; runc and cgroupfs also work
# where there is no systemd (containers, CI machines), so they are named here.
PODMAN = ("podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs")

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Streaming speech should start at once, while the rest is still being computed.",
    "A listener should never wait for the last word before hearing the first one.",
)


class ContainerFailed(RuntimeError):
    """The container did not serve: why, with the end of its log."""


def podman(*args: str, timeout: float = 120.0, check: bool = True, input: str | None = None,
           ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout, input=input)
    if check and done.returncode != 0:
        raise ContainerFailed(f"podman {' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done


def ulimits() -> list[str]:
    """Limits a container may have here: podman's defaults (a million open files) exceed
    what an unprivileged or nested machine may grant, and runc then refuses to start."""
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 65536)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", "nproc=4096:4096"]


def start(image: str, port: int, *options: str, env: dict[str, str] | None = None) -> str:
    """Runs ``image`` detached on the host's network, serving on 127.0.0.1:port, with a
    read-only root (podman adds a tmpfs on /tmp); returns the container's name."""
    name = f"voxwire-{uuid.uuid4().hex[:8]}"
    variables = {"VOXWIRE_PORT": str(port), **(env or {})}
    podman("run", "--detach", "--name", name, "--network", "host", "--read-only", *ulimits(),
           *(arg for key, value in variables.items() for arg in ("--env", f"{key}={value}")), *options, image)
    return name


def log_tail(name: str, lines: int = 15) -> str:
    out = podman("logs", "--tail", str(lines), name, check=False)
    return (out.stdout + out.stderr).strip()


def status(name: str) -> str:
    """The container's status: "running", "stopped", "exited"..."""
    return podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()


def wait_healthy(name: str, timeout: float = 120.0) -> float:
    """Seconds until the image's own HEALTHCHECK passes (``podman healthcheck run``); a
    container that exits first, or never passes, raises ContainerFailed with its log."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if podman("healthcheck", "run", name, check=False).returncode == 0:
            return time.monotonic() - began
        if status(name) != "running":
            # Its process has ended ("stopped" until podman has cleaned up, then "exited"):
            # wait for the end of that, so that the exit code and the log are complete.
            code = podman("wait", name, check=False).stdout.strip()
            raise ContainerFailed(f"the container exited (exit code {code}) before its healthcheck passed; "
                                  f"its log ends:\n{log_tail(name)}")
        time.sleep(0.2)
    raise ContainerFailed(f"the healthcheck did not pass within {timeout:.0f} s; the log ends:\n{log_tail(name)}")


def remove(name: str) -> None:
    podman("rm", "--force", "--time", "0", name, check=False)


async def _first_audio_ms(port: int, sentences: Sequence[str], tag: str) -> list[float]:
    from voxwire_client.sync import synthesize_async

    times = []
    for text in sentences:  # a fresh text each time: no server cache answers
        result = await synthesize_async(f"{text} ({tag})", f"ws://127.0.0.1:{port}/v1/stream")
        times.append(result.ttfa_ms)
    return times


def one_round(image: str, tag: str) -> dict[str, tuple[float, list[float]]]:
    readings: dict[str, tuple[float, list[float]]] = {}
    port = free_port()
    proc = launch_voxwire(port)
    try:
        ready = wait_http(f"http://127.0.0.1:{port}/readyz", proc, interval=0.02)
        readings["voxwire serve"] = (ready, asyncio.run(_first_audio_ms(port, SENTENCES, f"n{tag}")))
    finally:
        stop(proc)
    port = free_port()
    began = time.monotonic()
    name = start(image, port)
    try:
        launched = time.monotonic() - began  # `podman run --detach` returns once the process runs
        ready = wait_http(f"http://127.0.0.1:{port}/readyz", alive=lambda: status(name) == "running",
                          interval=0.02)
        readings["container"] = (launched + ready, asyncio.run(_first_audio_ms(port, SENTENCES, f"c{tag}")))
    finally:
        remove(name)
    return readings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", required=True, help="the image to run (built from deploy/Dockerfile)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    ready: dict[str, list[float]] = {}
    first: dict[str, list[float]] = {}
    for i in range(args.rounds):
        for who, (seconds, ttfa) in one_round(args.image, f"{i}-{uuid.uuid4().hex[:6]}").items():
            ready.setdefault(who, []).append(seconds)
            first.setdefault(who, []).extend(ttfa)
    print(f"{args.rounds} rounds, {len(SENTENCES)} sentences a round")
    print(f"{'':15} {'to /readyz p50 (s)':>19} {'first audio p50 (ms)':>21}")
    for who in ready:
        print(f"{who:15} {statistics.median(ready[who]):19.2f} {statistics.median(first[who]):21.1f}")
    r = statistics.median(ready["container"]) / statistics.median(ready["voxwire serve"])
    f = statistics.median(first["container"]) / statistics.median(first["voxwire serve"])
    print(f"container / voxwire serve: start-up {r:.2f}x, first audio {f:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
