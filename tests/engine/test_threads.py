"""engine/threads.py: the one place that sizes torch's and onnxruntime's CPU pools."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from voxwire.engine import threads as threads_module
from voxwire.engine.threads import (
    WINDOW_S,
    AdaptiveThreads,
    CpuClock,
    CpuShare,
    adapt_cpu_threads,
    configure_cpu_threads,
    cpu_limit,
    cpu_quota,
    onnx_session_options,
    physical_cores,
    usable_cores,
)


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    before, adaptive = torch.get_num_threads(), threads_module._adaptive
    yield
    torch.set_num_threads(before)
    threads_module._adaptive = adaptive


def test_the_default_is_the_usable_cores_capped():
    n = configure_cpu_threads()
    assert n == min(usable_cores(), 4) and torch.get_num_threads() == n
    assert usable_cores() <= physical_cores()
    assert configure_cpu_threads(max_threads=1) == 1 and torch.get_num_threads() == 1


def test_an_exact_count_is_set_as_asked():
    assert configure_cpu_threads(2) == 2 and torch.get_num_threads() == 2
    assert configure_cpu_threads(1) == 1 and torch.get_num_threads() == 1
    with pytest.raises(ValueError):
        configure_cpu_threads(0)


def test_onnxruntime_sessions_get_a_fixed_pool_that_does_not_spin():
    options = onnx_session_options(3)
    assert options.intra_op_num_threads == 3
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert onnx_session_options().intra_op_num_threads == 1


class _Machine:
    """A CpuClock whose readings the test sets: CPU seconds of every process and of ours."""

    cpus = [0, 1]

    def __init__(self) -> None:
        self.t = self.busy = self.own = 0.0

    def run(self, seconds: float, others: float, own: float) -> None:
        """``seconds`` pass with ``others`` cores busy elsewhere and ``own`` in this process."""
        self.t += seconds
        self.busy += (others + own) * seconds
        self.own += own * seconds

    def busy_seconds(self) -> float:
        return self.busy

    def own_seconds(self) -> float:
        return self.own

    def quota_seconds(self) -> float | None:
        return None  # no CPU quota


def test_the_share_counts_other_processes_only_over_the_last_window():
    machine = _Machine()
    share = CpuShare(clock=machine, now=lambda: machine.t)  # type: ignore[arg-type]
    assert share.sample() == 0.0  # a first reading has nothing to compare with
    machine.run(WINDOW_S, others=0.1, own=2.0)  # our own busy threads are not others
    assert share.sample() == pytest.approx(0.1)
    machine.run(WINDOW_S, others=1.9, own=0.1)
    assert share.sample() == pytest.approx(1.9)
    machine.run(WINDOW_S, others=0.0, own=1.0)  # the neighbours just stopped: gone at once
    assert share.sample() == pytest.approx(0.0)


class _Share:
    others = 0.0
    """Cores used elsewhere over the last window."""
    runnable: int | None = None
    """Threads of other processes runnable at the moment of the step."""


def _adaptive(max_threads: int = 2, cores: int = 2) -> tuple[AdaptiveThreads, _Share, list[int]]:
    share, applied = _Share(), []
    policy = AdaptiveThreads(max_threads, applied.append, lambda: share.others, lambda: share.runnable, cores=cores)
    return policy, share, applied


def test_on_a_quiet_machine_every_thread_is_kept():
    policy, share, applied = _adaptive()
    for others in (0.0, 0.1, 0.4, 0.2):
        share.others = others
        assert policy.threads_now() == 2
    assert applied == [] and policy.changes == 0


def test_threads_shrink_to_the_cores_others_leave_idle_and_come_back():
    policy, share, applied = _adaptive()
    share.others = 1.9  # two busy neighbours on 2 cores
    assert policy.threads_now() == 1 and applied == [1]
    share.others = 1.3
    assert policy.threads_now() == 1 and applied == [1]  # set once, not on every step
    share.others = 0.0  # they stopped
    assert policy.threads_now() == 2 and applied == [1, 2]
    assert policy.changes == 2


def test_a_neighbour_that_has_just_stopped_does_not_take_a_thread():
    policy, share, applied = _adaptive()
    share.others, share.runnable = 1.2, 0  # busy in the last window (the client that sent the text), idle now
    assert policy.threads_now() == 2 and applied == []
    share.runnable = 2  # still at work
    assert policy.threads_now() == 1 and applied == [1]
    share.runnable = None  # no procs_running to read: the window decides
    assert policy.threads_now() == 1


def test_more_cores_give_back_what_others_leave_within_the_cap():
    policy, share, applied = _adaptive(max_threads=4, cores=8)
    share.others = 5.2
    assert policy.threads_now() == 3  # 8 - 5.2 = 2.8 cores idle
    share.others = 1.0
    assert policy.threads_now() == 4  # 7 idle, capped at 4
    assert applied == [3, 4]


def test_an_exact_count_is_pinned_and_never_adapted():
    configure_cpu_threads(2)
    assert adapt_cpu_threads() == 2 and threads_module._adaptive is None
    configure_cpu_threads()
    assert (threads_module._adaptive is not None) == (torch.get_num_threads() > 1)
    configure_cpu_threads(1)
    assert threads_module._adaptive is None


def test_spinning_neighbours_are_counted_as_runnable_elsewhere():
    idle = CpuClock.runnable_elsewhere()
    assert idle is not None and idle >= 0
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        seen = []
        for _ in range(20):  # bounded: a reading may catch one between two of its slices
            time.sleep(0.05)
            seen.append(CpuClock.runnable_elsewhere())
        assert max(seen) >= 2
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def test_the_clock_reads_this_machines_cpus():
    clock = CpuClock()
    busy, own = clock.busy_seconds(), clock.own_seconds()
    assert busy is not None and busy > 0 and own > 0
    end = own + 0.05
    while clock.own_seconds() < end:  # burn a little CPU: both readings grow
        pass
    assert clock.own_seconds() >= end and clock.busy_seconds() > busy


def _cgroup(tmp_path, membership: str, files: dict[str, str]):
    """A /sys/fs/cgroup and a /proc/self/cgroup made of ``files`` (path: content)."""
    root = tmp_path / "cgroup"
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content)
    (tmp_path / "membership").write_text(membership)
    return {"root": root, "membership": tmp_path / "membership"}


def test_a_cgroup_v2_quota_is_read_and_the_tightest_on_the_path_wins(tmp_path):
    where = _cgroup(tmp_path, "0::/kubepods/pod1/voxwire\n", {
        "cpu.max": "max 100000\n",
        "kubepods/cpu.max": "400000 100000\n",
        "kubepods/pod1/cpu.max": "150000 100000\n",
        "kubepods/pod1/voxwire/cpu.max": "max 100000\n",
    })
    assert cpu_quota(**where) == pytest.approx(1.5)
    unlimited = _cgroup(tmp_path / "none", "0::/\n", {"cpu.max": "max 100000\n"})
    assert cpu_quota(**unlimited) is None


def test_a_cgroup_v1_quota_is_read_and_a_container_sees_its_own_group_as_the_root(tmp_path):
    # Docker on cgroup v1 without a cgroup namespace: the path names the host's group,
    # which inside the container is the mount itself.
    where = _cgroup(tmp_path, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n", {
        "cpu,cpuacct/cpu.cfs_quota_us": "50000\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })
    assert cpu_quota(**where) == pytest.approx(0.5)
    unlimited = _cgroup(tmp_path / "none", "3:cpu,cpuacct:/\n", {
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })
    assert cpu_quota(**unlimited) is None
    assert cpu_quota(tmp_path / "absent", tmp_path / "absent-membership") is None
    odd = _cgroup(tmp_path / "odd", "garbage\n3:cpu,cpuacct:/\n", {
        "cpu,cpuacct/cpu.cfs_quota_us": "200000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })
    assert cpu_quota(**odd) == pytest.approx(2.0)  # a line it cannot read is passed over


def test_the_default_pool_stays_within_the_cpu_quota(monkeypatch):
    monkeypatch.setattr(threads_module, "physical_cores", lambda: 8)
    monkeypatch.setattr(threads_module, "cpu_quota", lambda: 2.5)
    assert configure_cpu_threads() == 2 and torch.get_num_threads() == 2  # rounded down: no throttled tail
    monkeypatch.setattr(threads_module, "cpu_quota", lambda: 0.5)
    assert configure_cpu_threads() == 1
    assert configure_cpu_threads(3) == 3  # an exact count is the operator's to choose
    monkeypatch.setattr(threads_module, "cpu_quota", lambda: None)
    assert configure_cpu_threads() == 4


class _QuotaMachine(_Machine):
    """A machine of 8 CPUs whose process runs in a control group with a CPU quota: the
    group's accounting is a file of a fake cgroup tree (``_cgroup``), written as time passes."""

    cpus = list(range(8))

    def __init__(self, where: dict[str, Path]) -> None:
        super().__init__()
        self.quota = cpu_limit(**where)
        self.group_busy = 0.0
        self.accounted = True
        """Whether the group's accounting file is there to read."""
        self.runnable = 0

    def run(self, seconds: float, others: float, own: float, in_group: float = 0.0) -> None:  # type: ignore[override]
        """``others`` cores busy elsewhere, of which ``in_group`` in this process's group."""
        super().run(seconds, others, own)
        self.group_busy += (in_group + own) * seconds
        usage = self.quota.group / "cpu.stat"
        if self.accounted:
            usage.write_text(f"usage_usec {round(self.group_busy * 1e6)}\nuser_usec 0\nsystem_usec 0\n")
        else:
            usage.unlink(missing_ok=True)

    def quota_seconds(self) -> float | None:
        return self.quota.used_seconds()

    def runnable_elsewhere(self) -> int:
        return self.runnable


