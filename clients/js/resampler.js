// A streaming linear-interpolation resampler: its state (the last input sample and the
// fractional read position) carries across chunks, so a stream fed in any chunk sizes
// gives the same output as the whole signal fed at once, with no click at the seams.
//
// Linear interpolation is plenty for what it is used for here: the client asks the
// server (which resamples with libsoxr) for the AudioContext's own rate, so this runs only
// when that is impossible (a context above 48 kHz) or when a caller picked another rate.
// For large downsampling ratios it aliases; ask the server for the rate you need instead.

export class Resampler {
  constructor(fromRate, toRate) {
    if (!(fromRate > 0 && toRate > 0)) throw new RangeError('sample rates must be positive');
    this.fromRate = fromRate;
    this.toRate = toRate;
    this.step = fromRate / toRate; // input samples per output sample
    this.pos = 0; // next output's position, in input samples, relative to the chunk to come
    this.last = 0; // the input sample at position -1 (the previous chunk's last)
  }

  /** Resample one chunk (Float32Array); returns the output samples it completes. */
  process(input) {
    const n = input.length;
    if (this.step === 1) return Float32Array.from(input);
    // Output k lies at pos + k * step and needs input floor(that) + 1, so it is complete
    // while pos + k * step < n - 1. Position -1 (in [-1, 0)) interpolates from `last`.
    // (The 1e-9 keeps float error in `pos` from adding an output at exactly n - 1.)
    const count = n === 0 ? 0 : Math.max(0, Math.ceil((n - 1 - this.pos) / this.step - 1e-9));
    const out = new Float32Array(count);
    let k = 0;
    for (; k < count; k++) {
      const t = this.pos + k * this.step;
      const i = Math.max(-1, Math.floor(t)); // t may sit a float's width below -1
      if (i + 1 > n - 1) break; // guards against rounding in `count`
      const a = i < 0 ? this.last : input[i];
      out[k] = a + (input[i + 1] - a) * (t - i);
    }
    if (n > 0) {
      this.pos += k * this.step - n;
      this.last = input[n - 1];
    }
    return k === count ? out : out.subarray(0, k);
  }

  /** The end of the stream: emit what the last input sample still owes (held, not faded). */
  flush() {
    if (this.step === 1) return new Float32Array(0);
    const out = this.process(new Float32Array([this.last]));
    this.pos = 0;
    this.last = 0;
    return out;
  }

  /** Output samples that `inputSamples` input samples make, for bookkeeping. */
  static outputLength(inputSamples, fromRate, toRate) {
    return Math.round((inputSamples * toRate) / fromRate);
  }
}
