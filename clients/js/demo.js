// The demo page: speak a text through Voxwire and show what happened, live.
// It needs no configuration: it talks to /v1/stream on the host that served it
// (or to ?url=ws://…; a server with API keys wants #token=KEY). Tests read
// window.voxwireDemo.
//
// Every figure is the current run's (the last Speak's), even while it waits behind an
// earlier one or after Stop: the player counts each utterance from its own first sample
// (player.progress), so no run's figures include another's.

import { Voxwire, Player, defaultUrl } from './index.js';
import { drawTimeline } from './timeline.js';

const $ = (id) => document.getElementById(id);
const WORD_INTERVAL_MS = 40; // "stream words": about the pace of a language model's tokens

const player = new Player();
const query = new URLSearchParams(location.search);
const url = query.get('url') || defaultUrl();

// The API key of a server started with keys. Best given in the fragment, #token=KEY: a
// fragment never leaves the browser (no request line, no access or proxy log, no
// Referer). ?token=KEY still works, but by now it has reached the server's and every
// proxy's logs; it moves into the fragment at once, so that no reload sends it again and
// history keeps it only there. The client presents it as the subprotocol
// voxwire.token.KEY (browsers cannot set headers on a WebSocket), never in the socket's URL.
function takeKey() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const key = fragment.get('token') || query.get('token') || undefined;
  if (query.has('token')) {
    query.delete('token');
    if (key) fragment.set('token', key);
    const search = query.toString();
    const hash = fragment.toString();
    history.replaceState(history.state, '', `${location.pathname}${search ? `?${search}` : ''}${hash ? `#${hash}` : ''}`);
  }
  return key;
}

// The context's own rate (within 8–48 kHz), so the browser resamples nothing. A lost
// connection is reopened by the client, so the next Speak finds one.
const vx = new Voxwire(url, {
  format: 'pcm_s16le', sampleRate: player.streamRate, token: takeKey(), reconnect: true,
});

const demo = { vx, player, runs: [], current: null, speak };
window.voxwireDemo = demo;

let link = 'connecting'; // then 'open'; 'lost' while reconnecting; 'closed' if the client gave up
let broken = false; // audio cannot play here, or the first connect failed

// body[data-state], for CSS and tests: worked out afresh from what the player still has
// and from the connection, so that no handler running early, or for an older run, can
// leave it behind.
function updateState() {
  let state = link === 'open' ? 'idle' : 'connecting';
  if (broken || link === 'closed') state = 'error';
  else if (player.pending > 0) state = 'speaking';
  else if (link === 'lost') state = 'reconnecting';
  document.body.dataset.state = state;
}

function showError(err) {
  const box = $('error');
  box.hidden = false;
  box.replaceChildren(Object.assign(document.createElement('code'), { textContent: err.code ?? 'error' }), `: ${err.detail ?? err.message}`);
}

function clearError() { $('error').hidden = true; }

// On every `ready`: the first connection's, and each reconnection's.
vx.on('ready', (ready) => {
  link = 'open';
  const select = $('voice');
  const chosen = select.value || ready.defaults?.voice; // a reconnection keeps the listener's choice
  select.replaceChildren(...vx.voices.map((v) => new Option(v.name || v.id, v.id, false, v.id === chosen)));
  select.disabled = false;
  $('speak').disabled = false;
  $('status').textContent = `${ready.engine} · ${vx.voices.length} voice${vx.voices.length === 1 ? '' : 's'} · ${url}`;
  updateState();
});

const closeText = (err) => `${err.closeCode}${err.reason ? `: ${err.reason}` : ''}`;

// A connection that worked is lost (a server restart, a network drop): say so now, not at
// the next Speak. The client then schedules a reconnect ('reconnecting', in this same
// task), unless retrying cannot help (a refused key); a Speak meanwhile connects at once.
vx.on('close', (err) => {
  if (link === 'connecting') return; // the first connect failed: connect() says so
  link = 'closed';
  $('status').textContent = `connection lost (${closeText(err)})`;
  updateState();
});

vx.on('reconnecting', ({ attempt, delayMs, error }) => {
  link = 'lost';
  const again = attempt > 1 ? `, attempt ${attempt}` : '';
  $('status').textContent = `connection lost (${closeText(error)}): reconnecting in ${(delayMs / 1000).toFixed(1)} s${again}…`;
  updateState();
});

async function connect() {
  try {
    await vx.ready; // the 'ready' listener fills the page in
  } catch (err) {
    $('status').textContent = `not connected to ${url}`;
    showError(err);
    broken = true;
    updateState();
  }
}

