// The WebSocket client for Voxwire protocol v1 (docs/protocol.md). One Voxwire is one
// socket, opened on first use; every utterance on it has its own `ctx`, and the messages
// the server sends are routed to the utterance they name, so several can stream at once.

import { Emitter } from './emitter.js';
import { decode } from './msgpack.js';
import { OpusStreamDecoder, canDecodeOpus } from './opus.js';
import { toFloat32 } from './pcm.js';

const now = () => globalThis.performance?.now() ?? Date.now();

// Stream settings, as callers may spell them (camelCase or the wire's snake_case).
const SETTINGS = {
  voice: 'voice', speaker: 'speaker', format: 'format', speed: 'speed',
  sampleRate: 'sample_rate', sample_rate: 'sample_rate', chunkMs: 'chunk_ms', chunk_ms: 'chunk_ms',
  timestamps: 'timestamps', fastStart: 'fast_start', fast_start: 'fast_start',
  firstClauseWords: 'first_clause_words', first_clause_words: 'first_clause_words',
  lexicon: 'lexicon', textFormat: 'text_format', text_format: 'text_format',
};

const SUBPROTOCOL = 'voxwire.v1';
const TOKEN_PREFIX = 'voxwire.token.';

export const MIN_SAMPLE_RATE = 8000;
export const MAX_SAMPLE_RATE = 48000;

const CLOSE_POLICY = 1008; // the server refused the API key (or the page's origin): retrying cannot help
const RECONNECT = { minMs: 500, maxMs: 15000 };

/** A server `error`, or a client-side failure ("closed", "connect_failed"), with a stable `code`. */
export class VoxwireError extends Error {
  constructor(code, message, extra = {}) {
    super(`${code}: ${message}`);
    this.name = 'VoxwireError';
    this.code = code;
    this.detail = message;
    Object.assign(this, extra); // ctx, terminal, retry_after_ms, closeCode, reason
  }
}

/** ws(s)://<this page's host>/v1/stream, when there is a page. */
export function defaultUrl() {
  const loc = globalThis.location;
  if (!loc?.host) throw new Error('no page location to derive the server URL from: pass one');
  return `${loc.protocol === 'https:' ? 'wss' : 'ws'}://${loc.host}/v1/stream`;
}

// What this client can play as it arrives: PCM, and Opus where the browser decodes it
// (WebCodecs). Opus elsewhere falls back to 16-bit PCM; mp3, aac and flac are for files
// (the OpenAI route, `voxwire say`), not for this player.
export const PLAYABLE_FORMATS = ['pcm_s16le', 'pcm_f32le', 'mulaw', 'alaw', 'opus'];
const FALLBACK_FORMAT = 'pcm_s16le'; // every server sends it

const canPlay = (format) => PLAYABLE_FORMATS.includes(format) && (format !== 'opus' || canDecodeOpus());

// `serverFormat`: the server's default format, as its `ready` named it, or undefined
// before `ready`. A server may be started with a compressed default (`voxwire serve
// --format mp3`), so with no format asked its default is taken only where it plays as it
// streams; otherwise, and while the default is not known yet, 16-bit PCM is asked for.
function playable(settings, serverFormat) {
  const { format } = settings;
  if (format === undefined) return canPlay(serverFormat) ? settings : { ...settings, format: FALLBACK_FORMAT };
  if (!PLAYABLE_FORMATS.includes(format)) {
    throw new TypeError(`format "${format}" cannot be played as it streams: use one of ${PLAYABLE_FORMATS.join(', ')}`);
  }
  return canPlay(format) ? settings : { ...settings, format: FALLBACK_FORMAT };
}

function wireSettings(settings = {}) {
  const out = {};
  for (const [key, value] of Object.entries(settings)) {
    if (value === undefined) continue;
    if (!(key in SETTINGS)) throw new TypeError(`unknown stream setting "${key}" (known: ${Object.keys(SETTINGS).join(', ')})`);
    out[SETTINGS[key]] = value;
  }
  return out;
}

