/* One experiment (#/experiments/<id>): live per-step charts from the event stream, the
 * summary against its `none` baseline, correctness, environment, downloads, cancel. */

import {
  $, LiveStream, RECOMPUTING, TERMINAL, api, detailText, el, fmtAgo, fmtBytes, fmtDate, fmtDiff, fmtDuration, fmtInt,
  fmtMs, fmtPct, gradBadge, kv, loadPlotly, modelLabel, strategyLabel, throttle,
} from './util.js';
import { PLOT_CONFIG, CATEGORIES, SERIES_METRICS, memoryFigure, seriesFigures, timeFigure } from './charts.js';
import { fillForm } from './form.js';

/** Steps are re-read with their memory breakdown (which the stream does not carry) at most
 * this often while a run is live, and only for runs up to EXTRA_MAX_STEPS steps. */
const EXTRA_REFRESH_MS = 1500;
const EXTRA_MAX_STEPS = 2000;
/** A finished run with more steps is drawn from the downsampled series, not every step. */
const SERIES_ABOVE_STEPS = 5000;
const SERIES_POINTS = 2000;

let cur = null; // {id, token, exp, attempt, steps: Map, stream, poll, finished}
let token = 0;

function live() {
  return cur && cur.token === token;
}

// ------------------------------------------------------------------ rendering

function setStatus(status) {
  const node = $('exp-status');
  node.textContent = status;
  node.className = `status badge status-${status}`;
  $('exp-cancel').hidden = !(status === 'queued' || status === 'running');
}

function renderSpec(spec) {
  const m = spec.model || {};
  const c = spec.checkpoint || {};
  const modelParts = Object.entries(m)
    .filter(([k]) => k !== 'kind')
    .map(([k, v]) => `${k} ${typeof v === 'object' && v !== null ? JSON.stringify(v) : v}`);
  const entries = [
    ['Model', [m.kind, ...modelParts].join(' · ')],
    ['Batch', `${fmtInt(spec.batch_size)}${spec.grad_accum_steps > 1 ? ` × ${spec.grad_accum_steps} accumulated` : ''}`],
    ['Steps', `${spec.steps} (${spec.warmup_steps} warm-up)`],
    ['Checkpointing', c.strategy === 'sequential' ? `sequential, ${c.segments} segments` : strategyLabel(spec)],
  ];
  if (RECOMPUTING.has(c.strategy)) {
    entries.push(['use_reentrant', String(c.use_reentrant)]);
    entries.push(['preserve_rng_state', String(c.preserve_rng_state)]);
  }
  entries.push(
    ['AMP · optimizer', `${spec.amp} · ${spec.optimizer}`],
    ['Device · seed', `${spec.device} · ${spec.seed}`],
  );
  if (spec.memory_limit_bytes) entries.push(['Memory limit', fmtBytes(spec.memory_limit_bytes)]);
  if (spec.timeout_s) entries.push(['Timeout', `${spec.timeout_s} s`]);
  entries.push(['Gradient check', spec.verify_gradients === false ? 'off' : 'on']);
  if (spec.memory_snapshot) entries.push(['Memory snapshot', 'requested']);
  kv($('exp-spec'), entries);
  $('exp-spec-json').textContent = JSON.stringify(spec, null, 2);
}

function bytesDd(v) {
  return { title: v !== null && v !== undefined ? `${fmtInt(v)} bytes` : null };
}

/** "−42% vs baseline" style change, colored by whether lower is better. */
function delta(v, base, { lowerIsBetter = true } = {}) {
  if (typeof v !== 'number' || typeof base !== 'number' || !base) return null;
  const pct = 100 * (v / base - 1);
  const good = lowerIsBetter ? pct < -0.5 : pct > 0.5;
  const bad = lowerIsBetter ? pct > 0.5 : pct < -0.5;
  return el('span', { class: `delta ${good ? 'good' : bad ? 'bad' : ''}` }, `${fmtPct(pct)} vs baseline`);
}

