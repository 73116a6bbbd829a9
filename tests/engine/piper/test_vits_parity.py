"""The torch port of Piper's VITS against onnxruntime running the voice's own graph."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from voxwire.engine.piper.onnx_weights import VitsLoadError, load_vits, read_voice_config
from voxwire.engine.piper.vits import Vits, rq_spline_inverse

# Measured on this CPU: max abs error 1.1e-5 .. 2.4e-5, SNR 92 .. 98 dB (float32 in both
# runtimes, different kernels). The bounds leave ~8x / 20 dB for other CPUs' kernels
# while staying far tighter than the 1e-3 / 40 dB the engine needs.
MAX_ABS_ERROR = 2e-4
MIN_SNR_DB = 70.0


def ort_audio(piper_voice, ids, noise_scale=0.0, length_scale=1.0, noise_w=0.0) -> np.ndarray:
    feed = {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array([noise_scale, length_scale, noise_w], dtype=np.float32),
    }
    return piper_voice.session.run(None, feed)[0].reshape(-1)


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    ref = reference.astype(np.float64)
    return float(10 * np.log10(np.sum(ref**2) / np.sum((ref - test) ** 2)))


@pytest.mark.parametrize("text", ["short", "medium", "long"])
def test_matches_onnxruntime_deterministic(vits: Vits, piper_voice, phoneme_ids, text):
    ids = phoneme_ids[text]
    expected = ort_audio(piper_voice, ids)
    z, durations = vits.infer_latent(torch.tensor(ids), 0.0, 1.0, 0.0)
    audio = vits.decode(z)

    assert audio.dtype == torch.float32 and audio.shape == (1, z.shape[2] * vits.hop_length)
    got = audio[0].numpy()
    assert got.shape == expected.shape, "frame count differs from onnxruntime"
    err = float(np.max(np.abs(got - expected)))
    snr = snr_db(expected, got)
    assert err < MAX_ABS_ERROR, f"max abs error {err:.2e}"
    assert snr > MIN_SNR_DB, f"SNR {snr:.1f} dB"

    assert durations.dtype == torch.int64 and durations.shape == (len(ids),)
    assert int(durations.sum()) == z.shape[2]
    assert int(durations.min()) >= 1  # ceil(exp(.)) of every phoneme, noise off

    if text == "short":  # forward() is the same path end to end
        np.testing.assert_array_equal(vits(torch.tensor(ids), 0.0, 1.0, 0.0).numpy(), got)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_streaming_matches_onnxruntime(onnx_path, piper_voice, phoneme_ids):
    """The engine's path (infer_prior + stream_chunks) on CUDA: the pieces come back to
    the host and the audio holds the issue's tolerance against onnxruntime on the CPU."""
    from voxwire.engine.piper.chunked import stream_chunks

    model = load_vits(onnx_path, device="cuda")
    ids = phoneme_ids["long"]
    expected = ort_audio(piper_voice, ids)
    z_p, _ = model.infer_prior(torch.tensor(ids), 0.0, 1.0, 0.0)
    pieces = list(stream_chunks(model, z_p))
    assert all(isinstance(p, np.ndarray) and p.dtype == np.float32 for p in pieces)
    got = np.concatenate(pieces)
    assert got.shape == expected.shape, "frame count differs from onnxruntime"
    assert float(np.max(np.abs(got - expected))) < 1e-3
    assert snr_db(expected, got) > 40.0


def test_length_scale_matches_onnxruntime(vits: Vits, piper_voice, phoneme_ids):
    ids = phoneme_ids["short"]
    expected = ort_audio(piper_voice, ids, length_scale=1.4)
    got = vits(torch.tensor(ids), 0.0, 1.4, 0.0).numpy()
    assert got.shape == expected.shape
    assert snr_db(expected, got) > MIN_SNR_DB


def test_noise_is_seeded_and_sums_hold(vits: Vits, phoneme_ids):
    ids = torch.tensor(phoneme_ids["short"])
    run = lambda seed: vits.infer_latent(ids, 0.667, 1.0, 0.8, torch.Generator().manual_seed(seed))
    (z1, d1), (z2, d2), (z3, d3) = run(7), run(7), run(8)
    assert torch.equal(z1, z2) and torch.equal(d1, d2)
    assert not torch.equal(d1, d3)  # noise_w reaches the stochastic duration predictor
    for z, d in ((z1, d1), (z3, d3)):
        assert int(d.sum()) == z.shape[2] and bool(torch.isfinite(z).all())


