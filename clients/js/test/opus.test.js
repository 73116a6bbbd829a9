import assert from 'node:assert/strict';
import { test } from 'node:test';
import { OggPackets, canDecodeOpus } from '../opus.js';
import { Voxwire } from '../voxwire.js';
import { FakeSocket } from './fake-socket.js';

// One Ogg page holding `packets`, each laced as RFC 3533 says (255s, then the rest).
function page(packets, { continued = false, lastContinues = false } = {}) {
  const lacing = [];
  packets.forEach((p, i) => {
    let n = p.length;
    while (n >= 255) { lacing.push(255); n -= 255; }
    if (!(lastContinues && i === packets.length - 1)) lacing.push(n);
  });
  const header = new Uint8Array(27 + lacing.length);
  header.set([0x4f, 0x67, 0x67, 0x53], 0);
  header[5] = continued ? 1 : 0;
  header[26] = lacing.length;
  header.set(lacing, 27);
  const body = packets.reduce((n, p) => n + p.length, 0);
  const out = new Uint8Array(header.length + body);
  out.set(header);
  let at = header.length;
  for (const p of packets) { out.set(p, at); at += p.length; }
  return out;
}

const bytes = (n, v) => new Uint8Array(n).fill(v);

test('packets come out of whole pages, in order', () => {
  const ogg = new OggPackets();
  const got = ogg.push(page([bytes(3, 1), bytes(255, 2), bytes(600, 3)]));
  assert.deepEqual(got.map((p) => [p.length, p[0]]), [[3, 1], [255, 2], [600, 3]]);
});

test('a page cut anywhere, and a packet that spans two pages', () => {
  const first = page([bytes(10, 4), bytes(510, 5)], { lastContinues: true });
  const second = page([bytes(20, 5), bytes(7, 6)], { continued: true });
  const stream = new Uint8Array([...first, ...second]);
  const ogg = new OggPackets();
  const got = [];
  for (let i = 0; i < stream.length; i += 33) got.push(...ogg.push(stream.subarray(i, i + 33)));
  assert.deepEqual(got.map((p) => p.length), [10, 530, 7]);
  assert.ok(got[1].every((v) => v === 5));
});

test('bytes that are not Ogg are refused', () => {
  assert.throws(() => new OggPackets().push(bytes(40, 9)), /not an Ogg page/);
});

test('without WebCodecs (Node), opus is asked for as 16-bit PCM; files-only formats are refused', () => {
  assert.equal(canDecodeOpus(), false);
  const vx = new Voxwire('ws://x/v1/stream', { WebSocket: FakeSocket, format: 'opus' });
  const u = vx.speak('Hi.');
  FakeSocket.last.open();
  assert.equal(FakeSocket.last.sent[0].format, 'pcm_s16le');
  assert.equal(u.ctx, FakeSocket.last.sent[0].ctx);
  assert.throws(() => vx.speak('Hi.', { format: 'mp3' }), /cannot be played as it streams/);
});
