"""benchmarks/voice_downloads.py: what it counts as a first request did download its
voice, once, and what it counts as a voice downloaded did not fetch it again."""

from __future__ import annotations

from collections import Counter

from tests.conftest import run_server
from voxwire.benchmarks.catalog_mirror import serve
from voxwire.benchmarks.voice_downloads import CASES, first_and_again, mirror_of_copies
from voxwire.engine.registry import EngineOptions
from voxwire.server.config import ServerConfig


async def test_each_first_request_downloads_its_voice_once_and_the_next_ones_do_not(tmp_path):
    keys = mirror_of_copies(tmp_path / "mirror", 2)
    with serve(tmp_path / "mirror") as mirror:
        options = EngineOptions(name="piper", download_voices=True, piper_voices_url=mirror.base,
                                piper_voices_dir=tmp_path / "voices")
        with run_server(ServerConfig(engine=options, cache_mb=0)) as server:
            figures = await first_and_again(server.port, keys, again=2)
    assert {case: len(v) for case, v in figures.items()} == {CASES[0]: 2, CASES[1]: 4, CASES[2]: 2}
    models = Counter({path.rsplit("/", 1)[1]: n for path, n in mirror.fetched.items() if path.endswith(".onnx")})
    assert models == Counter({f"{key}.onnx": 1 for key in keys})
    assert sorted(p.name for p in (tmp_path / "voices").glob("*.onnx")) == sorted(f"{key}.onnx" for key in keys)
    assert all(ms > 0 for v in figures.values() for ms in v)