export class Voxwire extends Emitter {
  /**
   * @param {string} [url] the server's /v1/stream URL; default: this page's host.
   * @param {object} [opts] default stream settings for every utterance (voice, speaker,
   *   format, sampleRate, chunkMs, speed, timestamps, fastStart); `token`, an API key for a
   *   server that wants one; `reconnect` (true, or {minMs, maxMs}): reopen a lost
   *   connection by itself, with a growing delay between attempts; and `WebSocket` (an
   *   implementation, outside browsers).
   */
  constructor(url = defaultUrl(), opts = {}) {
    super();
    const { WebSocket: Impl = globalThis.WebSocket, token, reconnect = false, ...settings } = opts;
    this.url = url;
    // Browsers cannot set headers on a WebSocket: the key rides as a subprotocol beside
    // voxwire.v1 (docs/protocol.md, Authentication); the server answers only voxwire.v1.
    this._protocols = token ? [SUBPROTOCOL, `${TOKEN_PREFIX}${token}`] : undefined;
    this.defaults = wireSettings(settings); // sent in each utterance's first speak
    this.info = null; // the server's `ready` message
    this.voices = [];
    this.serverDefaults = null;
    this._Impl = Impl;
    this._ws = null;
    this._ready = null;
    this._outbox = [];
    this._live = new Map(); // ctx -> Utterance
    this._next = 0;
    this._backoff = reconnect ? { ...RECONNECT, ...(reconnect === true ? {} : reconnect) } : null;
    this._retry = null; // {attempt, delayMs, timer}: from a lost connection until one is ready again
    this._closing = false; // close() was called: the socket's end is wanted, not a loss
  }

  /** Open the socket if it is not open; resolves with the server's `ready` message. */
  connect() {
    if (this._ready) return this._ready;
    const ws = this._protocols ? new this._Impl(this.url, this._protocols) : new this._Impl(this.url);
    ws.binaryType = 'arraybuffer';
    this._ws = ws;
    this._ready = new Promise((resolve, reject) => {
      this._resolveReady = resolve;
      ws.onopen = () => {
        for (const m of this._outbox.splice(0)) ws.send(m);
      };
      ws.onmessage = (e) => this._receive(e.data);
      ws.onerror = () => {}; // browsers give no detail here; onclose says what happened
      ws.onclose = (e) => {
        const opened = this.info !== null;
        const err = new VoxwireError(opened ? 'closed' : 'connect_failed',
          `the connection to ${this.url} closed (${e.code}${e.reason ? `: ${e.reason}` : ''})`,
          { closeCode: e.code, reason: e.reason });
        if (!opened) reject(err);
        const wanted = this._closing;
        this._closing = false;
        this._closed(err);
        if (!wanted) this._reconnectLater(err, opened);
      };
    });
    this._ready.catch(() => {}); // a failed connect is reported to the utterances waiting on it
    return this._ready;
  }

  /** The `ready` message, connecting first if needed. */
  get ready() { return this.connect(); }

  /** Speak `text` as one utterance. */
  speak(text, settings = {}) {
    const u = this._open(settings);
    u._send({ type: 'speak', ctx: u.ctx, text: String(text), final: true, ...u._settings });
    u._complete = true;
    return u;
  }

  /** An utterance whose text comes in pieces: u.write(piece)…, u.flush(), u.end(). */
  stream(settings = {}) {
    const u = this._open(settings);
    // An empty first speak opens the utterance now, so `started` (and any settings
    // error) comes back before the first word is even written.
    u._send({ type: 'speak', ctx: u.ctx, text: '', final: false, ...u._settings });
    return u;
  }

  /** Close the socket; live utterances end with a "closed" error. No reconnect follows. */
  close(code = 1000) {
    this._stopReconnecting();
    this._closing = this._ws !== null;
    this._ws?.close(code);
  }

  /** While reconnecting (from a lost connection until one is ready): {attempt, delayMs}; else null. */
  get reconnecting() {
    return this._retry && { attempt: this._retry.attempt, delayMs: this._retry.delayMs };
  }

  _open(settings) {
    // `info` is this connection's `ready` (null until then, and again after a close: the
    // next connection may reach a server with another default).
    const asked = { ...this.defaults, ...wireSettings(settings) };
    const u = new Utterance(this, `js-${++this._next}`, playable(asked, this.info?.defaults?.format));
    this._live.set(u.ctx, u);
    this.connect();
    return u;
  }

  _send(message) {
    const data = JSON.stringify(message);
    this.connect();
    if (this._ws.readyState === 1) this._ws.send(data);
    else this._outbox.push(data);
  }

