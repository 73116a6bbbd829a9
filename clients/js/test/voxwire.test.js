import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Voxwire, VoxwireError } from '../voxwire.js';
import { FakeSocket, READY, s16 } from './fake-socket.js';

const connect = (opts = {}) => new Voxwire('ws://x/v1/stream', { WebSocket: FakeSocket, ...opts });
const started = (ctx, extra = {}) => ({ type: 'started', ctx, voice: 'joe', format: 'pcm_s16le', sample_rate: 22050, chunk_ms: 200, speed: 1, ...extra });
const audio = (ctx, seq, offset, ...values) => ({ type: 'audio', ctx, seq, offset, samples: values.length, audio: s16(...values) });

test('connects on first use, queues messages until open, exposes ready', async () => {
  FakeSocket.last = null;
  const vx = connect({ sampleRate: 44100, format: 'pcm_f32le' });
  assert.equal(FakeSocket.last, null); // lazy: no socket until there is something to say
  const u = vx.speak('Hello.', { voice: 'joe', chunkMs: 150 });
  const ws = FakeSocket.last;
  assert.equal(ws.url, 'ws://x/v1/stream');
  assert.deepEqual(ws.sent, []); // not open yet
  ws.open();
  const ready = await vx.ready;
  assert.equal(ready.engine, 'tone');
  assert.deepEqual(vx.voices.map((v) => v.id), ['joe']);
  assert.equal(vx.serverDefaults.sample_rate, 22050);
  assert.deepEqual(ws.sent, [{
    type: 'speak', ctx: u.ctx, text: 'Hello.', final: true,
    sample_rate: 44100, format: 'pcm_f32le', voice: 'joe', chunk_ms: 150,
  }]);
});

test('a speaker goes with the voice, from the defaults or the speak, as a stream setting', async () => {
  FakeSocket.last = null;
  const vx = connect({ voice: 'chorus', speaker: 'bob' });
  const u1 = vx.speak('One.');
  const u2 = vx.speak('Two.', { speaker: 2 });
  const u3 = vx.stream({ speaker: null }); // the voice's default speaker
  const ws = FakeSocket.last;
  ws.open();
  await vx.ready;
  assert.deepEqual(ws.sent.map((m) => [m.ctx, m.voice, m.speaker]),
    [[u1.ctx, 'chorus', 'bob'], [u2.ctx, 'chorus', 2], [u3.ctx, 'chorus', null]]);
});

test('a lexicon is sent with the utterance', async () => {
  FakeSocket.last = null;
  const vx = connect();
  const u = vx.speak('I use Postgres.', { lexicon: { postgres: 'post gress' } });
  const ws = FakeSocket.last;
  ws.open();
  await vx.ready;
  assert.deepEqual(ws.sent.map((m) => [m.ctx, m.lexicon]), [[u.ctx, { postgres: 'post gress' }]]);
});

test('an SSML document is sent whole with its text format', async () => {
  FakeSocket.last = null;
  const vx = connect();
  const doc = '<speak>Hi <break time="500ms"/> there.</speak>';
  const u = vx.speak(doc, { textFormat: 'ssml' });
  const ws = FakeSocket.last;
  ws.open();
  await vx.ready;
  assert.deepEqual(ws.sent.map((m) => [m.ctx, m.text, m.text_format, m.final]), [[u.ctx, doc, 'ssml', true]]);
});

test('unknown settings are refused before anything is sent', () => {
  const vx = connect();
  assert.throws(() => vx.speak('x', { sampleRat: 16000 }), /unknown stream setting "sampleRat"/);
});

