// player.js with the real worklet processor (player-worklet.js and jitter.js), in Node: a
// fake AudioContext hands the processor render quanta when the test says so, and a fake
// port delivers messages asynchronously, as a real MessagePort does.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Emitter } from '../emitter.js';

const RATE = 48000;
const Q = 128;
let Processor = null;
globalThis.sampleRate = RATE;
globalThis.currentTime = 0;
globalThis.registerProcessor = (name, cls) => { Processor = cls; };

class FakePort {
  postMessage(m) { queueMicrotask(() => this.peer.onmessage?.({ data: m })); }
}
globalThis.AudioWorkletProcessor = class { constructor() { this.port = new FakePort(); } };
globalThis.AudioWorkletNode = class {
  constructor(ctx, name, options) {
    const proc = new Processor(options);
    this.port = new FakePort();
    this.port.peer = proc.port;
    proc.port.peer = this.port;
    ctx.processor = proc;
  }
  connect() {}
};
await import('../player-worklet.js');
const { Player } = await import('../player.js');

class FakeContext {
  constructor({ worklet = true } = {}) {
    this.sampleRate = RATE;
    this.destination = {};
    this.audioWorklet = worklet ? { addModule: async () => {} } : undefined;
    this.output = [];
  }
  async resume() {}
  /** Render `quanta` quanta, letting messages through between them; returns their output. */
  async render(quanta) {
    const start = this.output.length;
    for (let i = 0; i < quanta; i++) {
      await new Promise((r) => setImmediate(r));
      const out = new Float32Array(Q);
      this.processor?.process([], [[out]]);
      globalThis.currentTime += Q / RATE;
      this.output.push(...out);
    }
    await new Promise((r) => setImmediate(r));
    return this.output.slice(start);
  }
}

class FakeUtterance extends Emitter {
  cancel() { this.cancelled = true; this.emit('cancel', this); }
  audio(samples, sampleRate = RATE) { this.emit('audio', { samples: Float32Array.from(samples), sampleRate }); }
  done() { this.emit('done', {}); }
}

const ramp = (from, n) => Array.from({ length: n }, (_, i) => (from + i) / 1e6);
const settled = async (p) => Promise.race([p, new Promise((r) => setImmediate(() => r('pending')))]);

async function setup(opts) {
  const context = new FakeContext(opts);
  const player = new Player({ context, startMs: 100 });
  await player.start();
  return { context, player };
}

test('an utterance plays from the threshold on, whole and in order, and reports what it played', async () => {
  const { context, player } = await setup();
  const u = new FakeUtterance();
  const finished = player.play(u);
  u.audio(ramp(1, 3000)); // under 100 ms (4800): wait
  assert.ok((await context.render(10)).every((x) => x === 0));
  u.audio(ramp(3001, 3000));
  u.audio(ramp(6001, 3000));
  u.done();
  const out = await context.render(80);
  const first = out.findIndex((x) => x !== 0);
  assert.deepEqual(out.slice(first, first + 9000), ramp(1, 9000).map(Math.fround));
  const result = await finished;
  assert.equal(result.played, 9000);
  assert.equal(result.underruns, 0);
  assert.equal(result.dropped, false);
  assert.equal(player.stats.state, 'idle');
});

test('queued utterances play one after the other, each counted exactly', async () => {
  const { context, player } = await setup();
  const a = new FakeUtterance();
  const b = new FakeUtterance();
  const pa = player.play(a);
  const pb = player.play(b);
  b.audio(ramp(500001, 6000)); // b streams at the same time as a: held back
  a.audio(ramp(1, 6000));
  b.done();
  await context.render(20);
  a.audio(ramp(6001, 1000));
  a.done();
  await context.render(150);
  const nonzero = context.output.filter((x) => x !== 0);
  assert.deepEqual(nonzero, [...ramp(1, 7000), ...ramp(500001, 6000)].map(Math.fround));
  assert.equal((await pa).played, 7000);
  assert.equal((await pb).played, 6000);
});

test('cancelling a queued utterance drops only it', async () => {
  const { context, player } = await setup();
  const [a, b, c] = [new FakeUtterance(), new FakeUtterance(), new FakeUtterance()];
  const [pa, pb, pc] = [a, b, c].map((u) => player.play(u));
  a.audio(ramp(1, 6000));
  b.audio(ramp(100001, 6000));
  c.audio(ramp(200001, 6000));
  [a, b, c].forEach((u) => u.done());
  await context.render(10);
  b.cancel();
  const out = await context.render(150);
  assert.equal((await pb).played, 0);
  assert.equal((await pb).dropped, true);
  assert.equal((await pa).played, 6000);
  assert.equal((await pc).played, 6000);
  assert.ok(!out.some((x) => x >= 0.1 && x < 0.2)); // nothing of b was heard
});

test('stop silences at once, cancels everything and settles with what was played', async () => {
  const { context, player } = await setup();
  const a = new FakeUtterance();
  const b = new FakeUtterance();
  const pa = player.play(a);
  const pb = player.play(b);
  a.audio(ramp(1, 48000));
  await context.render(20);
  player.stop();
  const after = await context.render(20);
  assert.ok(a.cancelled && b.cancelled);
  // At most the quantum that was already being rendered when stop() ran.
  assert.ok(after.slice(Q).every((x) => x === 0));
  const ra = await pa;
  assert.equal(ra.dropped, true);
  assert.ok(ra.played > 0 && ra.played <= 21 * Q, `${ra.played}`);
  assert.equal((await pb).played, 0);
  assert.equal(player.stats.buffered, 0);
  a.audio(ramp(1, 100)); // late frames of a stopped utterance go nowhere
  assert.equal(player.stats.buffered, 0);
  const c = new FakeUtterance(); // and the player is ready for the next one
  const pc = player.play(c);
  c.audio(ramp(1, 5000));
  c.done();
  await context.render(60);
  assert.equal((await pc).played, 5000);
});

