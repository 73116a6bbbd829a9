"""/metrics, read back with prometheus-client's own text-format parser."""

import httpx
from prometheus_client.parser import text_string_to_metric_families

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
    from voxwire_client import Client

    before = scrape(tone_server)
    async with await Client.connect(tone_server.ws) as client:
        try:
            await (await client.speak("one explode three.")).collect()
        except Exception:
            pass
    after = scrape(tone_server)
    key = "voxwire_utterances_total{code=engine_error,door=ws,outcome=failed}"
    assert after[key] == before.get(key, 0) + 1
