"""CPU thread tuning, in one place: every engine and benchmark sets its threads here.

Two defaults cost us on the CPU, and each has its function:

- torch sizes its intra-op pool (OpenMP) to every logical core, and neither torch nor
  ``os.cpu_count`` knows of a container's CPU quota. ``configure_cpu_threads`` sets it to
  the physical cores this process may use, no more than its quota (``usable_cores``), at
  most a few, or to an exact count. The count is process-wide: the last call wins.
- onnxruntime's intra-op pool spins on its cores after each run, waiting for more work,
  so whatever runs next on those cores (torch, the event loop) pays for it.
  ``onnx_session_options`` gives a session a fixed number of threads that do not spin.

Why physical cores, and a cap: SMT siblings share one core's FMA units, so they add
contention, not throughput, to the small conv-bound kernels of these models (32-768
channels, chunks of ~100 frames), and past ~4 threads synchronisation eats the gain; a cap
also leaves cores to the rest of the service (asyncio, the phonemizer, other engines).
Why fewer threads on a CPU shared with other busy processes: OpenMP threads meet at a
barrier after every op, so when the OS deschedules one, all wait (measured here: 2
threads at load 10 on 2 cores took a short Piper utterance from 0.09 s to 5 s; one thread
stayed at 0.09 s). Waiting passively at the barrier (OMP_WAIT_POLICY=PASSIVE) avoids the
worst of it but makes every step on a quiet machine ~40% slower. So the default count is
not fixed: ``adapt_cpu_threads``, called before each engine step, gives the pool only the
cores that other processes left idle (``AdaptiveThreads``), measured from the kernel's
CPU accounting over the last tenth of a second (``CpuShare``), and under a CPU quota no
more than the quota leaves after the other processes of its control group. An exact
``threads`` pins the count.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnxruntime

DEFAULT_MAX_THREADS = 4

log = logging.getLogger(__name__)


def _usable_cpus() -> list[int]:
    """The logical CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def physical_cores() -> int:
    """Distinct (package, core) pairs among the CPUs this process may run on."""
    cores = set()
    for cpu in _usable_cpus():
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(base + "physical_package_id") as f1, open(base + "core_id") as f2:
                cores.add((f1.read().strip(), f2.read().strip()))
        except OSError:
            cores.add(("?", str(cpu)))
    return max(len(cores), 1)


@dataclass(frozen=True)
class CpuQuota:
    """A control group's CPU quota: ``cpus`` CPUs' worth of time per period, set on
    ``group`` (its folder under the cgroup mount), shared by every process under it."""

    cpus: float
    group: Path
    v2: bool

    def used_seconds(self) -> float | None:
        """CPU seconds the group's processes have run, this one's included (cgroup v2's
        ``cpu.stat``, v1's ``cpuacct.usage`` where cpuacct is mounted with cpu); None
        where neither can be read."""
        try:
            if not self.v2:
                return int((self.group / "cpuacct.usage").read_text()) / 1e9
            for line in (self.group / "cpu.stat").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "usage_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            pass
        return None