function renderSummary(exp, baseline) {
  const s = exp.summary;
  const pending = $('summary-pending');
  pending.hidden = Boolean(s);
  pending.textContent = TERMINAL.has(exp.status)
    ? `The run ended (${exp.status.replace('_', ' ')}) without a summary.`
    : exp.status === 'queued' ? 'Queued: waiting for a worker.' : 'Running: the summary appears when it finishes.';
  const headline = $('exp-headline');
  if (!s) {
    $('exp-summary').replaceChildren();
    $('exp-breakdown').replaceChildren();
    headline.hidden = true;
  } else {
    const b = baseline && baseline.summary;
    const isBaseline = (exp.spec.checkpoint || {}).strategy === 'none';
    headline.hidden = false;
    headline.replaceChildren(
      el('div', { class: 'metric' }, el('span', { class: 'label' }, 'Activations'),
        el('span', { class: 'value', id: 'm-activation' }, fmtBytes(s.activation_bytes)),
        b && !isBaseline ? delta(s.activation_bytes, b.activation_bytes) : null),
      el('div', { class: 'metric' }, el('span', { class: 'label' }, 'Peak allocated'),
        el('span', { class: 'value', id: 'm-peak' }, fmtBytes(s.peak_allocated_bytes)),
        b && !isBaseline ? delta(s.peak_allocated_bytes, b.peak_allocated_bytes) : null),
      el('div', { class: 'metric' }, el('span', { class: 'label', title: 'median over the steps after warm-up' }, 'Step time'),
        el('span', { class: 'value', id: 'm-time' }, fmtMs(s.step_time_ms)),
        b && !isBaseline ? delta(s.step_time_ms, b.step_time_ms) : null),
      el('div', { class: 'metric' }, el('span', { class: 'label' }, 'Gradients'),
        el('span', { class: 'value', id: 'm-grad' }, gradBadge(s.gradients_match ?? null, s.grad_max_abs_diff))),
    );
    let baselineEntry;
    if (isBaseline) baselineEntry = ['Baseline', 'this run is a baseline (no checkpointing)'];
    else if (baseline) {
      const overhead = typeof s.step_time_ms === 'number' && b && b.step_time_ms ? 100 * (s.step_time_ms / b.step_time_ms - 1) : null;
      baselineEntry = ['Overhead vs baseline', el('span', null,
        el('strong', { id: 'exp-overhead' }, fmtPct(overhead)), ' step time against ',
        el('a', { href: `#/experiments/${baseline.id}` }, `#${baseline.id}`), ' (strategy none)')];
    } else {
      baselineEntry = ['Overhead vs baseline', el('span', null, 'no succeeded baseline with this spec yet ',
        el('button', { type: 'button', class: 'secondary small', id: 'exp-run-baseline' }, 'Run the baseline'))];
    }
    const grad = s.gradients_match === null || s.gradients_match === undefined
      ? 'not verified'
      : `${s.gradients_match ? 'match' : 'differ'}: max |Δgrad| = ${fmtDiff(s.grad_max_abs_diff)}${s.grad_max_abs ? ` (largest gradient ${fmtDiff(s.grad_max_abs)})` : ''}`;
    kv($('exp-summary'), [
      ['Activation memory', fmtBytes(s.activation_bytes), bytesDd(s.activation_bytes)],
      ['Peak allocated', fmtBytes(s.peak_allocated_bytes), bytesDd(s.peak_allocated_bytes)],
      ['Recomputation peak', fmtBytes(s.recompute_peak_bytes), bytesDd(s.recompute_peak_bytes)],
      s.reserved_bytes !== undefined && s.reserved_bytes !== null ? ['Reserved (CUDA)', fmtBytes(s.reserved_bytes), bytesDd(s.reserved_bytes)] : null,
      ['Step time (median)', fmtMs(s.step_time_ms)],
      ['Forward / backward / optimizer', `${fmtMs(s.forward_ms)} / ${fmtMs(s.backward_ms)} / ${fmtMs(s.optimizer_ms)}`],
      baselineEntry,
      ['Gradient check', grad, s.gradients_match === false ? { class: 'bad', id: 'exp-grad' } : { id: 'exp-grad' }],
      ['Params without grad', fmtInt(s.params_without_grad), s.params_without_grad > 0 ? { class: 'bad' } : null],
      ['Parameters', fmtInt(s.param_count)],
      ['Final loss', typeof s.final_loss === 'number' ? s.final_loss.toPrecision(5) : '—'],
    ]);
    const runBaseline = $('exp-run-baseline');
    if (runBaseline) runBaseline.addEventListener('click', () => submitBaseline(exp.spec, runBaseline));
    renderBreakdown(s);
  }
  const warnings = [...new Set([...(exp.warnings || []), ...((s && s.warnings) || [])])];
  $('exp-warnings').replaceChildren(...warnings.map((w) => el('li', null, w)));
  $('exp-warnings-box').hidden = warnings.length === 0;

  const errBox = $('exp-error');
  if (exp.error) {
    const first = exp.error.split('\n')[0];
    errBox.replaceChildren(el('strong', null, `${exp.status.replace('_', ' ')}: `), first,
      exp.error.includes('\n') ? el('details', null, el('summary', null, 'details'), el('pre', null, exp.error)) : null);
    errBox.hidden = false;
  } else {
    errBox.hidden = true;
  }
  const parts = [`created ${fmtDate(exp.created_at)}`];
  if (exp.started_at) parts.push(`started ${fmtAgo(exp.started_at)}`);
  if (exp.finished_at) {
    const took = fmtDuration(exp.started_at, exp.finished_at);
    parts.push(`finished ${fmtDate(exp.finished_at)}${took ? ` (took ${took})` : ''}`);
  }
  if (exp.worker_id) parts.push(`worker ${exp.worker_id}`);
  if (exp.attempt > 1) parts.push(`attempt ${exp.attempt}`);
  $('exp-timing').textContent = parts.join(' · ');
}

