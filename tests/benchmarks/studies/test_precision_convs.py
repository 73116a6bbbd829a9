"""benchmarks/studies/precision_convs.py on a tiny random HiFi-GAN: its int8 layers and decoders
follow fp32 (and the ConvTransposes are right, which torch's x86/onednn int8 kernels were not
here for in != out channels), the shapes it times cover every conv, and its tables render."""

from __future__ import annotations

import torch

from voxwire.benchmarks.studies.precision_convs import (
    QDQ, calibrate, captured, convs, decoder_table, int8_decoders, layer_shapes, layer_table, quantised, snr_db,
)
from voxwire.engine.piper.vits import Generator, VitsConfig, to_cl

TINY = VitsConfig(inter_channels=8, upsample_initial_channel=32, upsample_rates=(4, 2), upsample_kernel_sizes=(8, 4),
                  resblock_kernel_sizes=(3, 5), resblock_dilation_sizes=((1, 2), (2, 6)))


def tiny() -> tuple[Generator, list[torch.Tensor]]:
    torch.manual_seed(0)
    dec = Generator(TINY).eval()
    return dec, [torch.randn(1, 8, n) for n in (20, 33)]


def test_int8_layers_and_decoders_follow_fp32() -> None:
    dec, zs = tiny()
    qp = calibrate(dec, zs)
    io: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    captured(dec, zs[:1], lambda n, x, y: io.__setitem__(n, (x.clone(), y.clone())))  # y is added to in place
    with torch.inference_mode():
        for name in ("ups.0", "ups.1", "resblocks.0.convs.1"):  # ups: 32 -> 16 and 16 -> 8 channels
            x, y = io[name]
            snr = snr_db(y, QDQ(quantised(convs(dec)[name], qp[name][1]), qp[name][0])(x))
            assert 25 < snr < 60, (name, snr)  # near fp32, and really int8
        ref = dec(to_cl(zs[0]))
        for name, d in int8_decoders(dec, qp).items():
            snr = snr_db(ref, d(to_cl(zs[0])))
            assert 15 < snr < 60, (name, snr)


def test_the_timed_shapes_cover_every_conv_once() -> None:
    dec, zs = tiny()
    shapes = layer_shapes(dec, zs[0])
    assert sum(s["calls"] for s in shapes.values()) == len(convs(dec))
    assert [s["frames"] for n, s in shapes.items() if n.startswith("ups")] == [20, 80]
    assert shapes["conv_post"]["frames"] == 160 and len(shapes) == 1 + 2 + 2 * 4 + 1


def test_tables_render_a_tiny_result() -> None:
    ms = {"fp32": 2.0, "bf16": 1.0, "int8": 0.5, "int8+q/dq": 0.8}
    rows = [{"layer": "ups.0", "shape": "256→128 k16 s8", "frames": 150, "calls": 1, "ms": ms,
             "snr_db": {"int8+q/dq": 26.04}},
            {"layer": "conv_pre", "shape": "192→256 k7 d1", "frames": 150, "calls": 1,
             "ms": {**ms, "int8 fp32-out": 0.6}, "snr_db": {"int8+q/dq": 35.0}}]
    lines = layer_table(rows)
    assert len(lines) == 4
    assert lines[2].endswith("| – | 0.50 | 0.80 | 26.0 |") and lines[3].endswith("| 0.600 | 0.50 | 0.60 | 35.0 |")
    d = {"frames": 150, "ms": {"fp32": 20.0, "bf16": 10.0, "int8+q/dq": 12.0},
         "snr_db": {"bf16": [38.0, 40.0, 41.0], "int8+q/dq": [14.0, 16.0, 20.0], "int8 weights only": [21.0]}}
    lines = decoder_table(d)
    assert lines[2] == "| fp32 | 20.00 | 1.00 | 2.00 | – | – |"
    assert lines[4] == "| int8+q/dq | 12.00 | 0.60 | 1.20 | 14.0 | 16.0 |"
    assert lines[5] == "| int8 weights only | – | – | – | 21.0 | 21.0 |"
