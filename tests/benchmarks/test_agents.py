"""benchmarks/agents.py in its quick mode: real Pipecat pipelines and LiveKit streams
against a real Voxwire server and Piper's real HTTP server on loopback (and Piper in
process). The result must be well formed and sane; no timing target is checked here."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pipecat", reason="the client's pipecat extra (make test installs it)")
pytest.importorskip("livekit.agents", reason="the client's livekit extra (make test installs it)")
pytest.importorskip("piper.http_server", reason="piper-tts with its HTTP server (the bench extra)")

from voxwire.benchmarks import tables
from voxwire.benchmarks.agents import LIVEKIT, PIPECAT, main
from tests.fixtures.processes import children

pytestmark = pytest.mark.slow  # runs a benchmark end to end (Pipecat, LiveKit, Piper's HTTP server)


# The run itself takes under a minute; the bound allows for a slow start of both servers.
@pytest.mark.timeout(240)
def test_a_quick_run_measures_every_system_through_its_framework(tmp_path):
    before = children()
    out = tmp_path / "agents.json"
    assert main(["--quick", "--out", str(out)]) == 0
    assert children() <= before  # both servers are gone

    r = json.loads(out.read_text())
    assert r["machine"]["cores"] >= 1 and r["command"].startswith("python -m voxwire.benchmarks.agents --quick")
    systems = r["systems"]
    assert sorted(s["framework"] for s in systems.values()) == sorted([PIPECAT] * 3 + [LIVEKIT] * 2)
    texts = len(r["config"]["texts"])
    for name, s in systems.items():
        assert s["errors"] == 0 and s["warmup_errors"] == 0 and s["interruptions"]["errors"] == 0, (
            name, s["error_messages"])
        # Every text was spoken, with real speech, and its first audio came after its first token.
        assert s["turns"] == s["first_audio_ms"]["n"] == texts, name
        assert s["first_audio_ms"]["p50"] > 0 and s["audio_ms_p50"] > 1000, name
        assert s["first_audio_ms"]["p50"] <= s["first_audio_ms"]["p95"]
        long = s["long_first_sentence"]
        assert long["turns"] == long["first_audio_ms"]["n"] == 1 and long["errors"] == 0, name
        assert s["after_first_sentence_ms"]["n"] == texts and long["first_audio_ms"]["p50"] > 0, name
        # Each interruption came while the reply was being spoken.
        assert s["interruptions"]["cuts"] == 1 and s["interruptions"]["audio_ms_before"] > 0, name
        assert 0 <= s["word_timing_coverage"] <= 1
    for framework, q in r["ratios"].items():
        ours = systems[q["voxwire"]]
        assert ours["framework"] == framework
        # Voxwire times every spoken word, and nothing of an interrupted reply comes after.
        assert ours["word_timing_coverage"] == 1.0
        assert ours["interruptions"]["frames_after"] == 0 and ours["interruptions"]["audio_ms_after"] == 0
        assert q["best_piper"] in systems and q["ratio_p50"] > 0

    # The README's tables render from such a result.
    assert len(tables.agents(r)) == 2 + len(systems)
    assert len(tables.agents_ratios(r)) == 2 + 2
