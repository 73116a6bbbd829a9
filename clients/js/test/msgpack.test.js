import assert from 'node:assert/strict';
import { test } from 'node:test';
import { decode, MsgpackError } from '../msgpack.js';

const hex = (s) => Uint8Array.from(s.replace(/\s+/g, '').match(/../g), (b) => parseInt(b, 16));

test('integers of every width and sign', () => {
  const cases = [
    ['00', 0], ['7f', 127], ['ff', -1], ['e0', -32],
    ['cc ff', 255], ['cd 0100', 256], ['ce 00010000', 65536], ['cf 0000000100000000', 2 ** 32],
    ['cf 001fffffffffffff', Number.MAX_SAFE_INTEGER],
    ['d0 80', -128], ['d1 8000', -32768], ['d2 80000000', -(2 ** 31)], ['d3 ffffffff00000000', -(2 ** 32)],
    ['d3 ffffffffffffffff', -1],
  ];
  for (const [bytes, value] of cases) assert.equal(decode(hex(bytes)), value, bytes);
});

test('floats, booleans and nil', () => {
  assert.equal(decode(hex('ca 3fc00000')), 1.5);
  assert.equal(decode(hex('cb 400921fb54442d18')), Math.PI);
  assert.equal(decode(hex('c0')), null);
  assert.equal(decode(hex('c2')), false);
  assert.equal(decode(hex('c3')), true);
});

test('strings: fixstr, str8, str16, str32 and UTF-8', () => {
  assert.equal(decode(hex('a0')), '');
  assert.equal(decode(hex('a3 616263')), 'abc');
  assert.equal(decode(hex('a2 c3a9')), 'é');
  const long = 'x'.repeat(300);
  assert.equal(decode(Uint8Array.of(0xd9, 40, ...new TextEncoder().encode('y'.repeat(40)))), 'y'.repeat(40));
  assert.equal(decode(Uint8Array.of(0xda, 0x01, 0x2c, ...new TextEncoder().encode(long))), long);
  assert.equal(decode(Uint8Array.of(0xdb, 0, 0, 0x01, 0x2c, ...new TextEncoder().encode(long))), long);
});

test('binary comes back as the exact bytes, without a copy', () => {
  const input = hex('c4 03 010203');
  const bin = decode(input);
  assert.ok(bin instanceof Uint8Array);
  assert.deepEqual([...bin], [1, 2, 3]);
  assert.equal(bin.buffer, input.buffer); // a view into the frame
  assert.deepEqual([...decode(Uint8Array.of(0xc5, 0x01, 0x00, ...new Uint8Array(256).fill(7)))], new Array(256).fill(7));
  assert.equal(decode(Uint8Array.of(0xc6, 0, 1, 0, 0, ...new Uint8Array(65536))).length, 65536);
});

test('maps and arrays, nested', () => {
  // {"a": [1, {"b": nil}], "c": true}
  assert.deepEqual(decode(hex('82 a161 92 01 81 a162 c0 a163 c3')), { a: [1, { b: null }], c: true });
  assert.deepEqual(decode(hex('dc 0003 01 02 03')), [1, 2, 3]);
  assert.deepEqual(decode(hex('dd 00000001 a0')), ['']);
  assert.deepEqual(decode(hex('de 0001 a178 05')), { x: 5 });
  assert.deepEqual(decode(hex('df 00000001 a178 06')), { x: 6 });
});

test('an audio frame as the server builds it', () => {
  // msgpack.packb({"type": "audio", "ctx": "u1", "seq": 2, "offset": 70000, "samples": 2, "audio": b"\x01\x00\xff\xff"}, use_bin_type=True)
  const frame = hex('86 a474797065 a5617564696f a3637478 a27531 a3736571 02 a66f6666736574 ce00011170'
    + ' a773616d706c6573 02 a5617564696f c404 0100ffff');
  const m = decode(frame);
  assert.equal(m.type, 'audio');
  assert.equal(m.ctx, 'u1');
  assert.equal(m.seq, 2);
  assert.equal(m.offset, 70000);
  assert.equal(m.samples, 2);
  assert.deepEqual([...m.audio], [1, 0, 255, 255]);
});

test('a key "__proto__" is data, not a prototype', () => {
  const m = decode(hex('81 a95f5f70726f746f5f5f 81 a178 01'));
  assert.equal(Object.getPrototypeOf(m), Object.prototype);
  assert.deepEqual(Object.keys(m), ['__proto__']);
  assert.equal(m.x, undefined);
});

test('bad input is refused with a MsgpackError', () => {
  assert.throws(() => decode(hex('a3 6162')), MsgpackError); // truncated string
  assert.throws(() => decode(hex('cd 01')), MsgpackError); // truncated uint16
  assert.throws(() => decode(hex('92 01')), MsgpackError); // array missing an item
  assert.throws(() => decode(hex('01 02')), /trailing/);
  assert.throws(() => decode(hex('d4 01 02')), /0xd4/); // fixext: not in the protocol
  assert.throws(() => decode(hex('c1')), MsgpackError); // never used
  assert.throws(() => decode(hex('81 c0 01')), /keys/);
});

test('accepts an ArrayBuffer and views at an offset', () => {
  const buf = hex('ff ff 92 01 02').buffer;
  assert.deepEqual(decode(new Uint8Array(buf, 2)), [1, 2]);
  assert.deepEqual(decode(hex('92 01 02').buffer), [1, 2]);
});
