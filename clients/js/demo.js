// The demo page: speak a text through Voxwire and show what happened, live.
// It needs no configuration: it talks to /v1/stream on the host that served it
// (or to ?url=ws://…, with ?token=KEY for a server with API keys). Tests read
// window.voxwireDemo.

import { Voxwire, Player, defaultUrl } from './index.js';
import { drawTimeline } from './timeline.js';

const $ = (id) => document.getElementById(id);
const WORD_INTERVAL_MS = 40; // "stream words": about the pace of a language model's tokens

const player = new Player();
const query = new URLSearchParams(location.search);
const url = query.get('url') || defaultUrl();
// The context's own rate (within 8–48 kHz), so the browser resamples nothing. A server
// started with API keys wants one: open the page with ?token=KEY.
const vx = new Voxwire(url, { format: 'pcm_s16le', sampleRate: player.streamRate, token: query.get('token') || undefined });

const demo = { vx, player, runs: [], current: null, speak };
window.voxwireDemo = demo;

function setState(state) { document.body.dataset.state = state; }

function showError(err) {
  const box = $('error');
  box.hidden = false;
  box.replaceChildren(Object.assign(document.createElement('code'), { textContent: err.code ?? 'error' }), `: ${err.detail ?? err.message}`);
}

function clearError() { $('error').hidden = true; }

async function connect() {
  try {
    const ready = await vx.ready;
    const select = $('voice');
    select.replaceChildren(...vx.voices.map((v) => new Option(v.name || v.id, v.id, false, v.id === ready.defaults?.voice)));
    select.disabled = false;
    $('speak').disabled = false;
    $('status').textContent = `${ready.engine} · ${vx.voices.length} voice${vx.voices.length === 1 ? '' : 's'} · ${url}`;
    setState('idle');
  } catch (err) {
    $('status').textContent = `not connected to ${url}`;
    showError(err);
    setState('error');
  }
}

/** Speak `text`; `words`: feed it word by word. Returns the run's record. */
function speak(text, { voice = $('voice').value, words = $('stream-words').checked } = {}) {
  clearError();
  const clickAt = performance.now();
  player.start().catch((err) => { showError(err); setState('error'); });
  const run = {
    text, voice, streamed: words, pieces: 0, clickAt, ctx: null, started: null, done: null, error: null,
    result: null, ttfaMs: null, ttfsMs: null, playedAtClick: player.stats.played,
    arrivals: [], played: [], stalls: [],
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
    if (demo.current === run) setState(player.stats.state === 'idle' ? 'idle' : 'speaking');
    render();
    return result;
  });
  run.finished = finished;
  demo.runs.push(run);
  demo.current = run;
  setState('speaking');
  $('stop').disabled = false;
  return run;
}

player.on('playing', (u) => {
  const run = demo.runs.find((r) => r.u === u);
  if (run) run.ttfsMs = performance.now() - run.clickAt;
});

let drawn = false;
player.on('stats', (s) => {
  const run = demo.current;
  if (run && !run.result) {
    const t = performance.now() - run.clickAt;
    run.played.push({ t, ms: ((s.played - run.playedAtClick) / player.sampleRate) * 1000 });
    const open = run.stalls.at(-1);
    if (s.state === 'stalled' && !(open && open.to === null)) run.stalls.push({ from: t, to: null });
    if (s.state !== 'stalled' && open && open.to === null) open.to = t;
  }
  if (!drawn) {
    drawn = true;
    requestAnimationFrame(() => { drawn = false; render(); });
  }
});

player.on('error', (err) => { showError(err); setState('error'); });

function fmtMs(v) { return v === null || v === undefined ? '–' : `${Math.round(v)} ms`; }

function render() {
  const s = player.stats;
  const run = demo.current;
  $('ttfa').textContent = fmtMs(run?.ttfaMs);
  $('ttfs').textContent = fmtMs(run?.ttfsMs);
  $('server-ttfa').textContent = fmtMs(run?.done?.ttfa_ms);
  $('buffered').textContent = fmtMs(s.bufferedMs);
  $('underruns').textContent = `${s.underruns}${s.stallMs ? ` (${Math.round(s.stallMs)} ms)` : ''}`;
  // Since the last Speak (the worklet's counter, less what it had played before the click).
  const played = s.played - (run?.playedAtClick ?? 0);
  $('played').textContent = `${played.toLocaleString('en')} (${(played / player.sampleRate).toFixed(2)} s)`;
  $('played').title = `${s.played.toLocaleString('en')} samples since the page opened`;
  $('chunks').textContent = run ? String(run.arrivals.length) : '–';
  const rate = run?.started?.sample_rate;
  $('rates').textContent = `${rate ? `${rate} → ` : ''}${player.sampleRate} Hz`;
  $('stop').disabled = s.state === 'idle' && !(run && !run.result);
  if (run) {
    const stalls = run.stalls.map((x) => ({ from: x.from, to: x.to ?? performance.now() - run.clickAt }));
    drawTimeline($('timeline'), { ...run, stalls });
  }
}

$('speak').addEventListener('click', () => speak($('text').value));
$('stop').addEventListener('click', () => {
  player.stop();
  demo.stoppedAt = { time: performance.now(), played: player.stats.played };
  setState('idle');
  render();
});

render();
connect();