def test_under_a_quota_the_groups_other_processes_count_against_the_quota_not_the_hosts_cores(tmp_path, monkeypatch):
    """8 CPUs, a pod with a quota of 2 CPUs, and Voxwire in a container of the pod beside
    another process of it: that one spends the same 2 CPUs, while the host's other
    processes (other pods, with quotas of their own) leave cores idle beside them."""
    where = _cgroup(tmp_path, "0::/kubepods/pod1/voxwire\n", {
        "cpu.max": "max 100000\n",
        "kubepods/pod1/cpu.max": "200000 100000\n",
        "kubepods/pod1/cpu.stat": "usage_usec 0\n",
        "kubepods/pod1/voxwire/cpu.max": "max 100000\n",
        "kubepods/pod1/voxwire/cpu.stat": "usage_usec 0\n",
    })
    assert (tmp_path / "cgroup" / "kubepods" / "pod1").samefile(cpu_limit(**where).group)
    machine = _QuotaMachine(where)
    share = CpuShare(clock=machine, now=lambda: machine.t)  # type: ignore[arg-type]
    monkeypatch.setattr(threads_module, "_share", share)  # the process's sampler, read by hand here
    monkeypatch.setattr(threads_module, "physical_cores", lambda: 8)
    monkeypatch.setattr(threads_module, "cpu_quota", lambda: cpu_quota(**where))
    assert configure_cpu_threads() == 2  # the quota's 2 CPUs, of 8
    share.sample()

    # The pod's other process keeps 1.5 of its 2 CPUs busy: 0.5 is left, one thread's worth,
    # although 6.5 of the host's 8 cores are idle.
    machine.runnable = 1
    machine.run(WINDOW_S, others=1.5, own=1.0, in_group=1.5)
    share.sample()
    assert share.others == pytest.approx(1.5) and share.others_in_quota == pytest.approx(1.5)
    assert adapt_cpu_threads() == 1

    # It stops, and five busy processes of other pods run elsewhere on the host: they
    # leave 3 cores idle, and the quota whole.
    machine.runnable = 5
    machine.run(WINDOW_S, others=5.0, own=1.0, in_group=0.0)
    share.sample()
    assert share.others == pytest.approx(5.0) and share.others_in_quota == pytest.approx(0.0)
    assert adapt_cpu_threads() == 2

    # Where the group's accounting cannot be read, every other process counts against it.
    machine.accounted = False
    machine.run(WINDOW_S, others=1.5, own=1.0, in_group=1.5)
    share.sample()
    assert share.others_in_quota is None
    assert adapt_cpu_threads() == 1