test('two utterances on one socket are demultiplexed by ctx and decoded', async () => {
  const vx = connect();
  const a = vx.speak('A.');
  const b = vx.speak('B.');
  const ws = FakeSocket.last;
  ws.open();
  const got = { [a.ctx]: [], [b.ctx]: [] };
  for (const u of [a, b]) u.on('audio', (f) => got[u.ctx].push(...f.samples));
  ws.json(started(a.ctx));
  ws.json(started(b.ctx, { format: 'pcm_s16le', sample_rate: 16000 }));
  ws.frame(audio(a.ctx, 0, 0, 32767, 0));
  ws.frame(audio(b.ctx, 0, 0, -32767));
  ws.frame(audio(a.ctx, 1, 2, 16384));
  ws.json({ type: 'done', ctx: b.ctx, samples: 1, ttfa_ms: 5 });
  ws.json({ type: 'done', ctx: a.ctx, samples: 3, ttfa_ms: 4 });
  assert.equal((await a.finished).samples, 3);
  assert.equal((await b.finished).samples, 1);
  assert.deepEqual(got[a.ctx], [1, 0, 16384 / 32767].map(Math.fround));
  assert.deepEqual(got[b.ctx], [-1]);
  assert.equal(b.sampleRate, 16000);
  assert.equal(a.samples, 3);
  assert.equal(a.state, 'done');
  assert.ok(a.ttfaMs >= 0);
});

test('streamed text: an open speak first, then pieces, a flush and the end', async () => {
  const vx = connect();
  const u = vx.stream({ voice: 'joe' });
  const ws = FakeSocket.last;
  ws.open();
  u.write('Hel').write('lo.').flush().end(' Bye.');
  assert.deepEqual(ws.sent.map((m) => [m.type, m.text, m.final]), [
    ['speak', '', false], ['speak', 'Hel', false], ['speak', 'lo.', false], ['flush', undefined, undefined], ['speak', ' Bye.', true],
  ]);
  assert.equal(ws.sent[0].voice, 'joe');
  assert.equal(ws.sent[1].voice, undefined); // settings only in the first speak
  assert.throws(() => u.write('more'), /final/);
});

test('cancel stops audio events at once, even for frames already on their way', async () => {
  const vx = connect();
  const u = vx.speak('Long.');
  const ws = FakeSocket.last;
  ws.open();
  ws.json(started(u.ctx));
  let frames = 0;
  const events = [];
  u.on('audio', () => frames++).on('cancelled', () => events.push('cancelled')).on('cancel', () => events.push('cancel'));
  ws.frame(audio(u.ctx, 0, 0, 1, 2));
  u.cancel();
  ws.frame(audio(u.ctx, 1, 2, 3, 4)); // in flight when the cancel left
  ws.json({ type: 'cancelled', ctx: u.ctx, samples_sent: 4, frames: 2 });
  assert.equal(frames, 1);
  assert.deepEqual(ws.sent.at(-1), { type: 'cancel', ctx: u.ctx });
  assert.deepEqual(events, ['cancelled', 'cancel']);
  assert.equal((await u.finished).type, 'cancelled');
  assert.equal(u.state, 'cancelled');
});

test('a terminal error rejects `finished` with its stable code; a non-terminal one does not end it', async () => {
  const vx = connect();
  const u = vx.speak('x', { voice: 'nobody' });
  const s = vx.stream();
  const ws = FakeSocket.last;
  ws.open();
  const seen = [];
  s.on('error', (e) => seen.push([e.code, e.terminal]));
  ws.json({ type: 'error', code: 'unknown_voice', message: "unknown voice 'nobody'", ctx: u.ctx, terminal: true });
  ws.json(started(s.ctx));
  ws.json({ type: 'error', code: 'text_too_long', message: 'too long', ctx: s.ctx, terminal: false });
  await assert.rejects(u.finished, (e) => e instanceof VoxwireError && e.code === 'unknown_voice' && /nobody/.test(e.message));
  assert.equal(u.state, 'error');
  assert.deepEqual(seen, [['text_too_long', false]]);
  assert.equal(s.state, 'streaming');
});

