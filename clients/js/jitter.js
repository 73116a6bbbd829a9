// The jitter buffer that the player's AudioWorklet plays from: a growable ring of float
// samples with a small state machine. Pure logic (no Web Audio), so Node can test it.
//
// Positions are counted in samples since the buffer was made and only grow: `writePos`
// is where the next pushed sample goes, `readPos` the next sample to play. The ring holds
// [readPos, writePos). Audio is read out sample-contiguously across pushes, so the seam
// between two network chunks is invisible: no gap, no overlap, no click.
//
//   idle ──write──▶ buffering ──(≥ startSamples, or input ended)──▶ playing
//   playing ──ring empty, input open──▶ stalled (silence; an underrun) ──(≥ startSamples, or ended)──▶ playing
//   playing ──ring empty, input ended──▶ idle
//
// "Input ended" is `end()`: the utterance is complete, so what is left may play below the
// threshold, and running dry afterwards is the end of speech, not an underrun.

export class JitterBuffer {
  constructor({ startSamples, capacity = 1 << 16 } = {}) {
    if (!(startSamples >= 0)) throw new RangeError('startSamples must be >= 0');
    this.startSamples = startSamples;
    this.ring = new Float32Array(capacity);
    this.readPos = 0;
    this.writePos = 0;
    this.open = false; // more input is expected (no end() since the last write)
    this.state = 'idle';
    this.played = 0; // real samples output (silence excluded)
    this.underruns = 0; // times playback ran dry while more input was expected
    this.stalledSamples = 0; // silence output because of those underruns
    this.marks = []; // [{at, id}]: positions whose passing the caller wants to hear about
    this.reached = []; // ids of marks passed, for the caller to collect with takeReached()
  }

  get buffered() { return this.writePos - this.readPos; }

  /** Append samples (a Float32Array, at the rate the buffer is played at). */
  write(samples) {
    const n = samples.length;
    if (this.buffered + n > this.ring.length) this.grow(this.buffered + n);
    const cap = this.ring.length;
    const start = this.writePos % cap;
    const first = Math.min(n, cap - start);
    this.ring.set(first === n ? samples : samples.subarray(0, first), start);
    if (first < n) this.ring.set(samples.subarray(first), 0);
    this.writePos += n;
    this.open = true;
    if (this.state === 'idle' && n > 0) this.state = 'buffering';
  }

  /** The input is complete for now; `id` (optional) is reported once playback passes here. */
  end(id) {
    this.open = false;
    if (id !== undefined) {
      this.marks.push({ at: this.writePos, id });
      this.passMarks();
    }
    if (this.buffered === 0 && this.state !== 'playing') this.state = 'idle';
  }

  /** Drop everything before position `to` at once (barge-in); the default drops all. */
  skip(to = this.writePos) {
    this.readPos = Math.min(Math.max(this.readPos, to), this.writePos);
    this.passMarks();
    if (this.buffered === 0) {
      this.open = false;
      this.state = 'idle';
    }
  }

  /** Fill `out` (Float32Array) with audio, or silence where there is none to play. */
  read(out) {
    const n = out.length;
    if (this.state === 'buffering' || this.state === 'stalled') {
      if (this.buffered >= this.startSamples || (!this.open && this.buffered > 0)) this.state = 'playing';
    }
    let got = 0;
    if (this.state === 'playing') {
      got = Math.min(n, this.buffered);
      const cap = this.ring.length;
      const start = this.readPos % cap;
      const first = Math.min(got, cap - start);
      out.set(this.ring.subarray(start, start + first), 0);
      if (first < got) out.set(this.ring.subarray(0, got - first), first);
      this.readPos += got;
      this.played += got;
      this.passMarks();
      if (got < n) {
        if (this.open) {
          this.state = 'stalled';
          this.underruns++;
        } else {
          this.state = 'idle';
        }
      }
    }
    out.fill(0, got);
    if (this.state === 'stalled') this.stalledSamples += n - got;
    return got;
  }

  /** The ids of marks passed since the last call. */
  takeReached() {
    const ids = this.reached;
    this.reached = [];
    return ids;
  }

  passMarks() {
    while (this.marks.length && this.marks[0].at <= this.readPos) this.reached.push(this.marks.shift().id);
  }

  // Speech arrives faster than it plays, so a long utterance can outgrow any fixed ring:
  // double it (rarely, and never below what is buffered) rather than drop audio.
  grow(need) {
    let cap = this.ring.length;
    while (cap < need) cap *= 2;
    const ring = new Float32Array(cap);
    const old = this.ring;
    const n = this.buffered;
    const start = this.readPos % old.length;
    const first = Math.min(n, old.length - start);
    const dst = this.readPos % cap;
    // Copy sample by sample position so that index = position % capacity still holds.
    for (let i = 0; i < n; i++) ring[(dst + i) % cap] = i < first ? old[start + i] : old[i - first];
    this.ring = ring;
  }
}