/** Speak `text`; `words`: feed it word by word. Returns the run's record. */
function speak(text, { voice = $('voice').value, words = $('stream-words').checked } = {}) {
  clearError();
  const clickAt = performance.now();
  player.start().catch((err) => { showError(err); broken = true; updateState(); });
  const run = {
    text, voice, streamed: words, pieces: 0, clickAt, ctx: null, started: null, done: null, error: null,
    result: null, ttfaMs: null, ttfsMs: null, arrivals: [], played: [], stalls: [],
  };
  let u;
  if (words) {
    u = vx.stream({ voice });
    const pieces = text.match(/\S+\s*/g) ?? [];
    const feed = () => {
      if (!u.active) return;
      if (run.pieces < pieces.length) {
        u.write(pieces[run.pieces++]);
        setTimeout(feed, WORD_INTERVAL_MS);
      } else u.end();
    };
    feed();
  } else {
    u = vx.speak(text, { voice });
  }
  run.ctx = u.ctx;
  run.u = u;
  let received = 0;
  u.on('started', (m) => { run.started = m; })
    .on('audio', (a) => {
      received += a.samples.length;
      if (run.ttfaMs === null) run.ttfaMs = a.receivedAt - clickAt;
      run.arrivals.push({ t: a.receivedAt - clickAt, ms: (received / a.sampleRate) * 1000 });
    })
    .on('done', (m) => { run.done = m; })
    .on('error', (err) => {
      run.error = { code: err.code, message: err.detail ?? err.message, terminal: err.terminal };
      showError(err);
    });
  const finished = player.play(u).then((result) => {
    run.result = result;
    updateState();
    render();
    return result;
  });
  run.finished = finished;
  demo.runs.push(run);
  demo.current = run;
  updateState();
  render(); // the figures are this run's from now on: zero until it plays
  return run;
}

player.on('playing', (u) => {
  const run = demo.runs.find((r) => r.u === u);
  if (run) run.ttfsMs = performance.now() - run.clickAt;
});

let drawn = false;
player.on('stats', () => {
  const run = demo.current;
  if (run && !run.result) {
    const p = player.progress(run.u); // this run's own samples: nothing while it waits its turn
    const t = performance.now() - run.clickAt;
    run.played.push({ t, ms: (p.played / player.sampleRate) * 1000 });
    const open = run.stalls.at(-1);
    if (p.state === 'stalled' && !(open && open.to === null)) run.stalls.push({ from: t, to: null });
    if (p.state !== 'stalled' && open && open.to === null) open.to = t;
  }
  if (!drawn) {
    drawn = true;
    requestAnimationFrame(() => { drawn = false; render(); });
  }
});

player.on('error', (err) => {
  showError(err);
  broken = true;
  updateState();
});

function fmtMs(v) { return v === null || v === undefined ? '–' : `${Math.round(v)} ms`; }

function render() {
  const run = demo.current;
  const p = run ? player.progress(run.u) : null; // the current run's, from its own first sample
  const ms = (samples) => (samples / player.sampleRate) * 1000;
  $('ttfa').textContent = fmtMs(run?.ttfaMs);
  $('ttfs').textContent = fmtMs(run?.ttfsMs);
  $('server-ttfa').textContent = fmtMs(run?.done?.ttfa_ms);
  $('buffered').textContent = p ? fmtMs(ms(p.buffered)) : '–';
  $('underruns').textContent = p ? `${p.underruns}${p.stalledSamples ? ` (${Math.round(ms(p.stalledSamples))} ms)` : ''}` : '–';
  $('played').textContent = p ? `${p.played.toLocaleString('en')} (${(p.played / player.sampleRate).toFixed(2)} s)` : '–';
  $('chunks').textContent = run ? String(run.arrivals.length) : '–';
  const rate = run?.started?.sample_rate;
  $('rates').textContent = `${rate ? `${rate} → ` : ''}${player.sampleRate} Hz`;
  $('stop').disabled = player.pending === 0;
  if (run) {
    const stalls = run.stalls.map((x) => ({ from: x.from, to: x.to ?? performance.now() - run.clickAt }));
    drawTimeline($('timeline'), { ...run, stalls });
  }
}

$('speak').addEventListener('click', () => speak($('text').value));
$('stop').addEventListener('click', () => {
  player.stop();
  demo.stoppedAt = { time: performance.now(), played: player.stats.played };
  updateState();
  render();
});

render();
connect();
