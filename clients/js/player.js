// Plays utterances through an AudioWorklet (player-worklet.js) as their audio arrives.
//
// Utterances play one after another in the order given to play(). Only the utterance
// now playing has audio in the worklet; the next one's audio waits here until the worklet
// reports that the previous one has played out. So dropping one (cancel, stop) never
// touches another, and the worklet's counters, read when an utterance begins and ends,
// say exactly how many samples it played (and, while it plays, how many so far: progress()).
// Within an utterance, samples are contiguous.

import { Emitter } from './emitter.js';
import { Resampler } from './resampler.js';
import { MAX_SAMPLE_RATE, MIN_SAMPLE_RATE } from './voxwire.js';

const now = () => performance.now();

export class Player extends Emitter {
  /**
   * @param {object} [opts]
   * @param {AudioContext} [opts.context] default: a new one ({latencyHint: 'interactive'})
   * @param {number} [opts.startMs=100] audio to buffer before playback starts (and restarts
   *   after an underrun): it absorbs network and scheduling jitter
   */
  constructor({ context, startMs = 100, workletUrl = new URL('./player-worklet.js', import.meta.url) } = {}) {
    super();
    this.context = context ?? new AudioContext({ latencyHint: 'interactive' });
    this.startMs = startMs;
    this.workletUrl = workletUrl;
    this.node = null;
    this.stats = { state: 'idle', played: 0, buffered: 0, underruns: 0, stalledSamples: 0, bufferedMs: 0, stallMs: 0 };
    this._starting = null;
    this._pending = []; // messages for the worklet, until it exists
    this._queue = []; // entries not yet played out, the one playing first
    this._dropped = new Map(); // id -> entry dropped while live, until the worklet confirms
    this._entries = new WeakMap(); // utterance -> its entry, for progress()
    this._ids = 0;
  }

  /** The AudioContext's rate. */
  get sampleRate() { return this.context.sampleRate; }

  /**
   * The rate to ask the server for: the context's own, so nothing is resampled here (the
   * server's soxr does it better), within the protocol's 8–48 kHz. A 96 kHz context gets
   * 48 kHz, and this player's resampler does the rest.
   */
  get streamRate() { return Math.min(MAX_SAMPLE_RATE, Math.max(MIN_SAMPLE_RATE, this.sampleRate)); }

  /** How many utterances given to play() are playing or waiting to (dropped ones are not). */
  get pending() { return this._queue.length; }

  /**
   * What the player has done with `u` so far, counted from its own first sample, so that
   * one utterance's figures never include another's: {state, played, underruns,
   * stalledSamples, buffered}. `buffered`: its samples received and not played yet. `state`:
   * 'queued' (behind another), then the worklet's ('buffering', 'playing', 'stalled') while
   * it plays, then 'done' or 'dropped'. Null for an utterance never given to play().
   */
  progress(u) {
    const entry = this._entries.get(u);
    if (!entry) return null;
    if (entry.result) {
      const { played, underruns, stalledSamples, dropped } = entry.result;
      return { state: dropped ? 'dropped' : 'done', played, underruns, stalledSamples, buffered: 0 };
    }
    if (!entry.live || !entry.base) {
      // Not begun in the worklet yet: the counters there are still another utterance's.
      const held = entry.held.reduce((n, samples) => n + samples.length, 0);
      const state = entry.dropped ? 'dropped' : entry.live ? 'buffering' : 'queued';
      return { state, played: 0, underruns: 0, stalledSamples: 0, buffered: held };
    }
    // Begun: the worklet holds this utterance's audio and nobody else's.
    const s = this.stats;
    const { base } = entry;
    return {
      state: entry.dropped ? 'dropped' : s.state === 'idle' ? 'buffering' : s.state, // idle: no audio yet
      played: s.played - base.played,
      underruns: s.underruns - base.underruns,
      stalledSamples: s.stalledSamples - base.stalledSamples,
      buffered: s.buffered,
    };
  }

  /** Resume the context and load the worklet. Call it from a click (autoplay policies). */
  start() {
    this._starting ??= this._start();
    return this._starting;
  }

  async _start() {
    const ctx = this.context;
    const resumed = ctx.resume(); // in the gesture's task: a later await would lose it
    if (!ctx.audioWorklet) {
      throw new Error('AudioWorklet is unavailable: open the page over https:// or from localhost (a secure context)');
    }
    await ctx.audioWorklet.addModule(this.workletUrl);
    const node = new AudioWorkletNode(ctx, 'voxwire-player', {
      numberOfInputs: 0, outputChannelCount: [1], processorOptions: { startMs: this.startMs },
    });
    node.port.onmessage = (e) => this._report(e.data);
    node.connect(ctx.destination);
    this.node = node;
    for (const m of this._pending.splice(0)) node.port.postMessage(m);
    await resumed;
  }

