"""benchmarks/admission.py: how it counts, and a tiny run against both real servers."""

from __future__ import annotations

import json

import pytest

from voxwire.benchmarks.admission import main, outcome, total
from voxwire.benchmarks.loadgen import UtteranceResult


def test_a_refusal_is_counted_apart_from_an_error_and_only_what_was_served_is_heard():
    results = [
        UtteranceResult(words=3, ttfa_ms=80.0, audio_ms=2000.0, underruns=2, stall_ms=300.0),
        UtteranceResult(words=3, ttfa_ms=120.0, audio_ms=1000.0),
        UtteranceResult(words=3, error="overloaded"),
        UtteranceResult(words=3, error="http_429"),
        UtteranceResult(words=3, error="timeout"),
    ]
    r = outcome(results)
    assert (r["answers"], r["served"], r["refused"], r["errors"], r["underran"]) == (5, 2, 2, 1, 1)
    assert (r["audio_s"], r["stall_s"], r["stall_per_audio_s"]) == (3.0, 0.3, 0.1)
    both = total([r, outcome(results[1:3])])
    assert (both["answers"], both["served"], both["refused"], both["audio_s"]) == (7, 3, 3, 4.0)
    assert both["ttfa_p95_ms"] == max(r["ttfa_p95_ms"], 120.0)


@pytest.mark.slow  # two servers, end to end
@pytest.mark.timeout(300)
def test_a_tiny_run_measures_both_servers(tmp_path):
    assert main(["--listeners", "3", "--per-listener", "1", "--rounds", "1", "--gap", "0.1",
                 "--out", str(tmp_path)]) == 0
    servers = json.loads((tmp_path / "ws-3.json").read_text())["servers"]
    assert list(servers) == ["predicted", "reactive"]
    for r in servers.values():
        assert r["answers"] == 3 and r["errors"] == 0
        assert r["served"] + r["refused"] == 3 and r["served"] > 0
        assert r["audio_s"] > 0 and len(r["rounds"]) == 1