test('a stream at another rate is resampled to the context rate', async () => {
  const { context, player } = await setup();
  const u = new FakeUtterance();
  const finished = player.play(u);
  for (let i = 0; i < 5; i++) u.audio(new Array(2400).fill(0.5), 24000);
  u.done();
  await context.render(220);
  const result = await finished;
  assert.equal(result.played, 24000); // 12000 samples at 24 kHz are 24000 at 48 kHz
});

test('an utterance that fails midway plays what it received; a non-terminal error changes nothing', async () => {
  const { context, player } = await setup();
  const u = new FakeUtterance();
  const finished = player.play(u);
  u.audio(ramp(1, 6000));
  u.emit('error', { code: 'text_too_long', terminal: false });
  assert.equal(await settled(finished), 'pending');
  u.emit('error', { code: 'engine_error', terminal: true });
  await context.render(60);
  assert.equal((await finished).played, 6000);
});

test('without AudioWorklet (an insecure page) play() rejects clearly and cancels', async () => {
  const context = new FakeContext({ worklet: false });
  const player = new Player({ context });
  const u = new FakeUtterance();
  await assert.rejects(player.play(u), /secure context/);
  assert.ok(u.cancelled);
});

test('progress() counts each utterance from its own first sample; one waiting its turn shows nothing yet', async () => {
  const { context, player } = await setup();
  const a = new FakeUtterance();
  const b = new FakeUtterance();
  const pa = player.play(a);
  const pb = player.play(b);
  assert.equal(player.pending, 2);
  assert.equal(player.progress(new FakeUtterance()), null);
  a.audio(ramp(1, 6000)); // over the 100 ms threshold (4800): plays at once
  b.audio(ramp(1, 5000));
  b.done();
  await context.render(20);
  const pA = player.progress(a);
  assert.equal(pA.state, 'playing');
  assert.ok(pA.played > 0 && pA.played === player.stats.played, `${pA.played}`); // the first: all the worklet played
  assert.deepEqual(player.progress(b), { state: 'queued', played: 0, underruns: 0, stalledSamples: 0, buffered: 5000 });
  a.done();
  // Until b plays, with a's 6000 samples behind it in the worklet's counter.
  let pB;
  for (let i = 0; i < 100 && !(pB?.state === 'playing'); i++) {
    await context.render(1);
    pB = player.progress(b);
  }
  assert.equal(pB.state, 'playing');
  assert.equal(pB.played, player.stats.played - 6000);
  assert.ok(pB.played <= 5000);
  assert.deepEqual(player.progress(a), { state: 'done', played: 6000, underruns: 0, stalledSamples: 0, buffered: 0 });
  assert.equal(player.pending, 1);
  await context.render(60);
  await Promise.all([pa, pb]);
  assert.deepEqual(player.progress(b), { state: 'done', played: 5000, underruns: 0, stalledSamples: 0, buffered: 0 });
  assert.equal(player.pending, 0);
});

test("progress(): an underrun is counted for the utterance it happened in, not the next", async () => {
  const { context, player } = await setup();
  const a = new FakeUtterance();
  const b = new FakeUtterance();
  player.play(a);
  const pb = player.play(b);
  a.audio(ramp(1, 4800));
  await context.render(60); // a runs dry while more is due
  assert.equal(player.progress(a).state, 'stalled');
  assert.equal(player.progress(a).underruns, 1);
  assert.ok(player.progress(a).stalledSamples > 0);
  a.audio(ramp(4801, 4800));
  a.done();
  b.audio(ramp(1, 4800));
  b.done();
  await context.render(150);
  const rb = await pb;
  assert.equal(player.stats.underruns, 1);
  assert.equal(player.progress(a).underruns, 1);
  assert.equal(rb.underruns, 0);
  assert.equal(player.progress(b).underruns, 0);
  assert.equal(player.progress(b).stalledSamples, 0);
});

test('after stop() nothing is pending, and what never played shows as dropped with nothing played', async () => {
  const { context, player } = await setup();
  const us = [1, 2, 3].map(() => new FakeUtterance());
  const done = us.map((u) => player.play(u));
  us[0].audio(ramp(1, 48000));
  us[2].audio(ramp(1, 4800));
  await context.render(20);
  assert.equal(player.pending, 3);
  player.stop();
  assert.equal(player.pending, 0); // at once: nothing is left to play, whatever the worklet says yet
  assert.deepEqual(player.progress(us[2]), { state: 'dropped', played: 0, underruns: 0, stalledSamples: 0, buffered: 0 });
  await context.render(5);
  await Promise.all(done);
  assert.equal(player.progress(us[0]).state, 'dropped');
  assert.equal(player.progress(us[0]).played, (await done[0]).played);
});

test('the player reports what it has played to the utterance, at the stream rate (flow control)', async () => {
  const { context, player } = await setup();
  const u = new FakeUtterance();
  u.sampleRate = RATE / 2; // a 24 kHz stream, played at 48 kHz
  const reports = [];
  u.played = (n) => reports.push(n);
  const finished = player.play(u);
  assert.deepEqual(reports, [0]); // paced from the first step
  for (let i = 0; i < 4; i++) u.audio(ramp(1 + i * 2400, 2400), RATE / 2);
  u.done();
  await context.render(200);
  const result = await finished;
  assert.ok(reports.length > 2);
  assert.ok(reports.every((n, i) => i === 0 || n >= reports[i - 1])); // a running total
  assert.ok(reports.at(-1) <= 4 * 2400 && reports.at(-1) >= result.played / 2 - 2 * Q);
});
