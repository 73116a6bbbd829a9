// The AudioWorklet side of the player: it plays a JitterBuffer (jitter.js) one render
// quantum at a time and reports what it actually played. Everything that can wait (network,
// decoding, resampling) happens on the main thread; this thread only copies samples.
//
// Messages in:  {type: 'begin', id}                      utterance `id`'s audio follows
//               {type: 'push', samples: Float32Array}   audio at the context's rate
//               {type: 'end', id}                        the utterance `id` is complete
//               {type: 'skip', to?}                      drop audio before `to` (default: all)
// Messages out: {type: 'begun', id, ...stats}            the counters before `id`'s first sample
//               {type: 'reached', id, ...stats}          playback passed the end of `id`
//               {type: 'stats', ...}                     every ~20 ms, and at once on a change

import { JitterBuffer } from './jitter.js';

const STATS_EVERY_S = 0.02;

class VoxwirePlayerProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { startMs = 100 } = options.processorOptions || {};
    // `sampleRate` is the AudioWorkletGlobalScope's: the context's rate.
    this.buffer = new JitterBuffer({ startSamples: Math.round((startMs / 1000) * sampleRate), capacity: sampleRate * 8 });
    this.lastState = this.buffer.state;
    this.lastUnderruns = 0;
    this.lastPost = -Infinity;
    this.port.onmessage = (e) => this.receive(e.data);
  }

  receive(msg) {
    const b = this.buffer;
    if (msg.type === 'begin') this.port.postMessage({ type: 'begun', id: msg.id, ...this.stats() });
    else if (msg.type === 'push') b.write(msg.samples);
    else if (msg.type === 'end') b.end(msg.id);
    else if (msg.type === 'skip') b.skip(msg.to);
    this.report(true);
  }

  stats() {
    const b = this.buffer;
    return {
      state: b.state, played: b.played, buffered: b.buffered, readPos: b.readPos, writePos: b.writePos,
      underruns: b.underruns, stalledSamples: b.stalledSamples, time: currentTime,
    };
  }

  // Post stats when something a listener cares about changed, and otherwise now and then.
  report(force) {
    const b = this.buffer;
    for (const id of b.takeReached()) this.port.postMessage({ type: 'reached', id, ...this.stats() });
    const changed = b.state !== this.lastState || b.underruns !== this.lastUnderruns;
    const due = b.state !== 'idle' && currentTime - this.lastPost >= STATS_EVERY_S; // quiet when idle
    if (force || changed || due) {
      this.lastState = b.state;
      this.lastUnderruns = b.underruns;
      this.lastPost = currentTime;
      this.port.postMessage({ type: 'stats', ...this.stats() });
    }
  }

  process(inputs, outputs) {
    const out = outputs[0];
    this.buffer.read(out[0]);
    for (let c = 1; c < out.length; c++) out[c].set(out[0]); // mono to every output channel
    this.report(false);
    return true; // stay alive between utterances: a new one starts without re-creating the node
  }
}

registerProcessor('voxwire-player', VoxwirePlayerProcessor);
