/* One experiment (#/experiments/<id>): live per-step charts from the event stream, the
 * summary against its `none` baseline, correctness, environment, downloads, cancel. */

import {
  $, STATUS, TERMINAL, api, detailText, el, kv, loadPlotly, modelLabel, strategyLabel, throttle,
} from './util.js';
import { LiveStream, liveBadge } from './live.js';
import { PLOT_CONFIG, SERIES_METRICS, memoryFigure, seriesFigures, timeFigure } from './charts.js';
import { fitText } from './chart_fit.js';
import { fillForm } from './form.js';
import { renderProgress, watchProgress } from './progress.js';
import { setStatus, renderSpec, renderSummary, renderEnvironment, renderDownloads, renderHistory, findBaseline } from './experiment_summary.js';
import { resetRanks } from './ranks.js';
import { renderTimeline } from './timeline.js';

/** Steps are re-read with their memory breakdown (which the stream does not carry) at most
 * this often while a run is live, and only for runs up to EXTRA_MAX_STEPS steps. */
const EXTRA_REFRESH_MS = 1500;
const EXTRA_MAX_STEPS = 2000;
/** A finished run with more steps is drawn from the downsampled series, not every step. */
const SERIES_ABOVE_STEPS = 5000;
const SERIES_POINTS = 2000;
const CHARTS = ['chart-memory', 'chart-time'];

let cur = null; // {id, token, exp, attempt, steps: Map, series, zoom, stream, poll, finished}
let token = 0;

function live() {
  return cur && cur.token === token;
}

// ------------------------------------------------------------------ charts

function sortedSteps() {
  return Array.from(cur.steps.values()).sort((a, b) => a.step - b.step);
}

async function drawCharts() {
  if (!live()) return;
  const c = cur;
  let Plotly;
  try {
    Plotly = await loadPlotly();
  } catch (err) {
    for (const id of ['chart-memory', 'chart-time']) $(id).textContent = `Charts unavailable: ${err.message}.`;
    return;
  }
  if (c !== cur) return;
  let mem;
  let time;
  $('chart-memory-title').textContent = c.series ? 'Memory per step' : "Memory at each step's peak, by category";
  $('chart-memory-caption').textContent = c.series
    ? 'Peak allocated and allocated at the end of the forward pass. A long run: each line is downsampled on the server, spikes kept; drag across a range to read it again at full resolution, double-click for the whole run. The breakdown by category is in the summary.'
    : "Stacked: what was live when the step reached its peak. The line is the peak allocated. Shaded: warm-up steps, left out of the medians.";
  if (c.series) {
    ({ memory: mem, time } = seriesFigures(c.exp.spec, c.zoom ? c.zoom.series : c.series));
    if (c.zoom) {
      for (const fig of [mem, time]) fig.layout.xaxis = { ...fig.layout.xaxis, range: c.zoom.range, autorange: false };
    }
  } else {
    const steps = sortedSteps();
    mem = memoryFigure(c.exp.spec, steps, c.finished);
    time = timeFigure(c.exp.spec, steps, c.finished);
  }
  await Promise.all([
    Plotly.react('chart-memory', mem.data, mem.layout, PLOT_CONFIG).then(fitText),
    Plotly.react('chart-time', time.data, time.layout, PLOT_CONFIG).then(fitText),
  ]);
  if (c.series && c === cur) watchZoom(c);
}

// ------------------------------------------------------------------ zoom (long runs)

/** Zooming either chart of a long run reads that step range again from the server (every
 * step of it when it holds at most SERIES_POINTS steps) and draws both charts over it;
 * a double-click (autorange) goes back to the whole run. */
function watchZoom(c) {
  for (const id of CHARTS) {
    const gd = $(id);
    if (gd.ckptlabZoom === c) continue;
    if (gd.removeAllListeners) gd.removeAllListeners('plotly_relayout');
    gd.on('plotly_relayout', (ev) => zoomTo(c, ev));
    gd.ckptlabZoom = c;
  }
}

/** The x range a relayout event sets ([from, to]), 'whole' for an autorange, else null
 * (a resize, a y-only zoom). */