def cpu_quota(root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPUs' worth of time per period that this process's control group may use (a
    container's ``--cpus``, a Kubernetes CPU limit, systemd's ``CPUQuota=``), the
    tightest on its path; None where none is set or none can be read."""
    limit = cpu_limit(root, membership)
    return None if limit is None else limit.cpus


def cpu_limit(root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")) -> CpuQuota | None:
    """The tightest CPU quota on this process's control group's path, and the group it
    is set on (``cpu_quota``); None where none is set or none can be read."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return None
    limits: list[CpuQuota] = []
    for line in lines:
        fields = line.split(":", 2)  # hierarchy-ID:controllers:path
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # cgroup v2: cpu.max, "max 100000" or "150000 100000"
            mounts = [root, root / "unified"]
        elif "cpu" in controllers.split(","):  # cgroup v1
            # Named as listed, or as distributions mount it: each folder read once.
            mounts = list(dict.fromkeys([root / controllers, root / "cpu,cpuacct", root / "cpu"]))
        else:
            continue
        for mount in mounts:
            limits += _quotas_along(mount, path.strip("/"), v2=controllers == "")
    return min(limits, key=lambda q: q.cpus, default=None)


def _quotas_along(mount: Path, path: str, v2: bool) -> list[CpuQuota]:
    """The quotas set from ``mount/path`` up to ``mount``. Where the path is not under the
    mount (a container sees its own group as the root), the mount's own."""
    here = mount / path if (mount / path).is_dir() else mount
    out = []
    while True:
        try:
            if v2:
                quota, period = (here / "cpu.max").read_text().split()
            else:
                quota = (here / "cpu.cfs_quota_us").read_text().strip()
                period = (here / "cpu.cfs_period_us").read_text().strip()
            if quota not in ("max", "-1") and int(period) > 0:
                out.append(CpuQuota(int(quota) / int(period), here, v2))
        except (OSError, ValueError):
            pass
        if here == mount or here.parent == here:
            return out
        here = here.parent


def usable_cores() -> int:
    """The cores this process can keep busy: the physical cores it may run on, no more
    than its control group's CPU quota, rounded down. A pool wider than the quota spends
    it early in each period and then stalls whole (at --cpus 1, four busy threads spend
    the quota in the first quarter of each period), a stall in the middle of a step."""
    quota = cpu_quota()
    cores = physical_cores()
    return cores if quota is None else max(1, min(cores, math.floor(quota)))


def configure_cpu_threads(threads: int | None = None, *, max_threads: int = DEFAULT_MAX_THREADS) -> int:
    """Set torch's intra-op threads (process-wide) and return the count: ``threads`` when
    given (pinned), else the cores this process can use (``usable_cores``), at most
    ``max_threads``, which ``adapt_cpu_threads`` then lowers while other processes keep
    those cores busy."""
    import torch

    global _adaptive
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    n = threads if threads is not None else max(1, min(usable_cores(), max_threads))
    torch.set_num_threads(n)
    _adaptive = None
    if threads is None and n > 1:
        _adaptive = adaptive_threads(n, _cpu_share(), _set_torch_threads)
    return n


def adaptive_threads(n: int, share: CpuShare, apply: Callable[[int], None]) -> AdaptiveThreads:
    """The policy for a pool of up to ``n`` threads, read from ``share``: the CPUs this
    process may run on, and, under a quota, the quota's CPUs (no more than those CPUs)."""
    cores = len(share.clock.cpus)
    quota = share.clock.quota
    return AdaptiveThreads(
        n, apply, lambda: share.others, share.clock.runnable_elsewhere, cores=max(n, cores),
        quota=None if quota is None else min(cores, quota.cpus), others_in_quota=lambda: share.others_in_quota,
    )


def adapt_cpu_threads() -> int:
    """Before an engine step: torch's intra-op threads for it, fewer than configured while
    other processes keep the cores busy (``AdaptiveThreads``); the configured count when
    it was pinned. Cheap: the CPU accounting is read on a thread of its own (``CpuShare``).
    An engine that never configured torch's pool gets torch's count only where torch is
    already loaded: importing it here, at the first step of an engine without torch, held
    a freshly started server's first audio for 2-3 s."""
    if _adaptive is not None:
        return _adaptive.threads_now()
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else 1


def _set_torch_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


class CpuClock:
    """Where the CPU time went: on the CPUs this process may run on, the time every
    process used (the kernel's per-CPU lines in /proc/stat, steal included: a
    hypervisor's other guests take cores too), this process's own, and under a CPU
    quota, its control group's (``quota``, the tightest on its path)."""

    def __init__(self, quota: CpuQuota | None = None) -> None:
        self._ticks = os.sysconf("SC_CLK_TCK")
        self.cpus = _usable_cpus()
        self._names = {f"cpu{i}".encode() for i in self.cpus}
        self.quota = quota

    def quota_seconds(self) -> float | None:
        """CPU seconds the quota's group has run (``CpuQuota.used_seconds``); None
        without a quota, or where its accounting cannot be read."""
        return None if self.quota is None else self.quota.used_seconds()

    def busy_seconds(self) -> float | None:
        """CPU seconds all processes have run on our CPUs since boot; None where
        /proc/stat is absent or names none of them (some containers)."""
        try:
            with open("/proc/stat", "rb") as f:
                lines = f.read().splitlines()
        except OSError:
            return None
        total, seen = 0, 0
        for line in lines[1:]:
            if not line.startswith(b"cpu"):
                break  # the per-CPU lines come first
            name, *fields = line.split()
            if name in self._names:
                # user nice system idle iowait irq softirq steal: all but idle and iowait.
                ticks = [int(v) for v in fields[:8]]
                total += sum(ticks) - ticks[3] - ticks[4]
                seen += 1
        return total / self._ticks if seen else None

    @staticmethod
    def own_seconds() -> float:
        t = os.times()
        return t.user + t.system

    @staticmethod
    def runnable_elsewhere() -> int | None:
        """Threads of other processes that are running or waiting for a core right now
        (the kernel's ``procs_running``, less this process's own); None where unknown."""
        try:
            with open("/proc/stat", "rb") as f:
                running = next((int(line.split()[1]) for line in f if line.startswith(b"procs_running")), None)
            own = 0
            for task in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{task}/stat", "rb") as f:
                        stat = f.read()
                except OSError:  # the thread has just ended
                    continue
                state = stat[stat.rindex(b")") + 2:][:1]  # after "pid (name) "
                if state == b"R":
                    own += 1
        except OSError:
            return None
        return None if running is None else max(0, running - own)


WINDOW_S = 0.1
"""The CPU accounting's window: ten of the kernel's 10 ms ticks on each core, and short,
so that a neighbour that has just finished (an ASR pass before the reply is spoken) no
longer counts when the first step comes."""


class CpuShare:
    """Cores the rest of the machine used over the last complete window, measured on a
    thread of its own every ``WINDOW_S``: a reading taken at step time would average over
    the whole idle gap before a first step, and count a neighbour long gone."""

    def __init__(self, clock: CpuClock | None = None, now: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock or CpuClock(cpu_limit())
        self.others = 0.0
        self.others_in_quota: float | None = None
        """Cores the other processes of the quota's group used: under a quota they spend
        it as this process does, wherever on the machine they run. None without a quota,
        or where the group's accounting cannot be read."""
        self._now = now
        self._last: tuple[float, float | None, float, float | None] | None = None

    def sample(self) -> float:
        """Read the accounting, and return the cores others used since the last reading."""
        now, busy, own = self._now(), self.clock.busy_seconds(), self.clock.own_seconds()
        group = self.clock.quota_seconds()
        last, self._last = self._last, (now, busy, own, group)
        if last is None or now <= last[0]:
            return self.others
        at, busy0, own0, group0 = last
        if busy is not None and busy0 is not None:
            self.others = max(0.0, ((busy - busy0) - (own - own0)) / (now - at))
        self.others_in_quota = (
            None if group is None or group0 is None else max(0.0, ((group - group0) - (own - own0)) / (now - at))
        )
        return self.others

    def start(self) -> CpuShare:
        threading.Thread(target=self._run, name="voxwire-cpu-share", daemon=True).start()
        return self

    def _run(self) -> None:
        while True:
            self.sample()
            time.sleep(WINDOW_S)


class AdaptiveThreads:
    """torch's intra-op threads, sized to the cores other processes leave idle.

    Before each step it gives the pool the cores that the rest of the machine left idle
    in the last window (``CpuShare``), rounded, from 1 to ``max_threads``, or those that
    no other process's thread is running or waiting for at that moment, if more. On a quiet
    machine that is every configured thread; beside two busy processes on 2 cores it is
    one, which keeps running where a second would stall every op's barrier. This
    process's own threads (the event loop, encoders) are not counted as others: they
    compete for the cores anyway, and counting them would shrink the pool whenever the
    server itself is busy.

    Under a CPU quota (``quota``, in CPUs) the pool also gets no more than the quota
    leaves after the other processes of its control group (``others_in_quota``): they
    spend the same quota, and a pool wider than what is left of it stalls whole once
    the period's quota is spent. Processes outside the group count only against the
    machine's cores: they have quotas of their own. Where the group's use is unknown,
    every other process counts against the quota."""

    def __init__(self, max_threads: int, apply: Callable[[int], None], others: Callable[[], float],
                 runnable_elsewhere: Callable[[], int | None], cores: int, quota: float | None = None,
                 others_in_quota: Callable[[], float | None] = lambda: None) -> None:
        self.max_threads, self.cores, self.quota = max_threads, cores, quota
        self.current = max_threads
        self.changes = 0
        self._apply, self._others, self._runnable_elsewhere = apply, others, runnable_elsewhere
        self._others_in_quota = others_in_quota

    def _fit(self, free: float) -> int:
        return max(1, min(self.max_threads, int(free + 0.5)))

    def _free(self, others: float, in_quota: float | None) -> float:
        """Cores left to this process: the machine's less ``others``, and under a quota
        no more than the quota less ``in_quota`` (its group's others; all, if unknown)."""
        free = self.cores - others
        if self.quota is not None:
            free = min(free, self.quota - (others if in_quota is None else in_quota))
        return free

    def threads_now(self) -> int:
        """Called on the thread that runs the steps: OpenMP's thread count is its own."""
        others = self._others()
        in_quota = self._others_in_quota() if self.quota is not None else None
        wanted = self._fit(self._free(others, in_quota))
        if wanted < self.max_threads:
            # The window is the recent past: a neighbour that has just stopped (the
            # client that sent this text, an ASR pass) left it busy, yet waits now. Only
            # threads runnable at this moment can stall this step's barriers. Which of
            # them are in the quota's group is not known: each counts against it.
            now = self._runnable_elsewhere()
            if now is not None:
                wanted = max(wanted, self._fit(self._free(now, now)))
        if wanted != self.current:
            within = "" if self.quota is None else (
                f" ({'?' if in_quota is None else f'{in_quota:.1f}'} of its quota of {self.quota:.1f})"
            )
            log.info("other processes used %.1f of %d cores%s: engine threads %d -> %d",
                     others, self.cores, within, self.current, wanted)
            self._apply(wanted)
            self.current, self.changes = wanted, self.changes + 1
        return self.current


_adaptive: AdaptiveThreads | None = None
_share: CpuShare | None = None


def _cpu_share() -> CpuShare:
    """The process's one sampler, started the first time a pool adapts."""
    global _share
    if _share is None:
        _share = CpuShare().start()
    return _share


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
