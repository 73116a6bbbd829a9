"""``voxwire bench`` at a tiny scale against a real server: the results are well formed
and consistent. No timing is checked here; timings belong to benchmarks/README.md."""

from __future__ import annotations

import json
import math

from benchmarks.bench import Plan, main


def ordered(s: dict) -> bool:
    return s["p50"] <= s["p95"] <= s["p99"]


def test_tiny_bench_results_are_well_formed(tmp_path):
    assert main(["--tiny", "--out", str(tmp_path), "--poisson", "2", "--poisson-seconds", "3"]) == 0
    r = json.loads((tmp_path / "results.json").read_text())
    plan = Plan.named("tiny")
    assert r["machine"]["cores"] >= 1 and r["machine"]["cpu"]
    # Every utterance asked for was answered, and counted once.
    for row in r["sweep"]:
        assert row["requests"] == row["utterances"] == row["concurrency"] * plan.per_client
        assert row["errors"] == 0 and row["cached"] == 0  # its own server: the engine computed every one
        assert ordered(row["ttfa_ms"]) and ordered(row["sound_ms"])
        # Each utterance with an underrun had at least one: there are no more of them than
        # utterances or underruns, and there are some exactly when there are underruns.
        assert 0 <= row["utterances_with_underrun"] <= min(row["utterances"], row["underruns"])
        assert (row["utterances_with_underrun"] > 0) == (row["underruns"] > 0)
        assert row["held"] == (row["underruns"] == 0 and row["ttfa_ms"]["p95"] < r["config"]["ttfa_target_ms"])
    assert [row["concurrency"] for row in r["sweep"]] == list(plan.levels)
    assert r["held"] in [0, *plan.levels]
    single = r["single"]
    assert single["errors"] == 0 and single["ttfa_ms"]["n"] == plan.replies
    # A listener cannot hear sound before the first audio arrives, nor all of it before the last frame.
    assert single["sound_ms"]["p50"] >= single["ttfa_ms"]["p50"]
    assert single["whole_ms"]["p50"] >= single["ttfa_ms"]["p50"]
    for name in ("ttfa_ms", "sound_ms", "whole_ms", "server_ttfa_ms"):
        assert ordered(single[name])
    assert [row["words"] for row in r["length"]] == [3, 10, 20, 40]
    assert [row["words"] for row in r["floor"]["length"]] == [7, 14, 24, 44]  # + "Then it was quiet."
    assert r["floor"]["rtf"]["p50"] > 0 and ordered(r["floor"]["first_chunk_ms"])
    peer = r["peers"]["piper_http"]
    assert peer["ttfb_ms"]["n"] == plan.peer_texts and peer["ttfb_ms"]["p50"] <= peer["total_ms"]["p50"]
    assert peer["audio_ms"]["p50"] > 500  # real speech came back from Piper's server
    mem = r["memory"]
    assert mem["readers"] == plan.readers and mem["stalled_rss_mb"] > 0 and mem["queued_audio_s"] > 0
    h = r["headline"]
    assert math.isclose(h["ttfa_over_floor"], h["ttfa_p50_ms"] / h["floor_first_chunk_p50_ms"])
    assert math.isclose(h["compute_limit_streams"], r["machine"]["cores"] / r["floor"]["rtf"]["p50"])
    po = r["poisson"]
    assert po["utterances"] == po["requests"] > 0 and po["errors"] == 0 and ordered(po["ttfa_ms"])
    # The report and its plots.
    md = (tmp_path / "report.md").read_text()
    assert "| streams | utterances |" in md and "TTFA ÷ floor" in md
    for png in ("concurrency.png", "length.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