def test_config_is_derived_from_the_graph(vits: Vits, onnx_path):
    cfg = vits.cfg
    assert (cfg.n_vocab, cfg.hidden_channels, cfg.n_heads, cfg.window_size) == (256, 192, 2, 4)
    assert (cfg.n_layers, cfg.filter_channels, cfg.kernel_size) == (6, 768, 3)
    assert (cfg.dp_n_flows, cfg.dp_num_bins, cfg.flow_n_flows, cfg.flow_n_layers) == (4, 10, 4, 4)
    assert cfg.resblock == "2" and cfg.resblock_dilation_sizes == ((1, 2), (2, 6), (3, 12))
    assert cfg.upsample_rates == (8, 8, 4) and vits.hop_length == 256
    assert vits.sample_rate == read_voice_config(onnx_path).sample_rate == 22050


def test_anonymous_initializers_land_on_the_right_parameters(vits: Vits, onnx_path):
    import onnx
    from onnx import numpy_helper

    inits = {t.name: t for t in onnx.load(str(onnx_path)).graph.initializer}
    params = dict(vits.named_parameters())

    def same(param: str, init: str) -> bool:
        return np.array_equal(params[param].numpy(), numpy_helper.to_array(inits[init]))

    # Embedding exported under the (unused) speaker input's name, found via its Gather.
    assert same("enc_p.emb.weight", "sid")
    # Folded weight-norm convs, found via the Conv node that consumes them.
    assert same("flow.flows.6.enc.in_layers.0.weight", "onnx::Conv_8168")
    assert same("flow.flows.0.enc.res_skip_layers.3.weight", "onnx::Conv_8261")
    # exp(-logs) folded into a constant.
    np.testing.assert_allclose(
        torch.exp(-params["dp.flows.0.logs"]).numpy(),
        numpy_helper.to_array(inits["/dp/flows.0/Exp_output_0"]),
        rtol=1e-6,
    )


def _spline_forward(x, uw, uh, ud, bound, min_bin=1e-3, min_d=1e-3):
    """Reference forward RQ spline in float64 numpy (linear tails)."""
    def knots(u):
        e = np.exp(u - u.max(-1, keepdims=True))
        s = min_bin + (1 - min_bin * u.shape[-1]) * e / e.sum(-1, keepdims=True)
        k = np.concatenate([np.zeros(s.shape[:-1] + (1,)), np.cumsum(s, -1)], -1)
        k = k * 2 * bound - bound
        k[..., 0], k[..., -1] = -bound, bound
        return k

    tail = np.log(np.exp(1 - min_d) - 1)
    padded = np.pad(ud, [(0, 0)] * (ud.ndim - 1) + [(1, 1)], constant_values=tail)
    d = min_d + np.log1p(np.exp(padded))
    cw, ch = knots(uw), knots(uh)
    out = x.copy()
    for i in np.ndindex(x.shape):
        if not -bound <= x[i] <= bound:
            continue
        k = min(np.searchsorted(cw[i], x[i], side="right") - 1, uw.shape[-1] - 1)
        w, h = cw[i][k + 1] - cw[i][k], ch[i][k + 1] - ch[i][k]
        delta, t = h / w, (x[i] - cw[i][k]) / w
        num = h * (delta * t**2 + d[i][k] * t * (1 - t))
        den = delta + (d[i][k] + d[i][k + 1] - 2 * delta) * t * (1 - t)
        out[i] = ch[i][k] + num / den
    return out


@pytest.mark.parametrize(
    "dtype, scale, tol", [(torch.float64, 2.0, 1e-8), (torch.float32, 0.5, 1e-4)]
)
def test_spline_inverse_inverts_the_forward_spline(dtype, scale, tol):
    # float64 checks the algebra on steep random splines; float32 (the runtime dtype)
    # on well-conditioned ones, since a nearly flat bin makes any inverse ill-posed.
    rng = np.random.default_rng(0)
    shape, bins, bound = (2, 1, 300), 10, 5.0
    uw, uh = (rng.normal(size=shape + (bins,)) * scale for _ in range(2))
    ud = rng.normal(size=shape + (bins - 1,))
    x = rng.uniform(-7, 7, size=shape)  # includes the identity tails
    y = _spline_forward(x, uw, uh, ud, bound)
    t = lambda a: torch.tensor(a, dtype=dtype)
    back = rq_spline_inverse(t(y), t(uw), t(uh), t(ud), bound).numpy()
    assert np.max(np.abs(back - x)) < tol
    outside = np.abs(x) > bound
    assert outside.any() and np.array_equal(back[outside], t(y).numpy()[outside])