test('errors without a ctx go to the client; a closed socket fails live utterances, and the next one reconnects', async () => {
  const vx = connect();
  const u = vx.speak('x');
  const ws = FakeSocket.last;
  ws.open();
  const errors = [];
  vx.on('error', (e) => errors.push(e.code));
  ws.json({ type: 'error', code: 'invalid_json', message: 'bad' });
  assert.deepEqual(errors, ['invalid_json']);
  ws.close(1001, 'going away');
  await assert.rejects(u.finished, (e) => e.code === 'closed' && e.closeCode === 1001);
  vx.speak('again');
  assert.notEqual(FakeSocket.last, ws);
});

test('a connection refused before ready is reported as connect_failed', async () => {
  const vx = connect();
  const u = vx.speak('x');
  const ready = vx.ready;
  FakeSocket.last.close(1013, 'at capacity');
  await assert.rejects(ready, (e) => e.code === 'connect_failed' && e.closeCode === 1013);
  await assert.rejects(u.finished, (e) => e.code === 'connect_failed');
});

test('an API key is offered as a subprotocol beside voxwire.v1, and a refusal says so', async () => {
  const vx = connect({ token: 'k3y' });
  const u = vx.speak('x');
  assert.deepEqual(FakeSocket.last.protocols, ['voxwire.v1', 'voxwire.token.k3y']);
  FakeSocket.last.close(1008, 'invalid API key');
  await assert.rejects(u.finished, (e) => e.code === 'connect_failed' && e.closeCode === 1008 && /invalid API key/.test(e.message));
  connect().speak('x');
  assert.equal(FakeSocket.last.protocols, undefined); // no key: no subprotocol at all
});

test('timestamps: asked for with a setting, collected on the utterance and emitted', async () => {
  const vx = connect();
  const u = vx.speak('Hello there.', { timestamps: true });
  const ws = FakeSocket.last;
  ws.open();
  assert.equal(ws.sent.find((m) => m.type === 'speak').timestamps, true);
  const seen = [];
  u.on('timestamps', (words) => seen.push(...words));
  ws.json(started(u.ctx));
  ws.json({ type: 'timestamps', ctx: u.ctx, words: [{ word: 'Hello', start_ms: 20, end_ms: 310 }] });
  ws.frame(audio(u.ctx, 0, 0, 1));
  ws.json({ type: 'timestamps', ctx: u.ctx, words: [{ word: 'there', start_ms: 330, end_ms: 600 }] });
  ws.json({ type: 'done', ctx: u.ctx, samples: 1, ttfa_ms: 3 });
  await u.finished;
  assert.deepEqual(u.words.map((w) => w.word), ['Hello', 'there']);
  assert.deepEqual(seen, u.words);
});

const nextEvent = (emitter, type) => new Promise((resolve) => {
  const fn = (v) => { emitter.off(type, fn); resolve(v); };
  emitter.on(type, fn);
});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test('with `reconnect`, a lost connection is reopened by itself, the delay doubling while attempts fail', async () => {
  const vx = connect({ reconnect: { minMs: 4, maxMs: 16 } });
  const events = [];
  vx.on('close', (e) => events.push(['close', e.code])).on('reconnecting', (r) => events.push(['reconnecting', r.attempt]));
  const u = vx.speak('x');
  let ws = FakeSocket.last;
  ws.open();
  await vx.ready;
  assert.equal(vx.reconnecting, null);
  let scheduled = nextEvent(vx, 'reconnecting');
  ws.close(1006); // dropped: no close frame
  await assert.rejects(u.finished, (e) => e.code === 'closed'); // what was live fails, as before
  const delays = [];
  for (let attempt = 1; attempt <= 4; attempt++) {
    const r = await scheduled;
    assert.equal(r.attempt, attempt);
    assert.equal(r.error.closeCode, 1006);
    assert.deepEqual(vx.reconnecting, { attempt, delayMs: r.delayMs });
    delays.push(r.delayMs);
    assert.equal(FakeSocket.last, ws); // nothing before the delay
    await sleep(r.delayMs + 5);
    assert.notEqual(FakeSocket.last, ws); // then an attempt
    ws = FakeSocket.last;
    if (attempt < 4) {
      scheduled = nextEvent(vx, 'reconnecting');
      ws.close(1006); // the server is still away
    }
  }
  // Up to the cap (min·2^(n-1)), never below half of it: jitter, so that clients dropped together spread out.
  [4, 8, 16, 16].forEach((cap, i) => assert.ok(delays[i] >= cap / 2 && delays[i] <= cap, `${delays}`));
  assert.deepEqual(events, [
    ['close', 'closed'], ['reconnecting', 1], ['close', 'connect_failed'], ['reconnecting', 2],
    ['close', 'connect_failed'], ['reconnecting', 3], ['close', 'connect_failed'], ['reconnecting', 4],
  ]);
  ws.open(); // back
  assert.equal(vx.reconnecting, null);
  assert.equal((await vx.ready).engine, 'tone');
  const again = vx.speak('again'); // on the reopened socket, and the next loss starts from the first delay
  assert.equal(FakeSocket.last, ws);
  assert.equal(ws.sent.at(-1).ctx, again.ctx);
  scheduled = nextEvent(vx, 'reconnecting');
  ws.close(1001, 'going away');
  assert.equal((await scheduled).attempt, 1);
  vx.close();
});

