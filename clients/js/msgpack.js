// A msgpack decoder for what a Voxwire server sends: maps, arrays, strings, integers,
// floats, binary, booleans and nil. Extension types are not part of protocol v1, so they
// are refused rather than guessed at. Binary values come back as Uint8Array views into
// the input (no copy): copy them if you keep the input's buffer for something else.

const utf8 = new TextDecoder('utf-8', { fatal: true });

export class MsgpackError extends Error {}

/** Decode one msgpack value that fills `bytes` (a Uint8Array, ArrayBuffer or view). */
export function decode(bytes) {
  const u8 = bytes instanceof Uint8Array ? bytes
    : ArrayBuffer.isView(bytes) ? new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength)
      : new Uint8Array(bytes);
  const r = new Reader(u8);
  const value = r.value();
  if (r.pos !== u8.length) throw new MsgpackError(`${u8.length - r.pos} trailing bytes after the value`);
  return value;
}

class Reader {
  constructor(u8) {
    this.u8 = u8;
    this.view = new DataView(u8.buffer, u8.byteOffset, u8.byteLength);
    this.pos = 0;
  }

  // Advance by n bytes and return where they start, refusing to read past the end.
  take(n) {
    const at = this.pos;
    if (at + n > this.u8.length) throw new MsgpackError('truncated input');
    this.pos = at + n;
    return at;
  }

  u8at() { return this.u8[this.take(1)]; }
  u16() { return this.view.getUint16(this.take(2)); }
  u32() { return this.view.getUint32(this.take(4)); }

  // 64-bit integers become Numbers: exact up to 2^53, which sample offsets never reach.
  u64() {
    const at = this.take(8);
    return this.view.getUint32(at) * 2 ** 32 + this.view.getUint32(at + 4);
  }

  i64() {
    const at = this.take(8);
    return this.view.getInt32(at) * 2 ** 32 + this.view.getUint32(at + 4);
  }

  str(n) { const at = this.take(n); return utf8.decode(this.u8.subarray(at, at + n)); }
  bin(n) { const at = this.take(n); return this.u8.subarray(at, at + n); }

  array(n) {
    const out = new Array(n);
    for (let i = 0; i < n; i++) out[i] = this.value();
    return out;
  }

  map(n) {
    const out = {};
    for (let i = 0; i < n; i++) {
      const key = this.value();
      if (typeof key !== 'string' && typeof key !== 'number') throw new MsgpackError('map keys must be strings or integers');
      // defineProperty, so a key "__proto__" is data and cannot replace the prototype.
      Object.defineProperty(out, key, { value: this.value(), enumerable: true, writable: true, configurable: true });
    }
    return out;
  }

  value() {
    const b = this.u8at();
    if (b <= 0x7f) return b; // positive fixint
    if (b >= 0xe0) return b - 0x100; // negative fixint
    if ((b & 0xf0) === 0x80) return this.map(b & 0x0f);
    if ((b & 0xf0) === 0x90) return this.array(b & 0x0f);
    if ((b & 0xe0) === 0xa0) return this.str(b & 0x1f);
    switch (b) {
      case 0xc0: return null;
      case 0xc2: return false;
      case 0xc3: return true;
      case 0xc4: return this.bin(this.u8at());
      case 0xc5: return this.bin(this.u16());
      case 0xc6: return this.bin(this.u32());
      case 0xca: return this.view.getFloat32(this.take(4));
      case 0xcb: return this.view.getFloat64(this.take(8));
      case 0xcc: return this.u8at();
      case 0xcd: return this.u16();
      case 0xce: return this.u32();
      case 0xcf: return this.u64();
      case 0xd0: return this.view.getInt8(this.take(1));
      case 0xd1: return this.view.getInt16(this.take(2));
      case 0xd2: return this.view.getInt32(this.take(4));
      case 0xd3: return this.i64();
      case 0xd9: return this.str(this.u8at());
      case 0xda: return this.str(this.u16());
      case 0xdb: return this.str(this.u32());
      case 0xdc: return this.array(this.u16());
      case 0xdd: return this.array(this.u32());
      case 0xde: return this.map(this.u16());
      case 0xdf: return this.map(this.u32());
      default: throw new MsgpackError(`unsupported msgpack type byte 0x${b.toString(16)} at ${this.pos - 1}`);
    }
  }
}
