import assert from 'node:assert/strict';
import { test } from 'node:test';
import { toFloat32 } from '../pcm.js';

test('pcm_s16le at an odd byte offset (as in a msgpack frame)', () => {
  const frame = Uint8Array.of(0xaa, 0xff, 0x7f, 0x01, 0x80, 0x00, 0x00);
  const x = toFloat32(frame.subarray(1), 'pcm_s16le');
  assert.deepEqual([...x], [1, -32767 / 32767, 0]);
});

test('pcm_f32le', () => {
  const buf = new Uint8Array(9);
  const view = new DataView(buf.buffer);
  view.setFloat32(1, 0.5, true);
  view.setFloat32(5, -0.25, true);
  assert.deepEqual([...toFloat32(buf.subarray(1), 'pcm_f32le')], [0.5, -0.25]);
});

test('mulaw: silence, extremes and symmetry', () => {
  const x = toFloat32(Uint8Array.of(0xff, 0x7f, 0x80, 0x00), 'mulaw');
  assert.equal(x[0], 0);
  assert.equal(x[1], 0);
  assert.ok(Math.abs(x[2] - 32124 / 32767) < 1e-6);
  assert.ok(Math.abs(x[3] + 32124 / 32767) < 1e-6);
});

test('alaw: the smallest levels by silence, extremes and symmetry', () => {
  const x = toFloat32(Uint8Array.of(0xd5, 0x55, 0xaa, 0x2a, 0xc5, 0x45), 'alaw');
  assert.deepEqual([...x], [8, -8, 32256, -32256, 264, -264].map((v) => Math.fround(v / 32767)));
});

test('refuses unknown formats and partial samples', () => {
  assert.throws(() => toFloat32(new Uint8Array(4), 'opus'), /unknown/);
  assert.throws(() => toFloat32(new Uint8Array(3), 'pcm_s16le'), /whole number/);
});
