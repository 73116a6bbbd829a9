"""/metrics, read back with prometheus-client's own text-format parser."""

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import RunningServer, run_server
from voxwire.engine.precision import resolve
from voxwire.engine.registry import EngineOptions
from voxwire.engine.threads import DEFAULT_MAX_THREADS, WINDOW_S, CpuClock, usable_cores
from voxwire.server.config import ServerConfig

from voxwire_client.sync import synthesize_async


def scrape(server, headers: dict[str, str] | None = None) -> dict[str, float]:
    """Every sample of a scrape, by name and labels (``name{k=v,...}``)."""
    text = httpx.get(f"{server.http}/metrics", headers=headers).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


async def test_metrics_count_what_happened(piper_server):
    before = scrape(piper_server)
    result = await synthesize_async("Counting in metrics.", piper_server.ws)
    after = scrape(piper_server)
    done = "voxwire_utterances_total{code=,door=ws,outcome=done}"
    assert after[done] == before[done] + 1  # zero-initialised: present before the first
    ttfa = "voxwire_ttfa_seconds_count{door=ws}"
    assert after[ttfa] == before[ttfa] + 1
    assert after["voxwire_rtf_ratio_count"] == before.get("voxwire_rtf_ratio_count", 0) + 1
    steps = result.done["engine_steps"]
    step_count = "voxwire_engine_step_seconds_count{worker=0}"
    assert after[step_count] - before[step_count] == steps
    assert after["voxwire_engine_steps_total{worker=0}"] - before["voxwire_engine_steps_total{worker=0}"] == steps
    assert after["voxwire_worker_busy_seconds_total{worker=0}"] > before["voxwire_worker_busy_seconds_total{worker=0}"]
    assert after["voxwire_active_utterances"] == 0 and after["voxwire_queued_audio_seconds"] == 0
    assert after["voxwire_ready_workers"] == 1
    assert after["voxwire_asyncio_tasks"] >= 1 and after["voxwire_threads"] >= 2
    assert after["process_resident_memory_bytes"] > 0


async def test_outcomes_by_error_code(tone_server):
    from voxwire_client import Client, ServerError

    before = scrape(tone_server)
    async with await Client.connect(tone_server.ws) as client:
        # The tone engine fails at "explode": the utterance ends with engine_error, and is counted so.
        with pytest.raises(ServerError) as e:
            await (await client.speak("one explode three.", ctx="boom")).collect()
        assert (e.value.code, e.value.ctx) == ("engine_error", "boom")
    after = scrape(tone_server)
    key = "voxwire_utterances_total{code=engine_error,door=ws,outcome=failed}"
    assert after[key] == before.get(key, 0) + 1


@pytest.fixture
def freshly_started_piper() -> Iterator[RunningServer]:
    """A Piper server started for one test. The engine thread policy is the process's,
    set by the engine that loaded last (engine/threads.py), and the session's servers
    share this process with engines that pin it: the CosyVoice2 server's pins one thread,
    after which a session Piper server never adapts."""
    with run_server(ServerConfig(engine=EngineOptions(name="piper"), cache_mb=0)) as s:
        yield s


@pytest.mark.slow  # spins every core for seconds
async def test_engine_threads_give_way_to_busy_neighbours_and_come_back(freshly_started_piper):
    """Beside processes that keep every core busy, the engine's steps run on one thread
    (a second would stall at every op's barrier while the OS runs a neighbour), and once
    they stop, on all of them again (engine/threads.py)."""
    piper_server = freshly_started_piper
    threads = min(usable_cores(), DEFAULT_MAX_THREADS)  # what the engine's default asks for
    if threads < 2:
        pytest.skip("one core: there is no second thread to give way")
    text = "Neighbours are busy. The engine shares the cores. It still speaks in time."
    await synthesize_async(text, piper_server.ws)
    neighbours = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(len(CpuClock().cpus))]
    try:
        for _ in range(10):  # bounded: on a loaded machine the first busy window may miss some of their time
            await asyncio.sleep(2 * WINDOW_S)  # a window of the accounting with them at work
            await synthesize_async(text, piper_server.ws)
            if scrape(piper_server)["voxwire_engine_threads"] == 1:
                break
        assert scrape(piper_server)["voxwire_engine_threads"] == 1
    finally:
        for p in neighbours:
            p.kill()
            p.wait()
    for _ in range(10):  # bounded: the first quiet window may still hold some of their time
        await asyncio.sleep(2 * WINDOW_S)
        await synthesize_async(text, piper_server.ws)
        if scrape(piper_server)["voxwire_engine_threads"] == threads:
            break
    assert scrape(piper_server)["voxwire_engine_threads"] == threads


async def test_the_engine_its_device_and_precision_are_on_metrics(piper_server):
    """What each worker computes in is visible, so a dashboard can tell a bf16 fleet from
    an fp32 one; the default setting resolves by this CPU's features."""
    precision = resolve("auto", "cpu")
    info = {k: v for k, v in scrape(piper_server).items() if k.startswith("voxwire_engine_info")}
    assert info == {f"voxwire_engine_info{{device=cpu,engine=piper,precision={precision},worker=0}}": 1.0}


async def test_stalled_listeners_are_counted_by_door_and_reason_from_the_first_scrape(tone_server):
    """voxwire_listeners_stalled_total is there, at 0, before any listener stalls, so an
    alert on its rate() sees the first one (tests/server/test_stalls.py counts real ones)."""
    m = scrape(tone_server)
    for door in ("ws", "http"):
        for reason in ("not_reading", "no_progress"):
            assert m[f"voxwire_listeners_stalled_total{{door={door},reason={reason}}}"] == 0
