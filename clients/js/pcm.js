// Audio frame payloads (protocol v1 formats, little-endian, mono) to Float32Array in [-1, 1].
// The scale matches the server's encoder (server/audio.py), which writes round(x * 32767).

export const FORMATS = ['pcm_s16le', 'pcm_f32le', 'mulaw', 'alaw'];
export const BYTES_PER_SAMPLE = { pcm_s16le: 2, pcm_f32le: 4, mulaw: 1, alaw: 1 };

// G.711 mu-law: all 256 codes decoded once.
const MULAW = new Float32Array(256);
for (let code = 0; code < 256; code++) {
  const u = ~code & 0xff;
  const magnitude = ((((u & 0x0f) << 3) + 0x84) << ((u >> 4) & 0x07)) - 0x84;
  MULAW[code] = ((u & 0x80) ? 0 - magnitude : magnitude) / 32767; // 0 - 0 is +0, unlike -0
}

// G.711 A-law: all 256 codes decoded once, each to the middle of its step.
const ALAW = new Float32Array(256);
for (let code = 0; code < 256; code++) {
  const a = code ^ 0x55; // the even bits, inverted on the line, back
  const segment = (a >> 4) & 0x07;
  const magnitude = (((a & 0x0f) << 4) + 8 + (segment ? 0x100 : 0)) << Math.max(segment - 1, 0);
  ALAW[code] = ((a & 0x80) ? magnitude : -magnitude) / 32767; // never 0: no -0 to mind
}
const TABLES = { mulaw: MULAW, alaw: ALAW };

/** Decode `bytes` (Uint8Array) in `format` to a new Float32Array. */
export function toFloat32(bytes, format) {
  const size = BYTES_PER_SAMPLE[format];
  if (!size) throw new Error(`unknown audio format ${format}`);
  if (bytes.byteLength % size) throw new Error(`${bytes.byteLength} bytes is not a whole number of ${format} samples`);
  const n = bytes.byteLength / size;
  const out = new Float32Array(n);
  // A DataView reads little-endian on any host and at any byte offset; msgpack puts the
  // payload at an odd offset, where a typed-array view would be misaligned.
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (format === 'pcm_s16le') for (let i = 0; i < n; i++) out[i] = view.getInt16(2 * i, true) / 32767;
  else if (format === 'pcm_f32le') for (let i = 0; i < n; i++) out[i] = view.getFloat32(4 * i, true);
  else {
    const table = TABLES[format];
    for (let i = 0; i < n; i++) out[i] = table[bytes[i]];
  }
  return out;
}
