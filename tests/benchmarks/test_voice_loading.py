"""benchmarks/voice_loading.py: a request it counts as "not loaded" did load its voice,
and one it counts as "loaded" did not."""

from __future__ import annotations

from voxwire.benchmarks.voice_loading import VOICES, cold_and_warm, voice_folder
from voxwire.engine.registry import EngineOptions
from voxwire.server.config import ServerConfig
from tests.conftest import run_server


async def test_each_not_loaded_request_loads_its_voice_and_each_loaded_one_does_not(tmp_path):
    folder = voice_folder(tmp_path)
    assert sorted(p.name for p in folder.glob("*.onnx")) == [f"{v}.onnx" for v in VOICES]
    options = EngineOptions(name="piper", piper_voices_dir=folder, piper_loaded_voices=1)
    with run_server(ServerConfig(engine=options, cache_mb=0)) as server:
        engine = server.service.worker.loaded_engine()
        load, loads = engine.load_voice, []
        engine.load_voice = lambda voice: (loads.append(voice), load(voice))[1]
        figures = await cold_and_warm(server.port, rounds=2)
    assert loads == ["b", "a", "b", "a"]  # each "not loaded" turn, and no other
    assert {k: len(v) for k, v in figures.items()} == {"not loaded": 4, "loaded": 4}
    assert all(ms > 0 for v in figures.values() for ms in v)