function zoomRange(ev) {
  if (ev['xaxis.autorange']) return 'whole';
  const r = ev['xaxis.range'] || (ev['xaxis.range[0]'] !== undefined ? [ev['xaxis.range[0]'], ev['xaxis.range[1]']] : null);
  if (!r) return null;
  const [a, b] = r.map(Number);
  return Number.isFinite(a) && Number.isFinite(b) ? [Math.min(a, b), Math.max(a, b)] : null;
}

/** [first, last] step of a long run's series. */
function seriesSpan(series) {
  const xs = Object.values(series).map((s) => s.x).filter((x) => x.length);
  return [Math.min(...xs.map((x) => x[0])), Math.max(...xs.map((x) => x[x.length - 1]))];
}

async function zoomTo(c, ev) {
  const range = zoomRange(ev);
  if (c !== cur || !c.series || range === null) return;
  c.zoomSeq = (c.zoomSeq || 0) + 1;
  const seq = c.zoomSeq;
  const [first, last] = seriesSpan(c.series);
  // A double-click resets to the initial range: the whole run, already drawn.
  if (range === 'whole' || (range[0] <= first && range[1] >= last)) {
    c.zoom = null;
    await drawCharts();
    return;
  }
  const lo = Math.max(0, Math.ceil(range[0]));
  const hi = Math.floor(range[1]);
  if (hi < lo) return;
  const q = `max_points=${SERIES_POINTS}&step_min=${lo}&step_max=${hi}`;
  const answers = await Promise.all(SERIES_METRICS.map((m) => api(`/api/experiments/${c.id}/series?metric=${m}&${q}`)));
  if (c !== cur || seq !== c.zoomSeq) return; // a later zoom or another page won
  const series = {};
  SERIES_METRICS.forEach((m, i) => {
    if (answers[i].ok && answers[i].body) series[m] = answers[i].body;
  });
  c.zoom = { range, series };
  await drawCharts();
}

function mergeSteps(rows, { replace = false } = {}) {
  if (replace) cur.steps = new Map();
  for (const r of rows) {
    const old = cur.steps.get(r.step);
    cur.steps.set(r.step, old && old.extra && !r.extra ? { ...r, extra: old.extra } : r);
  }
}

/** A finished long run: downsampled series of each metric instead of every step. */
async function fetchSeries() {
  const c = cur;
  const answers = await Promise.all(SERIES_METRICS.map((m) => api(`/api/experiments/${c.id}/series?metric=${m}&max_points=${SERIES_POINTS}`)));
  if (c !== cur) return false;
  c.series = {};
  SERIES_METRICS.forEach((m, i) => {
    if (answers[i].ok && answers[i].body) c.series[m] = answers[i].body;
  });
  return true;
}

/** Everything a finished run draws: its steps, or its series when it has many. */
async function fetchFinal() {
  const c = cur;
  const total = Math.max(c.steps.size, (c.exp && c.exp.spec && c.exp.spec.steps) || 0);
  if (total > SERIES_ABOVE_STEPS) {
    const r = await api(`/api/experiments/${c.id}/series?metric=step_ms&max_points=10`);
    if (c !== cur) return false;
    if (r.ok && r.body && r.body.total > SERIES_ABOVE_STEPS) return fetchSeries();
  }
  return fetchSteps();
}

async function fetchSteps() {
  const c = cur;
  const r = await api(`/api/experiments/${c.id}/steps`);
  if (c !== cur || !r.ok || !r.body) return false;
  mergeSteps(r.body.data, { replace: true });
  return true;
}

// ------------------------------------------------------------------ live

function stopLive() {
  if (!cur) return;
  if (cur.stream) cur.stream.close();
  clearTimeout(cur.poll);
  clearInterval(cur.progressTimer);
  cur.stream = null;
}

/** The run has finished: read everything once more, draw, and only then show the status. */
async function finalize() {
  const c = cur;
  if (c.finalizing) return;
  c.finalizing = true;
  stopLive();
  try {
    const r = await api(`/api/experiments/${c.id}`);
    if (c !== cur || !r.ok) return;
    c.exp = r.body;
    c.finished = true;
    await fetchFinal();
    if (c !== cur) return;
    renderAll(c.exp);
    await drawCharts();
    if (c !== cur) return;
    setStatus(c.exp.status);
    renderProgress(c.exp);
    $('exp-live').hidden = true;
    document.title = `ckptlab · #${c.exp.id} ${c.exp.status}`;
    if (c.exp.status === STATUS.SUCCEEDED) {
      const baseline = await findBaseline(c.exp);
      if (c === cur) renderSummary(c.exp, baseline);
    }
  } finally {
    c.finalizing = false;
  }
}

