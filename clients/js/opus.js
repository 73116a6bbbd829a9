// Opus frames (protocol v1, format "opus") to Float32Array, through WebCodecs' AudioDecoder.
//
// The server sends an Ogg Opus stream cut at page boundaries: each audio frame carries
// whole Ogg pages. This module takes the Opus packets out of the pages (OggPackets),
// hands them to the browser's decoder, and gives back the stream's samples: the encoder's
// pre-skip taken off the front, and no more in all than the frames said they cover, so
// the count equals the server's `done.samples` as it does for PCM.

/** Whether this browser can decode Opus itself (WebCodecs). Where not, ask for PCM. */
export function canDecodeOpus() {
  return typeof globalThis.AudioDecoder === 'function' && typeof globalThis.EncodedAudioChunk === 'function';
}

/** Ogg pages in (in any cuts), whole packets out, in order. */
export class OggPackets {
  constructor() {
    this._buf = new Uint8Array(0);
    this._partial = []; // the pieces of a packet that continues on the next page
  }

  /** @param {Uint8Array} bytes  @returns {Uint8Array[]} the packets these bytes complete */
  push(bytes) {
    const buf = new Uint8Array(this._buf.length + bytes.length);
    buf.set(this._buf);
    buf.set(bytes, this._buf.length);
    const packets = [];
    let at = 0;
    for (;;) {
      if (buf.length - at < 27) break;
      if (buf[at] !== 0x4f || buf[at + 1] !== 0x67 || buf[at + 2] !== 0x67 || buf[at + 3] !== 0x53) {
        throw new Error('not an Ogg page: the opus stream is corrupt');
      }
      const segments = buf[at + 26];
      const headerSize = 27 + segments;
      if (buf.length - at < headerSize) break;
      let bodySize = 0;
      for (let i = 0; i < segments; i++) bodySize += buf[at + 27 + i];
      if (buf.length - at < headerSize + bodySize) break;
      let offset = at + headerSize;
      for (let i = 0; i < segments; i++) {
        const lace = buf[at + 27 + i];
        this._partial.push(buf.subarray(offset, offset + lace));
        offset += lace;
        if (lace < 255) { // a packet ends with a lacing value under 255
          packets.push(concat(this._partial));
          this._partial = [];
        }
      }
      at += headerSize + bodySize;
    }
    this._buf = buf.slice(at);
    return packets;
  }
}

function concat(parts) {
  if (parts.length === 1) return parts[0].slice();
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
}

/** Mono Ogg Opus frames in; Float32Array pieces at 48 kHz to `onSamples`, in order. */
export class OpusStreamDecoder {
  /** @param {(samples: Float32Array) => void} onSamples */
  constructor(onSamples) {
    this._onSamples = onSamples;
    this._ogg = new OggPackets();
    this._decoder = null;
    this._headers = 0; // OpusHead, then OpusTags: the two packets before the audio
    this._skip = 0; // pre-skip samples still to drop
    this._allowed = 0; // samples the frames received so far cover
    this._given = 0;
    this._timestamp = 0;
    this.error = null;
  }

  /** One audio frame's bytes, and the samples the server says it covers. */
  push(bytes, samples) {
    this._allowed += samples;
    for (const packet of this._ogg.push(bytes)) {
      if (this._headers < 2) {
        if (this._headers === 0) this._configure(packet);
        this._headers++;
        continue;
      }
      // The server sends 40 ms packets; the timestamp only has to grow.
      this._decoder.decode(new EncodedAudioChunk({ type: 'key', timestamp: this._timestamp, data: packet }));
      this._timestamp += 40000;
    }
  }

  /** Resolves once every packet pushed so far has been decoded and given out. */
  async flush() {
    if (this._decoder && this._decoder.state === 'configured') await this._decoder.flush();
  }

  close() {
    if (this._decoder && this._decoder.state !== 'closed') this._decoder.close();
  }

  _configure(head) {
    // OpusHead: "OpusHead", version, channels, pre-skip (u16 LE), input rate, gain, mapping.
    if (String.fromCharCode(...head.subarray(0, 8)) !== 'OpusHead') throw new Error('the opus stream has no OpusHead');
    this._skip = head[10] | (head[11] << 8);
    this._decoder = new AudioDecoder({
      output: (data) => this._output(data),
      error: (e) => { this.error = e; },
    });
    // No `description`: given the OpusHead, some browsers drop the pre-skip themselves
    // and others do not; without it none does, and it is dropped here, exactly once.
    this._decoder.configure({ codec: 'opus', sampleRate: 48000, numberOfChannels: head[9] });
  }

  _output(data) {
    let x = new Float32Array(data.numberOfFrames);
    data.copyTo(x, { planeIndex: 0, format: 'f32-planar' });
    data.close();
    if (this._skip) {
      const cut = Math.min(this._skip, x.length);
      x = x.subarray(cut);
      this._skip -= cut;
    }
    // The last packet is padded to a whole frame: nothing past the samples sent.
    const room = this._allowed - this._given;
    if (x.length > room) x = x.subarray(0, Math.max(room, 0));
    if (!x.length) return;
    this._given += x.length;
    this._onSamples(x);
  }
}
