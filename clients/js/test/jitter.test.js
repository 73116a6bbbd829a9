import assert from 'node:assert/strict';
import { test } from 'node:test';
import { JitterBuffer } from '../jitter.js';

const Q = 128; // a Web Audio render quantum
const ramp = (from, n) => Float32Array.from({ length: n }, (_, i) => from + i);

// Read `quanta` render quanta; return everything output, in order.
function play(b, quanta) {
  const out = [];
  const q = new Float32Array(Q);
  for (let i = 0; i < quanta; i++) {
    b.read(q);
    out.push(...q);
  }
  return out;
}

test('silence, not playback, until the start threshold is buffered', () => {
  const b = new JitterBuffer({ startSamples: 1000 });
  assert.equal(b.state, 'idle');
  b.write(ramp(1, 600));
  assert.equal(b.state, 'buffering');
  assert.ok(play(b, 3).every((x) => x === 0));
  assert.equal(b.played, 0);
  assert.equal(b.underruns, 0); // waiting to start is not an underrun
  b.write(ramp(601, 600));
  const out = play(b, 1);
  assert.equal(b.state, 'playing');
  assert.deepEqual(out, [...ramp(1, Q)]);
});

test('chunk seams are sample-contiguous whatever the chunk and quantum sizes', () => {
  const b = new JitterBuffer({ startSamples: 0, capacity: 1000 }); // small ring: wraps many times
  const sizes = [441, 37, 900, 1, 128, 333];
  let next = 1;
  const out = [];
  for (let round = 0; round < 20; round++) {
    const n = sizes[round % sizes.length];
    b.write(ramp(next, n));
    next += n;
    while (b.buffered >= Q) out.push(...play(b, 1));
  }
  assert.deepEqual(out, [...ramp(1, out.length)]); // 1, 2, 3, ... with no gap or repeat
  assert.equal(b.underruns, 0);
  assert.equal(b.played, out.length);
});

test('an underrun plays silence, is counted once, and playback resumes at the threshold', () => {
  const b = new JitterBuffer({ startSamples: 256 });
  b.write(ramp(1, 300));
  const first = play(b, 3); // 300 samples, then the ring runs dry in the third quantum
  assert.deepEqual(first.slice(0, 300), [...ramp(1, 300)]);
  assert.ok(first.slice(300).every((x) => x === 0));
  assert.equal(b.state, 'stalled');
  assert.equal(b.underruns, 1);
  assert.equal(b.stalledSamples, 3 * Q - 300);
  play(b, 2); // still dry: the same underrun, longer
  assert.equal(b.underruns, 1);
  assert.equal(b.stalledSamples, 5 * Q - 300);
  b.write(ramp(301, 100)); // below the threshold: keep waiting (no stutter of tiny pieces)
  play(b, 1);
  assert.equal(b.state, 'stalled');
  b.write(ramp(401, 200));
  assert.deepEqual(play(b, 1), [...ramp(301, Q)]);
  assert.equal(b.state, 'playing');
  assert.equal(b.stalledSamples, 6 * Q - 300);
});

test('the end of input plays the rest below the threshold and is not an underrun', () => {
  const b = new JitterBuffer({ startSamples: 10000 });
  b.write(ramp(1, 200));
  b.end('u1');
  const out = play(b, 3);
  assert.deepEqual(out.slice(0, 200), [...ramp(1, 200)]);
  assert.equal(b.state, 'idle');
  assert.equal(b.underruns, 0);
  assert.equal(b.stalledSamples, 0);
  assert.equal(b.played, 200);
  assert.deepEqual(b.takeReached(), ['u1']);
  assert.deepEqual(b.takeReached(), []);
});

test('marks are reached when playback passes them, not when they are written', () => {
  const b = new JitterBuffer({ startSamples: 0 });
  b.write(ramp(1, 300));
  b.end('a');
  assert.deepEqual(b.takeReached(), []);
  play(b, 2);
  assert.deepEqual(b.takeReached(), []); // 256 of 300 played
  play(b, 1);
  assert.deepEqual(b.takeReached(), ['a']);
});

test('skip drops everything buffered at once (barge-in)', () => {
  const b = new JitterBuffer({ startSamples: 0 });
  b.write(ramp(1, 5000));
  play(b, 2);
  b.skip();
  assert.equal(b.buffered, 0);
  assert.equal(b.state, 'idle');
  assert.ok(play(b, 4).every((x) => x === 0));
  assert.equal(b.played, 2 * Q);
  assert.equal(b.underruns, 0); // stopping is not running dry
  b.write(ramp(9000, Q)); // and the next utterance plays normally
  b.end('next');
  assert.deepEqual(play(b, 1), [...ramp(9000, Q)]);
  assert.deepEqual(b.takeReached(), ['next']);
});

test('skip to a position drops only what is before it, and passes its marks', () => {
  const b = new JitterBuffer({ startSamples: 0 });
  b.write(ramp(1, 200));
  b.end('first');
  b.write(ramp(1001, 200));
  b.skip(200);
  assert.deepEqual(b.takeReached(), ['first']);
  assert.deepEqual(play(b, 1), [...ramp(1001, Q)]);
});

test('the ring grows instead of dropping audio that arrives far ahead', () => {
  const b = new JitterBuffer({ startSamples: 0, capacity: 256 });
  b.write(ramp(1, 200));
  play(b, 1); // read position inside the ring, so growth must unwrap correctly
  for (let i = 0; i < 10; i++) b.write(ramp(201 + 300 * i, 300));
  assert.ok(b.ring.length >= b.buffered);
  const out = play(b, Math.ceil(b.buffered / Q));
  assert.deepEqual(out.slice(0, 3072), [...ramp(Q + 1, 3072)]);
});
