// Test helpers: a WebSocket stand-in that records what the client sends and lets a test
// play the server, and a msgpack encoder for the audio frames such a test sends.

const enc = new TextEncoder();

export function encode(v) {
  const out = [];
  const u16 = (n) => out.push(n >> 8, n & 0xff);
  const u32 = (n) => out.push(n >>> 24, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff);
  const put = (x) => {
    if (x === null) out.push(0xc0);
    else if (typeof x === 'boolean') out.push(x ? 0xc3 : 0xc2);
    else if (typeof x === 'number' && Number.isInteger(x) && x >= 0) {
      if (x < 128) out.push(x); else { out.push(0xce); u32(x); }
    } else if (typeof x === 'string') {
      const b = enc.encode(x);
      out.push(0xda); u16(b.length); out.push(...b);
    } else if (x instanceof Uint8Array) {
      out.push(0xc6); u32(x.length); out.push(...x);
    } else if (typeof x === 'object') {
      const keys = Object.keys(x);
      out.push(0xde); u16(keys.length);
      for (const k of keys) { put(k); put(x[k]); }
    } else throw new Error(`cannot encode ${x}`);
  };
  put(v);
  return Uint8Array.from(out).buffer;
}

export const READY = {
  type: 'ready', protocol: 1, engine: 'tone', sample_rate: 22050,
  voices: [{ id: 'joe', name: 'Joe' }], defaults: { voice: 'joe', format: 'pcm_s16le', sample_rate: 22050, chunk_ms: 200, speed: 1 },
};

export class FakeSocket {
  static last = null;

  constructor(url, protocols) {
    this.url = url;
    this.protocols = protocols;
    this.readyState = 0;
    this.sent = [];
    FakeSocket.last = this;
  }

  send(data) {
    if (this.readyState !== 1) throw new Error('send before open');
    this.sent.push(JSON.parse(data));
  }

  close(code = 1000, reason = '') {
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }

  // The server's side.
  open(ready = READY) { this.readyState = 1; this.onopen?.(); this.json(ready); }
  json(m) { this.onmessage({ data: JSON.stringify(m) }); }
  frame(m) { this.onmessage({ data: encode(m) }); }
}

export const s16 = (...values) => {
  const b = new Uint8Array(values.length * 2);
  const v = new DataView(b.buffer);
  values.forEach((x, i) => v.setInt16(2 * i, x, true));
  return b;
};