/**
 * Redraws at most every 250 ms, and never more than half the time: the wait after a
 * redraw is at least twice what it took, so a fast run on a slow machine cannot starve
 * the page. Calls while a redraw runs are folded into one more.
 */
function redrawScheduler(c) {
  let timer = null;
  let last = 0;
  let cost = 0;
  let running = false;
  let pending = false;
  const schedule = () => {
    if (c !== cur) return;
    if (running) {
      pending = true;
      return;
    }
    if (timer) return;
    timer = setTimeout(run, Math.max(0, last + Math.max(250, 2 * cost) - Date.now()));
  };
  async function run() {
    timer = null;
    if (c !== cur) return;
    running = true;
    const t0 = performance.now();
    try {
      await drawCharts();
    } finally {
      running = false;
      cost = performance.now() - t0;
      last = Date.now();
      if (pending) {
        pending = false;
        schedule();
      }
    }
  }
  return schedule;
}

function startStream() {
  const c = cur;
  const redraw = redrawScheduler(c);
  const refreshExtras = throttle(async () => {
    if (c !== cur || c.finished || c.steps.size > EXTRA_MAX_STEPS) return;
    try {
      if (await fetchSteps()) redraw();
    } catch (_) {
      /* server unreachable (banner shown): the stream's next step tries again */
    }
  }, EXTRA_REFRESH_MS);
  c.stream = new LiveStream(`/api/experiments/${c.id}/events`, {
    step(d) {
      if (d.attempt > c.attempt) {
        c.attempt = d.attempt;
        c.steps = new Map();
      } else if (d.attempt < c.attempt) return;
      mergeSteps([d]);
      redraw();
      refreshExtras();
    },
    status(d) {
      if (d.attempt > c.attempt) {
        c.attempt = d.attempt;
        c.steps = new Map();
        redraw();
      }
      if (TERMINAL.has(d.status)) {
        finalize();
      } else {
        const moved = d.status !== c.exp.status || d.attempt !== c.exp.attempt;
        c.exp = { ...c.exp, status: d.status, attempt: d.attempt, progress: moved ? null : c.exp.progress };
        renderProgress(c.exp);
        setStatus(d.status);
        renderHistory(c.id);
        renderSummary(c.exp, null);
        if (d.status === STATUS.RUNNING && !c.exp.started_at) {
          api(`/api/experiments/${c.id}`).then((r) => {
            if (c === cur && r.ok && !c.finished) {
              c.exp = r.body;
              renderSummary(c.exp, null);
            }
          }, () => {});
        }
      }
    },
  }, { onState: liveBadge('exp-live', () => startPolling()) });
  $('exp-live').hidden = false;
}

/** Fallback when the event stream cannot be used: read the experiment every second. */
function startPolling() {
  const c = cur;
  if (c !== cur) return;
  $('exp-live').hidden = true;
  const tick = async () => {
    if (c !== cur) return;
    try {
      const r = await api(`/api/experiments/${c.id}`);
      if (c !== cur) return;
      if (r.ok && r.body) {
        if (TERMINAL.has(r.body.status)) {
          finalize();
          return;
        }
        c.exp = r.body;
        setStatus(r.body.status);
        renderProgress(r.body);
        renderSummary(r.body, null);
        if ((r.body.spec.steps || 0) <= SERIES_ABOVE_STEPS) await fetchSteps();
        else await fetchSeries();
        await drawCharts();
      }
    } catch (_) { /* banner shown */ }
    if (c === cur) c.poll = setTimeout(tick, 1000);
  };
  tick();
}

// ------------------------------------------------------------------ view

