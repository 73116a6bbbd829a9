"""CPU thread tuning, in one place: every engine and benchmark sets its threads here.

Two defaults cost us on the CPU, and each has its function:

- torch sizes its intra-op pool (OpenMP) to every logical core. ``configure_cpu_threads``
  sets it to the physical cores this process may use, at most a few, or to an exact
  count. The count is process-wide: the last call wins.
- onnxruntime's intra-op pool spins on its cores after each run, waiting for more work,
  so whatever runs next on those cores (torch, the event loop) pays for it.
  ``onnx_session_options`` gives a session a fixed number of threads that do not spin.

Why physical cores, and a cap: SMT siblings share one core's FMA units, so they add
contention, not throughput, to the small conv-bound kernels of these models (32-768
channels, chunks of ~100 frames), and past ~4 threads synchronisation eats the gain; a cap
also leaves cores to the rest of the service (asyncio, the phonemizer, other engines).
Why ``threads=1`` on a CPU shared with other busy processes: OpenMP threads meet at a
barrier after every op, so when the OS deschedules one, all wait (measured here: 2
threads at load 10 on 2 cores took a short Piper utterance from 0.09 s to 5 s; one thread
stayed at 0.09 s).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnxruntime

DEFAULT_MAX_THREADS = 4


def physical_cores() -> int:
    """Distinct (package, core) pairs among the CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        cpus = os.sched_getaffinity(0)
    else:
        cpus = range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(base + "physical_package_id") as f1, open(base + "core_id") as f2:
                cores.add((f1.read().strip(), f2.read().strip()))
        except OSError:
            cores.add(("?", str(cpu)))
    return max(len(cores), 1)


def configure_cpu_threads(threads: int | None = None, *, max_threads: int = DEFAULT_MAX_THREADS) -> int:
    """Set torch's intra-op threads (process-wide) and return the count: ``threads`` when
    given, else the physical cores this process may use, at most ``max_threads``."""
    import torch

    if threads is not None and threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    n = threads if threads is not None else max(1, min(physical_cores(), max_threads))
    torch.set_num_threads(n)
    return n


def onnx_session_options(threads: int = 1) -> onnxruntime.SessionOptions:
    """onnxruntime session options with ``threads`` intra-op threads that do not spin
    between runs (see the module's docstring)."""
    import onnxruntime

    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options