# ------------------------------------------------------------------- refusing bad files


@pytest.fixture(scope="module")
def onnx_model(onnx_path):
    import onnx

    return onnx.load(str(onnx_path))


def _write_variant(onnx_model, onnx_path, tmp_path, edit) -> str:
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(onnx_model)
    edit(model.graph)
    out = tmp_path / "voice.onnx"
    onnx.save(model, str(out))
    shutil.copy(f"{onnx_path}.json", f"{out}.json")
    return str(out)


def _replace(graph, name: str, shape: tuple[int, ...]) -> None:
    from onnx import numpy_helper

    (i,) = [k for k, t in enumerate(graph.initializer) if t.name == name]
    graph.initializer[i].CopyFrom(numpy_helper.from_array(np.zeros(shape, np.float32), name))


@pytest.mark.parametrize(
    "initializer, shape, reported",
    [
        ("dec.resblocks.4.convs.1.weight", (64, 64, 3), "dec.resblocks.4.convs.1.weight"),
        # An anonymous tensor is reported under the parameter it resolves to.
        ("onnx::Conv_8171", (384, 192, 3), "flow.flows.6.enc.res_skip_layers.0.weight"),
    ],
)
def test_wrong_shape_is_refused(onnx_model, onnx_path, tmp_path, initializer, shape, reported):
    edit = lambda g: _replace(g, initializer, shape)  # noqa: E731
    path = _write_variant(onnx_model, onnx_path, tmp_path, edit)
    with pytest.raises(VitsLoadError, match=reported.replace(".", r"\.")) as info:
        load_vits(path)
    assert isinstance(info.value, ValueError)


def test_missing_tensor_is_refused(onnx_model, onnx_path, tmp_path):
    def drop(graph):
        (i,) = [k for k, t in enumerate(graph.initializer) if t.name == "dec.ups.1.bias"]
        del graph.initializer[i]

    with pytest.raises(VitsLoadError, match=r"missing tensor 'dec\.ups\.1\.bias'"):
        load_vits(_write_variant(onnx_model, onnx_path, tmp_path, drop))


def test_unmapped_tensor_is_refused(onnx_model, onnx_path, tmp_path):
    def rename(graph):
        for t in graph.initializer:
            if t.name == "onnx::Conv_8168":
                t.name = "onnx::Conv_99999"  # now consumed by nothing

    with pytest.raises(VitsLoadError, match="onnx::Conv_99999"):
        load_vits(_write_variant(onnx_model, onnx_path, tmp_path, rename))


def test_not_onnx_is_refused(tmp_path):
    path = tmp_path / "voice.onnx"
    path.write_bytes(b"\x00not a model" * 100)
    with pytest.raises(VitsLoadError):
        load_vits(path)


@pytest.mark.parametrize("bucket", [8, 32, 64])
def test_padding_to_a_bucket_changes_nothing(vits: Vits, phoneme_ids, bucket):
    for ids in phoneme_ids.values():
        whole, d_whole = vits.infer_prior(torch.tensor([ids]), 0.0, 1.0, 0.0)
        padded, d_padded = vits.infer_prior(torch.tensor([ids]), 0.0, 1.0, 0.0, bucket=bucket)
        assert torch.equal(d_whole, d_padded)
        assert whole.shape == padded.shape
        assert torch.max(torch.abs(whole - padded)) < 1e-5


def test_every_kernel_is_stored_in_the_order_its_call_reads(onnx_path):
    """Activations are channels-last [B, C, 1, T]; a kernel stored otherwise is reordered
    by oneDNN on every call (12% of an utterance's CPU time). Loading, .to() and .double()
    must keep the order."""
    from voxwire.engine.piper.vits import Conv, ConvTranspose

    model = load_vits(onnx_path)
    for m in (model, Vits(model.cfg).double()):
        convs = [(n, c) for n, c in m.named_modules() if isinstance(c, (Conv, ConvTranspose))]
        assert len(convs) > 50
        for name, conv in convs:
            assert conv.weight.unsqueeze(2).is_contiguous(memory_format=torch.channels_last), name