  _receive(data) {
    let m;
    try {
      m = typeof data === 'string' ? JSON.parse(data) : decode(new Uint8Array(data));
    } catch (e) {
      this.emit('error', new VoxwireError('invalid_message', `undecodable message from the server: ${e.message}`));
      return;
    }
    if (m.type === 'ready') {
      this.info = m;
      this.voices = m.voices ?? [];
      this.serverDefaults = m.defaults ?? null;
      this._stopReconnecting();
      this._resolveReady(m);
      this.emit('ready', m);
      return;
    }
    const u = m.ctx !== undefined ? this._live.get(m.ctx) : undefined;
    if (u) u._receive(m);
    else if (m.type === 'error') this.emit('error', new VoxwireError(m.code, m.message, m));
    // Anything else for an unknown ctx is late news for a cancelled utterance: dropped.
  }

  _forget(u) {
    if (this._live.get(u.ctx) === u) this._live.delete(u.ctx);
  }

  _closed(err) {
    this._ws = null;
    this._ready = null; // the next utterance reconnects
    this.info = null;
    this._outbox = [];
    for (const u of [...this._live.values()]) u._fail(err);
    this.emit('close', err);
  }

  // With `reconnect`: after a connection that was ready is lost, and after each attempt
  // that fails since, try again after a delay that doubles up to maxMs. A first connect
  // that fails is the caller's to retry (its `ready` rejected), and a refused key stays
  // refused. Any connect() meanwhile (an utterance, say) is an attempt like the others.
  _reconnectLater(err, wasReady) {
    if (!this._backoff || !(wasReady || this._retry) || err.closeCode === CLOSE_POLICY) {
      this._stopReconnecting();
      return;
    }
    const attempt = (this._retry?.attempt ?? 0) + 1;
    const cap = Math.min(this._backoff.maxMs, this._backoff.minMs * 2 ** (attempt - 1));
    // Between half the cap and all of it: clients dropped together do not all return at once.
    const delayMs = Math.round(cap / 2 + (Math.random() * cap) / 2);
    this._stopReconnecting();
    this._retry = { attempt, delayMs, timer: setTimeout(() => this.connect(), delayMs) };
    this.emit('reconnecting', { attempt, delayMs, error: err });
  }

  _stopReconnecting() {
    if (this._retry) clearTimeout(this._retry.timer);
    this._retry = null;
  }
}

/**
 * One utterance. Events: 'started' (its settings), 'audio' ({samples: Float32Array,
 * sampleRate, seq, offset, receivedAt}), 'flushed', 'done' (the server's figures),
 * 'cancelled', 'error' (a VoxwireError; `terminal` says whether the utterance ended), and
 * 'cancel' (cancel() was called: for players).
 */
export class Utterance extends Emitter {
  constructor(client, ctx, settings) {
    super();
    this.client = client;
    this.ctx = ctx;
    this.state = 'pending'; // then 'streaming', and at last 'done', 'cancelled' or 'error'
    this.started = null; // the `started` message: format and sample_rate decode the audio
    this.figures = null; // the `done` message
    this.error = null;
    this.chunks = 0;
    this.samples = 0; // samples received, at the stream's rate
    this.words = []; // {word, start_ms, end_ms} from `timestamps` events, when asked for
    this.times = { created: now(), started: null, firstAudio: null, end: null };
    this._settings = settings;
    this._complete = false;
    this._opus = null; // the Opus decoder, for format "opus"
    this._seq = 0;
    this._reported = -1; // the last `played` sent (flow control): none yet
    this.finished = new Promise((resolve, reject) => { this._resolve = resolve; this._reject = reject; });
    this.finished.catch(() => {}); // rejection is for those who await it, not a global warning
  }

  get format() { return this.started?.format; }
  get sampleRate() { return this.started?.sample_rate; }
  get active() { return this.state === 'pending' || this.state === 'streaming'; }
  /** Milliseconds from speak()/stream() to the first audio frame, once there is one. */
  get ttfaMs() { return this.times.firstAudio === null ? null : this.times.firstAudio - this.times.created; }

  /** Send more text (streamed utterances). */
  write(text) {
    this._text(String(text), false);
    return this;
  }

  /** Speak what has been written without waiting for a sentence end. */
  flush() {
    if (this.active) this._send({ type: 'flush', ctx: this.ctx });
    return this;
  }

  /** The last piece of text (optional): the utterance completes once it is spoken. */
  end(text = '') {
    this._text(String(text), true);
    return this;
  }

