"""benchmarks/studies/contention.py at a tiny scale: both servers, quiet and beside two spinning
neighbours, against real servers on loopback. The results must be well formed, every
text fresh, and no neighbour left running. No timing is checked here."""

from __future__ import annotations

import json
import os
import random

import pytest

from voxwire.benchmarks.studies.contention import main, sentence
from voxwire.benchmarks.process import free_port, launch_voxwire, stop, wait_http
from tests.fixtures.processes import children


def test_every_sentence_is_fresh_and_as_long_as_asked():
    rng = random.Random(1)
    texts = [sentence(words, rng) for words in (5, 40, 70) for _ in range(10)]
    assert len(set(texts)) == len(texts)  # no server's result cache can answer one
    assert [len(t.split()) for t in texts] == [5] * 10 + [40] * 10 + [70] * 10
    assert all(t[0].isupper() and t.endswith(".") for t in texts)


@pytest.mark.slow  # runs a benchmark end to end
@pytest.mark.timeout(600)
def test_a_tiny_run_measures_both_servers_quiet_and_beside_neighbours(tmp_path):
    before = children()
    assert main(["--rounds", "1", "--lengths", "5", "20", "--loads", "quiet", "busy", "--out", str(tmp_path)]) == 0
    assert children() <= before  # the servers and the neighbours are gone
    r = json.loads((tmp_path / "results.json").read_text())
    assert list(r["loads"]) == ["quiet", "busy"]
    for load, by_server in r["loads"].items():
        assert set(by_server) == {"voxwire", "wyoming-piper"}
        for row in by_server.values():
            assert [x["words"] for x in row["readings"]] == [5, 20]
            assert 0 < row["p50_ms"] <= row["p95_ms"] <= row["max_ms"]
            assert row["p95_over_quiet_p95"] > 0
        assert by_server["voxwire"]["p95_over_wyoming_piper_p95"] > 0
    assert r["loads"]["quiet"]["voxwire"]["p95_over_quiet_p95"] == 1.0


@pytest.mark.slow  # loads the engine three times and spins every core
@pytest.mark.timeout(600)
def test_engine_only_steps_the_engine_under_each_thread_policy_and_leaves_no_neighbour(tmp_path):
    before = children()
    assert main(["--engine-only", "--rounds", "1", "--lengths", "5", "30", "--loads", "quiet", "busy",
                 "--out", str(tmp_path)]) == 0
    assert children() <= before
    floor = json.loads((tmp_path / "results.json").read_text())["engine_floor"]
    assert list(floor) == ["quiet", "busy"]
    for by_policy in floor.values():
        assert list(by_policy) == ["adaptive", "1 thread", "2 threads"]
        for row in by_policy.values():
            assert 0 < row["p50_ms"] <= row["p95_ms"] <= row["max_ms"]
            assert row["p95_over_quiet_adaptive"] > 0
    assert floor["quiet"]["adaptive"]["p95_over_quiet_adaptive"] == 1.0


def test_voxwire_runs_at_the_scheduling_priority_asked_for():
    """--voxwire-nice: the server process itself takes the nice value (5 needs no privilege)."""
    port = free_port()
    proc = launch_voxwire(port, nice=5)
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", proc)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == os.getpriority(os.PRIO_PROCESS, 0) + 5
    finally:
        stop(proc)
