import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Resampler } from '../resampler.js';

const sine = (n, rate, hz) => Float32Array.from({ length: n }, (_, i) => Math.sin((2 * Math.PI * hz * i) / rate));

function runChunked(r, x, sizes) {
  const parts = [];
  for (let at = 0, k = 0; at < x.length; k++) {
    const n = sizes[k % sizes.length];
    parts.push(...r.process(x.subarray(at, at + n)));
    at += n;
  }
  parts.push(...r.flush());
  return Float32Array.from(parts);
}

for (const [from, to] of [[22050, 44100], [16000, 48000], [24000, 44100], [48000, 44100], [44100, 16000]]) {
  test(`${from} -> ${to}: chunked output equals whole output, with the right length`, () => {
    const x = sine(from, from, 220); // one second
    const whole = runChunked(new Resampler(from, to), x, [x.length]);
    const chunked = runChunked(new Resampler(from, to), x, [4410, 1, 777, 3200, 13]);
    assert.equal(chunked.length, whole.length);
    for (let i = 0; i < whole.length; i++) assert.ok(Math.abs(chunked[i] - whole[i]) < 1e-6, `sample ${i}`);
    assert.equal(whole.length, Math.ceil((x.length * to) / from));
  });
}

test('a sine keeps its frequency and amplitude, and the seams are smooth', () => {
  const from = 22050;
  const to = 48000;
  const hz = 440;
  const y = runChunked(new Resampler(from, to), sine(from, from, hz), [4410]);
  let worst = 0;
  for (let i = 0; i < y.length - 1000; i++) {
    worst = Math.max(worst, Math.abs(y[i] - Math.sin((2 * Math.PI * hz * i) / to)));
  }
  assert.ok(worst < 0.01, `error ${worst}`); // linear interpolation of a well-sampled tone
  let jump = 0;
  for (let i = 1; i < y.length; i++) jump = Math.max(jump, Math.abs(y[i] - y[i - 1]));
  assert.ok(jump < (2 * Math.PI * hz) / to + 1e-3, `largest step ${jump}`); // no click anywhere
});

test('equal rates pass samples through untouched', () => {
  const r = new Resampler(44100, 44100);
  const x = Float32Array.of(0.1, -0.2, 0.3);
  assert.deepEqual([...r.process(x)], [...x]);
  assert.equal(r.flush().length, 0);
});

test('refuses rates that are not positive', () => {
  assert.throws(() => new Resampler(0, 44100), RangeError);
});