/** Memory by category at the end of forward and at the peak, as a small table. */
function renderBreakdown(s) {
  const fe = s.memory_at_forward_end || {};
  const pk = s.memory_at_peak || {};
  if (!Object.keys(pk).length && !Object.keys(fe).length) {
    $('exp-breakdown').replaceChildren();
    return;
  }
  const rows = CATEGORIES.map(([key, label, color]) => el('tr', null,
    el('th', { scope: 'row' }, el('span', { class: 'swatch', style: `background:${color}` }), label),
    el('td', { class: 'num' }, fmtBytes(fe[key])),
    el('td', { class: 'num' }, fmtBytes(pk[key]))));
  $('exp-breakdown').replaceChildren(
    el('h4', null, 'Memory by category'),
    el('table', { class: 'data compact breakdown' },
      el('thead', null, el('tr', null, el('th', null, ''), el('th', { class: 'num' }, 'end of forward'), el('th', { class: 'num' }, 'at the peak'))),
      el('tbody', null, rows)),
  );
}

function renderEnvironment(s) {
  const env = (s && s.environment) || null;
  if (!env) return;
  const labels = {
    torch_version: 'PyTorch', device: 'Device', device_name: 'Device name', cuda_version: 'CUDA',
    capability: 'Compute capability', host: 'Host', python: 'Python', cpu_threads: 'CPU threads',
  };
  kv($('exp-env'), Object.entries(env).map(([k, v]) => [labels[k] || k,
    v === null || v === undefined ? '—' : Array.isArray(v) ? v.join('.') : typeof v === 'object' ? JSON.stringify(v) : String(v)]));
}

function renderDownloads(exp) {
  const id = exp.id;
  const links = [
    el('a', { href: `/api/experiments/${id}/steps?format=csv`, download: `experiment-${id}-steps.csv`, class: 'button secondary small' }, 'Steps CSV'),
    el('a', { href: `/api/experiments/${id}/steps`, download: `experiment-${id}-steps.json`, class: 'button secondary small' }, 'Steps JSON'),
    el('a', { href: `/api/experiments/export?format=json&ids=${id}`, download: `experiment-${id}.json`, class: 'button secondary small' }, 'Experiment JSON'),
  ];
  if (exp.has_snapshot) {
    links.push(el('a', { href: `/api/experiments/${id}/snapshot`, download: `ckptlab-${id}-snapshot.pickle`, class: 'button secondary small', id: 'exp-snapshot', title: 'open at pytorch.org/memory_viz' }, 'Memory snapshot'));
  }
  $('exp-downloads').replaceChildren(...links);
}

async function submitBaseline(spec, button) {
  button.disabled = true;
  const body = JSON.parse(JSON.stringify(spec));
  body.checkpoint = { ...(body.checkpoint || {}), strategy: 'none' };
  try {
    const r = await api('/api/experiments', { json: body });
    if (r.ok && r.body) location.hash = `#/experiments/${r.body.id}`;
    else button.replaceWith(el('span', { class: 'bad' }, detailText(r.body)));
  } catch (_) {
    button.disabled = false;
  }
}

