"""The browser client's pure modules, in Node: its own unit tests (`node --test`), and
cross-checks against the server's real encoders (Python msgpack, server/audio.py) and the
Python client's decoder."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import msgpack
import numpy as np
import pytest

from tests.fixtures import g711
from voxwire.server.audio import encode
from voxwire.server.protocol import audio_frame
from voxwire_client.formats import to_float32

ROOT = Path(__file__).resolve().parents[3]
JS = ROOT / "clients" / "js"


def node() -> str:
    path = shutil.which("node")
    if path is None:
        pytest.fail("Node.js (20 or later) is needed for the JavaScript client's tests: `node` is not on PATH")
    return path


def run_js(script: str, stdin: str) -> object:
    """Run an ES module script in clients/js with `stdin`; it prints one JSON value."""
    run = subprocess.run(
        [node(), "--input-type=module", "-e", script], cwd=JS, input=stdin, capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.timeout(120)
def test_node_unit_tests_pass():
    # `node --test clients/js/test/`, with the files named: Node 21+ reads arguments as globs,
    # not directories, and the helpers there are no tests.
    files = sorted(str(f.relative_to(ROOT)) for f in (JS / "test").glob("*.test.js"))
    assert len(files) >= 6, files
    run = subprocess.run([node(), "--test", *files], cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    passed = int(re.search(r"^# pass (\d+)", run.stdout, re.M)[1])
    assert passed >= 35, f"only {passed} node tests ran"  # a renamed folder must not pass as "nothing failed"
    assert re.search(r"^# fail 0$", run.stdout, re.M)


DECODE = """
import { decode } from './msgpack.js';
let hex = '';
for await (const chunk of process.stdin) hex += chunk;
const out = (v) => v instanceof Uint8Array ? { $bin: Buffer.from(v).toString('base64') }
  : Array.isArray(v) ? v.map(out)
  : v && typeof v === 'object' ? Object.fromEntries(Object.entries(v).map(([k, x]) => [k, out(x)]))
  : v;
console.log(JSON.stringify(hex.trim().split(' ').map((h) => out(decode(Buffer.from(h, 'hex'))))));
"""


def as_json(v: object) -> object:
    if isinstance(v, bytes):
        return {"$bin": base64.b64encode(v).decode()}
    if isinstance(v, list | tuple):
        return [as_json(x) for x in v]
    if isinstance(v, dict):
        return {k: as_json(x) for k, x in v.items()}
    return v


@pytest.mark.timeout(60)
def test_decoder_reads_what_python_msgpack_writes():
    values = [
        {"type": "done", "ctx": "u1", "ttfa_ms": 181.3, "rtf": 0.2308, "chunks": 26, "samples": 111616, "ok": True, "x": None},
        [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**53 - 1, -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**53) + 1],
        ["", "é", "日本語", "x" * 31, "x" * 32, "x" * 255, "x" * 256, "x" * 70000],
        [b"", b"\x00\xff", bytes(range(256)) * 300],
        {str(i): i for i in range(20)},
        list(range(20)),
        [1.5, -0.0, 1e300, 3.14159],
    ]
    blobs = [msgpack.packb(v, use_bin_type=True) for v in values]
    blobs.append(msgpack.packb([0.25, -2.5], use_single_float=True))  # float32 as well
    got = run_js(DECODE, " ".join(b.hex() for b in blobs))
    assert got == [as_json(v) for v in values] + [[0.25, -2.5]]


PCM = """
import { decode } from './msgpack.js';
import { toFloat32 } from './pcm.js';
let text = '';
for await (const chunk of process.stdin) text += chunk;
const out = {};
for (const [format, hex] of Object.entries(JSON.parse(text))) {
  const frame = decode(Buffer.from(hex, 'hex'));
  out[format] = { ctx: frame.ctx, offset: frame.offset, samples: frame.samples, audio: Array.from(toFloat32(frame.audio, format)) };
}
console.log(JSON.stringify(out));
"""


@pytest.mark.timeout(60)
def test_audio_frames_from_the_server_decode_to_the_servers_own_samples():
    t = np.arange(2205) / 22050
    x = (0.8 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    x[:4] = [1.0, -1.0, 0.0, 1e-6]  # the extremes and near-silence too
    frames = {fmt: audio_frame("u7", 3, 6615, x.size, encode(x, fmt)).hex() for fmt in ("pcm_s16le", "pcm_f32le", "mulaw", "alaw")}
    got = run_js(PCM, json.dumps(frames))
    for fmt, frame in got.items():
        assert (frame["ctx"], frame["offset"], frame["samples"]) == ("u7", 6615, x.size)
        want = to_float32(encode(x, fmt), fmt)  # as the Python client decodes it: the browser must agree exactly
        np.testing.assert_array_equal(np.asarray(frame["audio"], np.float32), want, err_msg=fmt)


G711 = """
import { toFloat32 } from './pcm.js';
const codes = Uint8Array.from({ length: 256 }, (_, i) => i);
console.log(JSON.stringify(Object.fromEntries(['mulaw', 'alaw'].map((law) => [law, Array.from(toFloat32(codes, law))]))));
"""


@pytest.mark.timeout(60)
def test_every_g711_code_decodes_to_its_level():
    got = run_js(G711, "")
    for law in g711.LAWS:
        levels = g711.reference_levels(law)
        np.testing.assert_array_equal(levels, g711.ffmpeg_decode(law, bytes(range(256))), err_msg=law)
        np.testing.assert_array_equal(np.asarray(got[law], np.float32), levels.astype(np.float32) / 32767, err_msg=law)
