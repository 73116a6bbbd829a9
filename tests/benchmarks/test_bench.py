"""``voxwire bench`` at a tiny scale against real servers on loopback: Voxwire over its
WebSocket and its OpenAI route (and its Wyoming door where it has one), wyoming-piper over
Wyoming, and Piper's HTTP server, all started by the bench with the same voice. The
results must be well formed and consistent. No timing is checked here; timings belong
to benchmarks/README.md."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from voxwire.benchmarks.bench import PIPER_HTTP, VOXWIRE, VOXWIRE_OPENAI, VOXWIRE_WYOMING, WYOMING_PIPER, Plan, main
from voxwire.benchmarks.process import gauge
from voxwire.benchmarks.protocols import REFUSALS
from voxwire.server.config import ServerConfig
from tests.conftest import run_server
from tests.fixtures.engines import ToneEngine

pytestmark = pytest.mark.slow  # runs voxwire bench end to end


def ordered(s: dict) -> bool:
    return s["p50"] <= s["p95"] <= s["p99"]


# Four servers load the same voice at once; on a busy 2-core machine that alone can take
# minutes. The bench's own waits are bounded (start-up, and 30 s per piece of an answer).
@pytest.mark.timeout(900)
def test_tiny_bench_measures_every_protocol_end_to_end(tmp_path):
    assert main(["--tiny", "--out", str(tmp_path), "--poisson", "2", "--poisson-seconds", "3"]) == 0
    check_run(tmp_path, Plan.named("tiny"))


# Kokoro decodes each sentence whole by default: seconds an utterance on a CPU.
@pytest.mark.timeout(900)
def test_tiny_bench_measures_kokoro_on_every_door_without_peers(tmp_path):
    assert main(["--tiny", "--engine", "kokoro", "--out", str(tmp_path), "--no-plots"]) == 0
    check_run(tmp_path, Plan.named("tiny"), engine="kokoro", plots=False)


def check_run(out: Path, plan: Plan, engine: str = "piper", plots: bool = True) -> None:
    """What every run of the bench with its own servers must show (also usable on a
    stored run: ``check_run(Path("benchmarks/results/…"), Plan.named(…))``). Piper's runs
    have wyoming-piper and Piper's HTTP server beside Voxwire; other engines' have none."""
    r = json.loads((out / "results.json").read_text())
    assert r["machine"]["cores"] >= 1 and r["machine"]["cpu"]
    assert r["config"]["engine"] == engine
    servers = r["servers"]
    kinds = {name: s["kind"] for name, s in servers.items()}
    expected = {VOXWIRE: "v1", VOXWIRE_OPENAI: "openai"}
    if engine == "piper":
        expected |= {WYOMING_PIPER: "wyoming", PIPER_HTTP: "piper_http"}
        assert servers[WYOMING_PIPER]["streaming"] is True  # wyoming-piper takes streamed text
    assert {k: v for k, v in kinds.items() if k != VOXWIRE_WYOMING} == expected
    assert all(s["engine"] == engine for name, s in servers.items() if name.startswith("Voxwire"))
    for name, s in servers.items():
        single = s["single"]
        # Every utterance asked for was answered with real speech, and counted once.
        assert s["warmup_errors"] == 0 and single["errors"] == 0, (name, single["error_codes"])
        assert single["utterances"] == single["ttfa_ms"]["n"] == 2 * plan.rounds
        assert single["audio_ms"]["p50"] > 500, name  # seconds of speech, not a click
        assert ordered(single["ttfa_ms"]) and ordered(single["last_audio_ms"])
        assert single["ttfa_ms"]["p50"] <= single["last_audio_ms"]["p50"] <= single["whole_ms"]["p50"]
        # A listener cannot hear sound before the first audio arrives.
        assert single["sound_ms"]["p50"] >= single["ttfa_ms"]["p50"]
        assert s["three_sentences"]["ttfa_ms"]["n"] == plan.rounds
        if s["kind"] in ("openai", "piper_http"):
            assert single["first_byte_ms"]["p50"] <= single["ttfa_ms"]["p50"]
        assert single["cached"] == 0  # the engine computed every one
        assert s["cached_answers"] == 0 and s["answers"] > 0
        # Load levels: level 1 is concurrency 1, then the plan's levels, each with enough
        # utterances; a level counts only if every lower one passed.
        assert [row["level"] for row in s["staggered"]] == [1, *plan.sweep_levels]
        assert [row["level"] for row in s["burst"]] == list(plan.burst_levels)
        for row in s["staggered"][1:] + s["burst"]:
            # A refusal (overloaded) is a server at its measured capacity: that level is not
            # held. Any other error is a fault.
            assert row["utterances"] >= plan.utterances, name
            assert row["errors"] == 0 or set(row["error_codes"]) <= REFUSALS, (name, row["error_codes"])
            assert not (row["errors"] and row["passed"]), name
            assert 0 <= row["utterances_with_underrun"] <= min(row["utterances"], row["underruns"])
            assert (row["utterances_with_underrun"] > 0) == (row["underruns"] > 0)
            target = r["config"]["ttfa_target_ms"]
            assert row["passed"] == (row["underruns"] == 0 and row["ttfa_ms"]["p95"] < target)
        levels = s["staggered"]
        expect = 0
        for row in levels:
            if not row["passed"]:
                break
            expect = row["level"]
        assert s["held_staggered"] == expect
    # The floor is measured as carefully as the server it is compared with.
    assert [row["words"] for row in r["length"]] == list(plan.lengths)
    assert all(row["ttfa_ms"]["n"] == plan.length_repeats for row in r["length"])
    floor = r["floor"]
    assert floor["repeats"] == plan.length_repeats and floor["warmup"] == plan.warmup
    assert [row["first_chunk_ms"]["n"] for row in floor["length"]] == [plan.length_repeats] * len(plan.lengths)
    assert floor["rtf"]["p50"] > 0 and ordered(floor["first_chunk_ms"])
    h = r["headline"]
    assert math.isclose(h["ttfa_over_floor"], h["ttfa_p50_ms"] / h["floor_first_chunk_p50_ms"])
    assert math.isclose(h["compute_limit_streams"], 1 / floor["rtf"]["p50"])
    if engine == "piper":
        assert math.isclose(h["three_sentences_ttfa_over_wyoming_piper"],
                            h["three_sentences_ttfa_p50_ms"] / h["wyoming_piper_three_sentences_ttfa_p50_ms"])
    else:
        assert "three_sentences_ttfa_over_wyoming_piper" not in h
    mem = r.get("memory", {"readers": 0, "stalled_rss_mb": 1, "queued_audio_s": 1})
    assert mem["readers"] == plan.readers and mem["stalled_rss_mb"] > 0 and mem["queued_audio_s"] > 0
    if "poisson" in r:
        po = r["poisson"]
        assert po["utterances"] > 0 and po["errors"] == 0 and ordered(po["ttfa_ms"])
    # What each server's listener heard: real speech that Whisper understands (two
    # sentences: one misheard word is a few percent, noise or silence is 100), with seams
    # where the protocol delivers pieces of its own.
    q = r["quality"]
    assert q["sentences"] == plan.listen and set(q["rows"]) == set(servers)
    for name, row in q["rows"].items():
        assert row["errors"] == 0 and row["sentences"] == plan.listen, (name, row["error_codes"])
        assert row["wer"] < 40, (name, row["worst_sentences"])
        assert 1 <= row["dnsmos"]["ovrl"] <= 5 and 1 <= row["dnsmos"]["sig"] <= 5, name
        assert (row["seams"]["joins"] > 0) == (servers[name]["kind"] in ("v1", "wyoming")), name
    # The report, its comparison table and its plots.
    md = (out / "report.md").read_text()
    assert "What a listener hears" in md
    assert "| server | protocol |" in md and "TTFA ÷ floor" in md
    assert "result cache" not in md.split("Command:")[0]  # no warning: nothing was replayed
    for name in servers:
        assert f"| {name} |" in md
    assert f"Engine: {engine} (" in md
    for png in ("concurrency.png", "servers.png", "length.png") if plots else ():
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def caching_server():
    """A server with its result cache on, as ``make serve`` starts it. A fresh one for each
    door, since one cache entry serves every format. The tone engine: what matters here
    is whether an answer was replayed, not the voice."""
    with run_server(ServerConfig(cache_mb=16), engine=ToneEngine) as s:
        yield s


@pytest.mark.timeout(300)
@pytest.mark.parametrize("door", ["ws", "openai"])
def test_answers_from_a_servers_result_cache_are_counted_and_flagged(caching_server, tmp_path, capsys, door):
    url = caching_server.ws if door == "ws" else f"{caching_server.http}/v1/audio/speech"
    assert main(["--tiny", "--url", url, "--out", str(tmp_path), "--no-plots"]) == 0
    name = VOXWIRE if door == "ws" else VOXWIRE_OPENAI  # as the server describes itself
    server = json.loads((tmp_path / "results.json").read_text())["servers"][name]
    # The server's own count of replays. The warm-up text is spoken once, so it is never
    # replayed: every replay the server made is a measured answer the bench must count.
    replays = int(asyncio.run(gauge(caching_server.http, "voxwire_cache_hits_total")))
    assert replays > 0  # the bench repeats its texts
    assert server["cached_answers"] == replays and server["answers"] > replays
    # Flagged before any figure, in the printed report and the stored one.
    printed = capsys.readouterr().out
    for md in (printed, (tmp_path / "report.md").read_text()):
        top = md.split("Command:")[0]
        assert "result cache" in top and f"{name}: {replays} of {server['answers']}" in top, top
        assert "--cache-mb 0" in top
