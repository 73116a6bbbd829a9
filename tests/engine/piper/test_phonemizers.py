"""A voice whose config names one of piper-tts's phonemizers other than espeak-ng's is
refused at start, in one line naming what it lacks, where that phonemizer could not run
here: a package it imports, or (Chinese) the g2pW model, which piper-tts would otherwise
download on first use. Nothing is downloaded."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import pytest

from voxwire.engine.base import EngineError
from voxwire.engine.errors import ErrorCode


def voice_of(kind: str, reference: Path, folder: Path) -> Path:
    """The reference voice's model, with its config naming the ``kind`` phonemizer."""
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / f"{kind}.onnx"
    shutil.copy(reference, model)
    config = json.loads(Path(f"{reference}.json").read_text(encoding="utf-8"))
    config["phoneme_type"] = kind
    Path(f"{model}.json").write_text(json.dumps(config), encoding="utf-8")
    return model


@pytest.fixture
def no_downloads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a download was attempted: {args}")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)


def load(model: Path):
    from voxwire.engine.piper.engine import PiperEngine, voice_files_from_path

    return PiperEngine([voice_files_from_path(model)], precision="fp32")


def test_a_chinese_voice_without_its_g2pw_model_is_refused_naming_where_it_goes(reference_voices, tmp_path,
                                                                                no_downloads):
    model = voice_of("pinyin", reference_voices["x_low"], tmp_path / "zh")
    with pytest.raises(EngineError) as refused:
        load(model)
    assert refused.value.code == ErrorCode.MODEL_MISSING
    assert "'pinyin'" in refused.value.message and "pinyin phonemizer" in refused.value.message
    assert str(tmp_path / "zh" / "g2pW" / "g2pw.onnx") in refused.value.message
    # With the model in place, it is no longer named (what else is missing still is).
    from voxwire.engine.piper.engine import phonemizer_missing

    (tmp_path / "zh" / "g2pW").mkdir()
    (tmp_path / "zh" / "g2pW" / "g2pw.onnx").write_bytes(b"")
    assert not any("g2pw.onnx" in m for m in phonemizer_missing("pinyin", tmp_path / "zh"))


@pytest.mark.parametrize("kind, package", [("japanese", "pyopenjtalk"), ("thai", "tltk")])
def test_a_voice_whose_phonemizer_needs_a_package_not_installed_is_refused_naming_it(reference_voices, tmp_path,
                                                                                      kind, package):
    import importlib.util

    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    with pytest.raises(EngineError) as refused:
        load(voice_of(kind, reference_voices["x_low"], tmp_path))
    assert refused.value.code == ErrorCode.MODEL_MISSING and f"pip install {package}" in refused.value.message


def test_espeak_and_hebrew_voices_need_nothing_more(reference_voices, tmp_path, no_downloads):
    engine = load(voice_of("hebrew", reference_voices["x_low"], tmp_path))
    assert [v.id for v in engine.voices()] == ["hebrew"]
    assert [v.id for v in load(reference_voices["x_low"]).voices()] == ["x_low"]
