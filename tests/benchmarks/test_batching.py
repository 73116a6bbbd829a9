"""benchmarks/batching.py's mix of voices: the copies it serves as voices, and who speaks which."""

from __future__ import annotations

import filecmp

from voxwire.benchmarks.batching import voice_copies, voice_of
from voxwire.engine.piper.engine import default_voices, voice_files_from_path


def test_the_copies_are_the_default_voice_under_other_names(tmp_path):
    (joe,) = default_voices()
    copies = [voice_files_from_path(p) for p in voice_copies(tmp_path, 3)]
    assert [v.id for v in copies] == ["joe1", "joe2", "joe3"]
    for v in copies:
        assert filecmp.cmp(v.model, joe.model, shallow=False) and filecmp.cmp(v.config, joe.config, shallow=False)


def test_clients_take_the_voices_in_turn():
    assert [voice_of(["a", "b", "c"], i) for i in range(4)] == [{"voice": v} for v in "abca"]
    assert voice_of([], 5) == {}  # the server's default voice