  /**
   * Flow control: `samples` of this utterance (at its sampleRate) have been played so far.
   * The server then computes at most its window (ready.limits.flow_window_seconds) ahead
   * of that, however much a proxy in between would buffer. Player calls it as it plays;
   * reports closer than ~100 ms of audio apart are coalesced.
   */
  played(samples) {
    const step = (this.sampleRate ?? 0) / 10;
    if (!this.active || samples <= this._reported || (this._reported >= 0 && samples - this._reported < step)) return this;
    this._reported = samples;
    this._send({ type: 'progress', ctx: this.ctx, played: samples });
    return this;
  }

  /**
   * Barge-in: stop now. No 'audio' event follows, even for frames already on their way.
   * A 'cancel' event is emitted even when the server had already finished, so that a
   * player still playing this utterance drops the rest of it.
   */
  cancel() {
    if (this.active) {
      this._send({ type: 'cancel', ctx: this.ctx });
      this.client._forget(this); // late frames and the server's `cancelled` are dropped
      this._opus?.close();
      const m = { type: 'cancelled', ctx: this.ctx, samples_received: this.samples };
      this._settle('cancelled', m);
      this.emit('cancelled', m);
    }
    this.emit('cancel', this);
  }

  _text(text, final) {
    if (this._complete) throw new Error(`utterance ${this.ctx} already has its final text`);
    if (!this.active) return; // cancelled or failed: there is nobody to send it to
    this._complete = final;
    this._send({ type: 'speak', ctx: this.ctx, text, final });
  }

  _send(message) { this.client._send(message); }

  _receive(m) {
    switch (m.type) {
      case 'started':
        this.started = m;
        // Opus frames are Ogg pages: decoded by the browser, given out as PCM.
        if (m.format === 'opus') this._opus = new OpusStreamDecoder((x) => this._audio(x, now()));
        this.state = 'streaming';
        this.times.started = now();
        this.emit('started', m);
        break;
      case 'audio': {
        if (!this.started) return; // the server always sends `started` first
        const t = now();
        if (this.times.firstAudio === null) this.times.firstAudio = t;
        this.chunks++;
        if (this._opus) {
          try {
            this._opus.push(m.audio, m.samples);
          } catch (e) {
            this._opus.close();
            this._send({ type: 'cancel', ctx: this.ctx }); // nothing more of it can be played
            this._fail(new VoxwireError('undecodable_audio', e.message, { ctx: this.ctx, terminal: true }));
          }
        } else {
          this._audio(toFloat32(m.audio, this.started.format), t);
        }
        break;
      }
      case 'flushed':
        this.emit('flushed', m);
        break;
      case 'timestamps': // with {timestamps: true}: words and their times in this stream
        this.words.push(...m.words);
        this.emit('timestamps', m.words);
        break;
      case 'done':
        this.figures = m;
        this.client._forget(this);
        if (this._opus) {
          // 'done' follows the last decoded samples, as it follows the last PCM frame.
          const opus = this._opus;
          opus.flush().catch(() => {}).then(() => {
            opus.close();
            if (!this.active) return; // cancelled meanwhile
            this._settle('done', m);
            this.emit('done', m);
          });
          break;
        }
        this._settle('done', m);
        this.emit('done', m);
        break;
      case 'cancelled': // cancelled by someone else's call on this ctx; ours settled already
        this._opus?.close();
        this.client._forget(this);
        this._settle('cancelled', m);
        this.emit('cancelled', m);
        break;
      case 'error': {
        const err = new VoxwireError(m.code, m.message, m);
        if (m.terminal) this._fail(err);
        else this.emit('error', err);
        break;
      }
      default:
        break;
    }
  }

  // Samples at the stream's rate, in order: from PCM frames, or from the Opus decoder.
  _audio(samples, receivedAt) {
    if (!this.active) return;
    const offset = this.samples;
    this.samples += samples.length;
    this.emit('audio', { samples, sampleRate: this.started.sample_rate, seq: this._seq++, offset, receivedAt });
  }

  _fail(err) {
    if (!this.active) return;
    this._opus?.close();
    this.error = err;
    this.client._forget(this);
    this._settle('error', null, err);
    this.emit('error', err);
  }

  _settle(state, value, err) {
    if (!this.active) return;
    this.state = state;
    this.times.end = now();
    if (err) this._reject(err);
    else this._resolve(value);
  }
}