test('no reconnect after close(), after a first connect that fails, after a refused key, or without `reconnect`', async () => {
  const opts = { reconnect: { minMs: 2, maxMs: 4 } };
  const quiet = (vx) => { const seen = []; vx.on('reconnecting', (r) => seen.push(r)); return seen; };

  const closed = connect(opts); // close() is wanted, not a loss
  const a = quiet(closed);
  closed.speak('x');
  FakeSocket.last.open();
  closed.close();
  await sleep(10);
  assert.deepEqual(a, []);

  const never = connect(opts); // a first connect's failure is for the caller (its `ready` rejects)
  const b = quiet(never);
  const ready = never.ready;
  FakeSocket.last.close(1013, 'at capacity');
  await assert.rejects(ready, (e) => e.code === 'connect_failed');
  await sleep(10);
  assert.deepEqual(b, []);

  const refused = connect(opts); // lost, then the key is refused: retrying cannot help
  const c = quiet(refused);
  refused.speak('x');
  FakeSocket.last.open();
  FakeSocket.last.close(1006);
  await sleep(10);
  assert.equal(c.length, 1);
  FakeSocket.last.close(1008, 'invalid API key');
  const last = FakeSocket.last;
  await sleep(10);
  assert.equal(c.length, 1);
  assert.equal(FakeSocket.last, last);
  assert.equal(refused.reconnecting, null);

  const stopped = connect(opts); // close() while waiting to reconnect cancels the attempt
  stopped.speak('x');
  FakeSocket.last.open();
  FakeSocket.last.close(1006);
  assert.ok(stopped.reconnecting);
  const before = FakeSocket.last;
  stopped.close();
  assert.equal(stopped.reconnecting, null);
  await sleep(10);
  assert.equal(FakeSocket.last, before);

  const plain = connect(); // without the option: as before, the next utterance reconnects
  const d = quiet(plain);
  plain.speak('x');
  const ws = FakeSocket.last;
  ws.open();
  ws.close(1006);
  await sleep(10);
  assert.deepEqual(d, []);
  assert.equal(FakeSocket.last, ws);
  plain.speak('y');
  assert.notEqual(FakeSocket.last, ws);
});

test('played() sends progress, coalesced to ~100 ms of audio, and nothing once ended', async () => {
  const vx = connect();
  const u = vx.speak('Hello.');
  const ws = FakeSocket.last;
  ws.open();
  await vx.ready;
  ws.json(started(u.ctx)); // 22050 Hz: reports at least 2205 samples apart
  u.played(0).played(1000).played(2205).played(3000).played(4410);
  const progress = () => ws.sent.filter((m) => m.type === 'progress').map((m) => m.played);
  assert.deepEqual(progress(), [0, 2205, 4410]);
  assert.ok(ws.sent.filter((m) => m.type === 'progress').every((m) => m.ctx === u.ctx));
  ws.json({ type: 'done', ctx: u.ctx, samples: 5000 });
  await u.finished;
  u.played(9000);
  assert.deepEqual(progress(), [0, 2205, 4410]);
});

