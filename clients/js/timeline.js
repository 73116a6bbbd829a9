// The demo's timeline: audio received (a step per chunk, with a tick at each arrival)
// and audio played, in milliseconds of audio, against milliseconds since Speak.
// Where the played line runs flat while speech was still due, playback stalled.

const COLORS = { received: '#2563eb', played: '#059669', stall: 'rgba(185, 28, 28, .18)', grid: '#e5e7eb', text: '#6b7280' };

/**
 * @param {HTMLCanvasElement} canvas
 * @param {{arrivals: {t: number, ms: number}[], played: {t: number, ms: number}[],
 *          stalls: {from: number, to: number}[], firstAudio: number|null}} run
 *   times in ms since Speak; `ms` is the cumulative audio at that time
 */
export function drawTimeline(canvas, run) {
  const g = canvas.getContext('2d');
  const W = canvas.width;
  const H = canvas.height;
  const pad = { l: 56, r: 24, t: 14, b: 30 };
  const last = (a) => (a.length ? a[a.length - 1] : { t: 0, ms: 0 });
  const tStep = niceStep(Math.max(last(run.arrivals).t, last(run.played).t, 500) / 5);
  const yStep = niceStep(Math.max(last(run.arrivals).ms, last(run.played).ms, 500) / 4);
  const tMax = tStep * Math.ceil(Math.max(last(run.arrivals).t, last(run.played).t, 500) / tStep);
  const yMax = yStep * Math.ceil(Math.max(last(run.arrivals).ms, last(run.played).ms, 500) / yStep);
  const x = (t) => pad.l + (t / tMax) * (W - pad.l - pad.r);
  const y = (ms) => H - pad.b - (ms / yMax) * (H - pad.t - pad.b);

  g.clearRect(0, 0, W, H);
  g.font = '11px system-ui, sans-serif';
  g.lineWidth = 1;
  for (const s of run.stalls) {
    g.fillStyle = COLORS.stall;
    g.fillRect(x(s.from), pad.t, Math.max(1, x(s.to) - x(s.from)), H - pad.t - pad.b);
  }
  g.strokeStyle = COLORS.grid;
  g.fillStyle = COLORS.text;
  g.textAlign = 'center';
  for (let t = 0; t <= tMax; t += tStep) {
    line(g, x(t), pad.t, x(t), H - pad.b);
    g.fillText(`${t}`, x(t), H - pad.b + 13);
  }
  g.textAlign = 'right';
  for (let ms = 0; ms <= yMax; ms += yStep) {
    line(g, pad.l, y(ms), W - pad.r, y(ms));
    g.fillText(`${ms}`, pad.l - 5, y(ms) + 4);
  }
  g.textAlign = 'center';
  g.fillText('ms since Speak', (pad.l + W - pad.r) / 2, H - 3);
  g.save();
  g.translate(12, (pad.t + H - pad.b) / 2);
  g.rotate(-Math.PI / 2);
  g.fillText('ms of audio', 0, 0);
  g.restore();

  // Received: a step at each chunk, and a tick under it.
  g.strokeStyle = COLORS.received;
  g.lineWidth = 2;
  g.beginPath();
  g.moveTo(x(0), y(0));
  let prev = 0;
  for (const a of run.arrivals) {
    g.lineTo(x(a.t), y(prev));
    g.lineTo(x(a.t), y(a.ms));
    prev = a.ms;
  }
  if (run.arrivals.length) g.lineTo(x(tMax), y(prev));
  g.stroke();
  g.lineWidth = 1;
  for (const a of run.arrivals) line(g, x(a.t), H - pad.b, x(a.t), H - pad.b - 6);

  // Played: a line through the worklet's reports.
  g.strokeStyle = COLORS.played;
  g.lineWidth = 2;
  g.beginPath();
  g.moveTo(x(0), y(0));
  for (const p of run.played) g.lineTo(x(p.t), y(p.ms));
  g.stroke();

  legend(g, W - pad.r - 150, H - pad.b - 40); // bottom right: below the played line, which ends top right
}

function legend(g, x0, y0) {
  g.fillStyle = 'rgba(255, 255, 255, .9)';
  g.fillRect(x0 - 6, y0 - 3, 148, 38);
  g.textAlign = 'left';
  g.lineWidth = 2;
  [['received', COLORS.received], ['played', COLORS.played]].forEach(([label, color], i) => {
    g.strokeStyle = color;
    line(g, x0, y0 + 8 + i * 16, x0 + 22, y0 + 8 + i * 16);
    g.fillStyle = '#1d2430';
    g.fillText(label, x0 + 28, y0 + 12 + i * 16);
  });
  g.fillStyle = COLORS.stall;
  g.fillRect(x0 + 80, y0 + 1, 22, 14);
  g.fillStyle = '#1d2430';
  g.fillText('stall', x0 + 106, y0 + 12);
}

function line(g, x1, y1, x2, y2) {
  g.beginPath();
  g.moveTo(x1, y1);
  g.lineTo(x2, y2);
  g.stroke();
}

// A round step at or above v, for the axes' grid: 1, 2, 2.5 or 5 times a power of ten.
function niceStep(v) {
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 2.5, 5, 10].map((m) => m * p).find((c) => c >= v);
}