def test_without_a_quota_only_the_machines_cores_count():
    policy = AdaptiveThreads(2, [].append, lambda: 5.0, lambda: None, cores=8,
                             others_in_quota=lambda: pytest.fail("no quota: its group is never read"))
    assert policy.threads_now() == 2  # 3 idle of 8


def test_a_groups_cpu_accounting_is_read_as_cgroup_v2_and_v1_keep_it(tmp_path):
    v2 = _cgroup(tmp_path / "v2", "0::/app\n", {
        "app/cpu.max": "150000 100000\n", "app/cpu.stat": "usage_usec 2500000\nuser_usec 2000000\n",
    })
    quota = cpu_limit(**v2)
    assert quota is not None and quota.v2 and quota.cpus == pytest.approx(1.5)
    assert quota.used_seconds() == pytest.approx(2.5)
    assert CpuClock(quota).quota_seconds() == pytest.approx(2.5) and CpuClock().quota_seconds() is None
    v1 = _cgroup(tmp_path / "v1", "3:cpu,cpuacct:/docker/abc\n", {
        "cpu,cpuacct/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/cpuacct.usage": "7250000000\n",
    })
    quota = cpu_limit(**v1)
    assert quota is not None and not quota.v2 and quota.used_seconds() == pytest.approx(7.25)
    (v1["root"] / "cpu,cpuacct" / "cpuacct.usage").unlink()  # cpuacct mounted apart: unknown
    assert quota.used_seconds() is None


TORCHLESS_UTTERANCE = """
import asyncio, sys
from tests.fixtures.engines import ToneEngine
from tests.fixtures.waiting import drain
from voxwire.engine.base import SynthesisParams
from voxwire.engine.worker import Worker
from voxwire.engine.worker_options import WorkerOptions

async def main():
    worker = Worker(ToneEngine, WorkerOptions(warmup=False)).start()
    worker.wait_ready(30)
    u = worker.submit(SynthesisParams(voice="tone"), asyncio.get_running_loop())
    u.feed("one two three.", final=True)
    audio, end = await drain(u)
    worker.stop()
    print(type(end).__name__, audio.size, "torch" in sys.modules)

asyncio.run(main())
"""


def test_an_engine_without_torch_steps_without_importing_it():
    # adapt_cpu_threads imported torch at the first step of an engine that has none: a
    # freshly started server's first audio waited 2-3 s for the import.
    out = subprocess.run(
        [sys.executable, "-c", TORCHLESS_UTTERANCE], cwd=Path(__file__).resolve().parents[2],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout.split()
    assert out[0] == "Done" and int(out[1]) > 0
    assert out[2] == "False"