  /**
   * Play an utterance (from Voxwire.speak or .stream; call this before yielding to the
   * event loop, so no audio event is missed). Resolves once it has played out, or been
   * dropped, with {played, underruns, stalledSamples, dropped, firstSoundAt}; rejects if
   * audio cannot start here at all.
   */
  play(u) {
    const entry = {
      u, id: ++this._ids, held: [], complete: false, live: false, dropped: false, resampler: null,
      base: null, firstSoundAt: null,
    };
    entry.finished = new Promise((resolve, reject) => { entry.resolve = resolve; entry.reject = reject; });
    this._entries.set(u, entry);
    const onAudio = (a) => this._audio(entry, a);
    const onEnd = () => this._complete(entry);
    const onCancel = () => this._drop(entry);
    // An utterance that fails midway (engine error, closed socket) plays what it received.
    const onError = (err) => { if (err.terminal !== false) this._complete(entry); };
    u.on('audio', onAudio).on('done', onEnd).on('cancel', onCancel).on('error', onError);
    entry.detach = () => u.off('audio', onAudio).off('done', onEnd).off('cancel', onCancel).off('error', onError);
    this._queue.push(entry);
    u.played?.(0); // flow control from the first step: nothing is played yet
    if (this._queue.length === 1) this._goLive(entry);
    this.start().catch((err) => this._failAll(err));
    return entry.finished;
  }

  /** Barge-in: silence now, and cancel everything given to play(). */
  stop() {
    for (const entry of [...this._queue]) this._drop(entry, true);
  }

  _audio(entry, { samples, sampleRate }) {
    if (sampleRate !== this.sampleRate) {
      entry.resampler ??= new Resampler(sampleRate, this.sampleRate);
      samples = entry.resampler.process(samples);
    }
    if (entry.live) this._post({ type: 'push', samples });
    else entry.held.push(samples);
  }

  _complete(entry) {
    if (entry.complete) return;
    if (entry.resampler) this._audio(entry, { samples: entry.resampler.flush(), sampleRate: this.sampleRate });
    entry.complete = true;
    if (entry.live) this._post({ type: 'end', id: entry.id });
  }

  _goLive(entry) {
    entry.live = true;
    this._post({ type: 'begin', id: entry.id }); // answered with the counters before its first sample
    for (const samples of entry.held.splice(0)) this._post({ type: 'push', samples });
    if (entry.complete) this._post({ type: 'end', id: entry.id });
  }

  _drop(entry, cancel = false) {
    const i = this._queue.indexOf(entry);
    if (i < 0) return;
    this._queue.splice(i, 1);
    entry.detach();
    entry.dropped = true;
    if (cancel) entry.u.cancel();
    if (entry.live) {
      // Drop its audio now; the end mark right behind is passed at once, and the
      // worklet's answer settles it with final counters and lets the next one go live.
      this._post({ type: 'skip' });
      this._post({ type: 'end', id: entry.id });
      this._dropped.set(entry.id, entry);
    } else {
      this._settle(entry, null);
    }
  }

  _report(m) {
    const rate = this.sampleRate;
    const { type, id, ...stats } = m;
    this.stats = { ...stats, bufferedMs: (stats.buffered / rate) * 1000, stallMs: (stats.stalledSamples / rate) * 1000 };
    const head = this._queue[0];
    if (type === 'begun') {
      const entry = head?.id === id ? head : this._dropped.get(id);
      if (entry) entry.base = stats;
    }
    if (head?.live && head.base && head.u.sampleRate) {
      // Tell the server what has played, at the stream's rate (this counts the context's).
      head.u.played?.(Math.floor(((stats.played - head.base.played) * head.u.sampleRate) / rate));
    }
    if (head?.live && head.base && head.firstSoundAt === null && stats.played > head.base.played) {
      head.firstSoundAt = now();
      this.emit('playing', head.u);
    }
    if (type === 'reached') {
      const entry = head?.id === id ? this._queue.shift() : this._dropped.get(id);
      if (entry) {
        this._dropped.delete(id);
        entry.detach();
        this._settle(entry, stats);
        if (this._queue[0] && !this._queue[0].live) this._goLive(this._queue[0]);
      }
    }
    this.emit('stats', this.stats);
  }

  // `end`: the worklet's counters when the utterance ended (null: it never reached the worklet).
  _settle(entry, end) {
    const base = entry.base ?? end;
    const delta = (key) => (end && base ? end[key] - base[key] : 0);
    entry.result = {
      played: delta('played'),
      underruns: delta('underruns'),
      stalledSamples: delta('stalledSamples'),
      dropped: entry.dropped,
      firstSoundAt: entry.firstSoundAt,
    };
    entry.resolve(entry.result);
  }

  _failAll(err) {
    this.emit('error', err);
    for (const entry of [...this._queue.splice(0), ...this._dropped.values()]) {
      entry.detach();
      entry.u.cancel(); // nothing can play it: stop the server's work too
      entry.reject(err);
    }
    this._dropped.clear();
  }

  _post(m) {
    if (this.node) this.node.port.postMessage(m);
    else this._pending.push(m);
  }
}
