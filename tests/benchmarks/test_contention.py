"""benchmarks/contention.py at a tiny scale: both servers, quiet and beside two spinning
neighbours, against real servers on loopback. The results must be well formed, every
text fresh, and no neighbour left running. No timing is checked here."""

from __future__ import annotations

import json
import random

import pytest

from voxwire.benchmarks.contention import main, sentence
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