function renderAll(exp) {
  $('exp-title').textContent = `Experiment #${exp.id} · ${modelLabel(exp.spec)} · ${strategyLabel(exp.spec)}`;
  $('exp-sweep-crumb').replaceChildren(...(exp.sweep_id ? [' · ', el('a', { href: `#/sweeps/${exp.sweep_id}` }, `Sweep #${exp.sweep_id}`)] : []));
  renderSpec(exp.spec, exp.summary);
  renderSummary(exp, null);
  renderProgress(exp);
  renderEnvironment(exp.summary);
  renderDownloads(exp);
  renderHistory(exp.id);
  renderTimeline(exp);
}

function reset(id) {
  $('exp-title').textContent = `Experiment #${id}`;
  $('exp-status').textContent = '';
  $('exp-status').className = 'status';
  $('exp-cancel').hidden = true;
  $('exp-live').hidden = true;
  $('exp-progress').hidden = true;
  $('exp-progress-row').hidden = true;
  $('exp-timing').textContent = '';
  $('exp-notfound').hidden = true;
  $('exp-error').hidden = true;
  $('exp-headline').hidden = true;
  $('exp-summary').replaceChildren();
  $('exp-breakdown').replaceChildren();
  $('exp-spec').replaceChildren();
  $('exp-downloads').replaceChildren();
  $('exp-sweep-crumb').replaceChildren();
  kv($('exp-env'), [['—', 'recorded when the run finishes', { class: 'muted' }]]);
  $('exp-spec-json').textContent = '';
  $('exp-history').replaceChildren();
  $('exp-warnings-box').hidden = true;
  resetRanks();
  $('summary-pending').hidden = false;
  $('summary-pending').textContent = 'Loading…';
  if (window.Plotly) {
    window.Plotly.purge('chart-memory');
    window.Plotly.purge('chart-time');
  }
}

export async function showExperiment(id) {
  hideExperiment();
  token += 1;
  cur = { id, token, exp: null, attempt: 0, steps: new Map(), series: null, zoom: null, stream: null, poll: null, finished: false };
  const c = cur;
  reset(id);
  loadPlotly().catch(() => {});
  let r;
  try {
    r = await api(`/api/experiments/${id}`);
  } catch (_) {
    if (c === cur) c.poll = setTimeout(() => showExperiment(id), 2000);
    return;
  }
  if (c !== cur) return;
  if (r.status === 404 || r.status === 422) {
    const nf = $('exp-notfound');
    nf.textContent = `There is no experiment ${id}.`;
    nf.hidden = false;
    $('summary-pending').textContent = '';
    return;
  }
  if (!r.ok) return;
  c.exp = r.body;
  c.attempt = r.body.attempt;
  renderAll(c.exp);
  if (TERMINAL.has(c.exp.status)) {
    c.finished = true;
    await fetchFinal();
    if (c !== cur) return;
    await drawCharts();
    if (c !== cur) return;
    setStatus(c.exp.status);
    document.title = `ckptlab · #${id} ${c.exp.status}`;
    if (c.exp.status === STATUS.SUCCEEDED) {
      const baseline = await findBaseline(c.exp);
      if (c === cur) renderSummary(c.exp, baseline);
    }
    return;
  }
  setStatus(c.exp.status);
  document.title = `ckptlab · #${id} ${c.exp.status}`;
  drawCharts();
  c.progressTimer = watchProgress(c, () => c === cur);
  if (typeof EventSource === 'function') startStream();
  else startPolling();
}

export function hideExperiment() {
  stopLive();
  cur = null;
}

export function initExperiment() {
  $('exp-cancel').addEventListener('click', async () => {
    if (!cur) return;
    const c = cur;
    const b = $('exp-cancel');
    b.disabled = true;
    b.textContent = 'Cancelling…';
    try {
      const r = await api(`/api/experiments/${c.id}/cancel`, { method: 'POST' });
      if (c !== cur) return;
      if (r.ok && r.body) {
        if (TERMINAL.has(r.body.status)) finalize();
      } else {
        $('exp-error').replaceChildren(el('strong', null, 'Cannot cancel: '), detailText(r.body));
        $('exp-error').hidden = false;
      }
    } finally {
      b.disabled = false;
      b.textContent = 'Cancel';
    }
  });
  $('exp-copy').addEventListener('click', () => {
    if (!cur || !cur.exp) return;
    fillForm(cur.exp.spec);
    location.hash = '#/new';
  });
}
