"""What users would run instead, started on 127.0.0.1 with the same voice file:

- Piper's own HTTP server (``python -m piper.http_server`` from piper-tts), which
  synthesises the whole text and then sends one WAV;
- wyoming-piper (Home Assistant's standard voice server), which speaks Wyoming over TCP
  and, for streamed text, sends audio sentence by sentence.

Each is launched without waiting, so that they load their models at the same time, and
:func:`ready` waits for them all.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from voxwire.benchmarks.process import free_port, stop, wait_http, wait_tcp

START_TIMEOUT_S = 600.0
SETTLE_S = 0.25
"""The pause before each measured utterance when servers take turns on one machine: a
server that has just answered keeps the CPU busy for a while (onnxruntime's threads spin
on after each run), and whoever speaks next would pay for it."""


@dataclass
class Peer:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    wait: Callable[[], None]
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def stop(self) -> None:
        stop(self.proc)
        for f in self.cleanup:
            f()


def launch_piper_http(model: Path) -> Peer:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "piper.http_server", "-m", str(model), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    return Peer("Piper HTTP", f"{base}/synthesize", proc, lambda: wait_http(f"{base}/voices", proc, START_TIMEOUT_S))


def launch_wyoming_piper(model: Path) -> Peer:
    """The voice is given as a file path, so wyoming-piper loads that file and never
    looks for (or downloads) a voice by name; its data directory stays empty."""
    port = free_port()
    data = tempfile.TemporaryDirectory(prefix="wyoming-piper-")
    proc = subprocess.Popen(
        [sys.executable, "-m", "wyoming_piper", "--voice", str(model), "--data-dir", data.name,
         "--uri", f"tcp://127.0.0.1:{port}", "--local-files-only"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    return Peer("wyoming-piper", f"tcp://127.0.0.1:{port}", proc, lambda: wait_tcp(port, proc, START_TIMEOUT_S), [data.cleanup])


def ready(peers: list[Peer]) -> None:
    """Wait for every peer; stop them all if one fails to start."""
    try:
        for p in peers:
            p.wait()
    except BaseException:
        for p in peers:
            p.stop()
        raise