// ------------------------------------------------------------------ baseline

function sameExceptCheckpoint(a, b) {
  const strip = (s) => {
    const c = JSON.parse(JSON.stringify(s));
    for (const k of ['checkpoint', 'timeout_s', 'memory_snapshot', 'verify_gradients']) delete c[k];
    return JSON.stringify(c, Object.keys(flatKeys(c)).sort());
  };
  return strip(a) === strip(b);
}

function flatKeys(obj, out = {}) {
  for (const [k, v] of Object.entries(obj)) {
    out[k] = true;
    if (v && typeof v === 'object' && !Array.isArray(v)) flatKeys(v, out);
  }
  return out;
}

/** The succeeded `none` run to compare with: the sweep's, else the newest with the same spec. */
async function findBaseline(exp) {
  if ((exp.spec.checkpoint || {}).strategy === 'none') return null;
  try {
    if (exp.sweep_id) {
      const r = await api(`/api/sweeps/${exp.sweep_id}/results`);
      const row = r.ok && r.body ? r.body.data.find((d) => d.experiment_id === exp.id) : null;
      if (row && row.baseline_id) {
        const b = await api(`/api/experiments/${row.baseline_id}`);
        if (b.ok && b.body && b.body.status === 'succeeded') return b.body;
      }
    }
    const q = new URLSearchParams({ strategy: 'none', status: 'succeeded', model_kind: exp.spec.model.kind, limit: '500' });
    const r = await api(`/api/experiments?${q}`);
    if (!r.ok || !r.body) return null;
    return r.body.data.find((d) => d.id !== exp.id && sameExceptCheckpoint(d.spec, exp.spec)) || null;
  } catch (_) {
    return null;
  }
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
    ? 'Peak allocated and allocated at the end of the forward pass. A long run: each line is downsampled on the server, spikes kept; the breakdown by category is in the summary.'
    : "Stacked: what was live when the step reached its peak. The line is the peak allocated. Shaded: warm-up steps, left out of the medians.";
  if (c.series) {
    ({ memory: mem, time } = seriesFigures(c.exp.spec, c.series));
  } else {
    const steps = sortedSteps();
    mem = memoryFigure(c.exp.spec, steps, c.finished);
    time = timeFigure(c.exp.spec, steps, c.finished);
  }
  await Promise.all([
    Plotly.react('chart-memory', mem.data, mem.layout, PLOT_CONFIG),
    Plotly.react('chart-time', time.data, time.layout, PLOT_CONFIG),
  ]);
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
    $('exp-live').hidden = true;
    document.title = `ckptlab · #${c.exp.id} ${c.exp.status}`;
    if (c.exp.status === 'succeeded') {
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
    if (await fetchSteps()) redraw();
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
        c.exp = { ...c.exp, status: d.status, attempt: d.attempt };
        setStatus(d.status);
        renderSummary(c.exp, null);
        if (d.status === 'running' && !c.exp.started_at) {
          api(`/api/experiments/${c.id}`).then((r) => {
            if (c === cur && r.ok && !c.finished) {
              c.exp = r.body;
              renderSummary(c.exp, null);
            }
          }, () => {});
        }
      }
    },
  }, { onBroken: () => startPolling() });
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
  renderSpec(exp.spec);
  renderSummary(exp, null);
  renderEnvironment(exp.summary);
  renderDownloads(exp);
}

function reset(id) {
  $('exp-title').textContent = `Experiment #${id}`;
  $('exp-status').textContent = '';
  $('exp-status').className = 'status';
  $('exp-cancel').hidden = true;
  $('exp-live').hidden = true;
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
  $('exp-warnings-box').hidden = true;
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
  cur = { id, token, exp: null, attempt: 0, steps: new Map(), series: null, stream: null, poll: null, finished: false };
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
    if (c.exp.status === 'succeeded') {
      const baseline = await findBaseline(c.exp);
      if (c === cur) renderSummary(c.exp, baseline);
    }
    return;
  }
  setStatus(c.exp.status);
  document.title = `ckptlab · #${id} ${c.exp.status}`;
  drawCharts();
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