// The `ready` of a server started with another default format (`voxwire serve --format …`).
const readyWith = (format) => ({ ...READY, defaults: { ...READY.defaults, format } });
// The format each utterance's first speak asked for (undefined: the server's default).
const asked = (ws) => {
  const first = new Map();
  for (const m of ws.sent) if (m.type === 'speak' && !first.has(m.ctx)) first.set(m.ctx, m.format);
  return [...first.values()];
};

test('no format asked: a server default that plays as it streams is taken as it is', async () => {
  for (const format of ['pcm_s16le', 'pcm_f32le', 'mulaw', 'alaw']) {
    const vx = connect();
    const ready = vx.ready;
    const ws = FakeSocket.last;
    ws.open(readyWith(format));
    await ready;
    vx.speak('Hi.');
    vx.stream().end('There.');
    assert.deepEqual(asked(ws), [undefined, undefined], format);
    assert.ok(ws.sent.every((m) => !('format' in m)), format);
  }
});

test('no format asked: a server whose default is compressed is asked for 16-bit PCM, which then plays', async () => {
  for (const format of ['mp3', 'aac', 'flac']) {
    const vx = connect();
    const ready = vx.ready;
    const ws = FakeSocket.last;
    ws.open(readyWith(format));
    await ready;
    const u = vx.speak('Hi.');
    vx.stream({ voice: 'joe' });
    assert.deepEqual(asked(ws), ['pcm_s16le', 'pcm_s16le'], format);
    const got = [];
    u.on('audio', (f) => got.push(...f.samples));
    ws.json(started(u.ctx)); // the server answers with what was asked
    ws.frame(audio(u.ctx, 0, 0, 32767, -32767));
    ws.json({ type: 'done', ctx: u.ctx, samples: 2 });
    await u.finished;
    assert.deepEqual(got, [1, -1], format);
  }
});

test('no format asked: an opus default is taken only where WebCodecs can decode it', async () => {
  const withOpus = async () => {
    const vx = connect();
    const ready = vx.ready;
    const ws = FakeSocket.last;
    ws.open(readyWith('opus'));
    await ready;
    vx.speak('Hi.');
    return asked(ws)[0];
  };
  assert.equal(await withOpus(), 'pcm_s16le'); // Node has no AudioDecoder
  // A browser with WebCodecs: only its presence is looked at when choosing the format.
  globalThis.AudioDecoder = class {};
  globalThis.EncodedAudioChunk = class {};
  try {
    assert.equal(await withOpus(), undefined);
  } finally {
    delete globalThis.AudioDecoder;
    delete globalThis.EncodedAudioChunk;
  }
});

test('no format asked: an utterance sent before `ready` has named the default asks for 16-bit PCM', async () => {
  const vx = connect();
  vx.speak('Early.'); // queued: the server's default is not known yet
  const ws = FakeSocket.last;
  ws.open(readyWith('mp3'));
  await vx.ready;
  assert.deepEqual(asked(ws), ['pcm_s16le']);

  // A server whose default plays: only what was sent before its `ready` asks for PCM,
  // and again after the connection is lost (the next server may have another default).
  const vx2 = connect();
  vx2.speak('Early.');
  const first = FakeSocket.last;
  first.open(readyWith('pcm_f32le'));
  await vx2.ready;
  vx2.speak('Later.');
  assert.deepEqual(asked(first), ['pcm_s16le', undefined]);
  first.close(1006);
  vx2.speak('After the loss.');
  const second = FakeSocket.last;
  assert.notEqual(second, first);
  second.open(readyWith('pcm_f32le'));
  await vx2.ready;
  assert.deepEqual(asked(second), ['pcm_s16le']);
});
