/* A prediction ("will it fit?"): submitting one from the form (POST /api/predictions) and
 * its page (#/predictions/<id>[?run=<experiment id>], GET /api/predictions/{id}): fits or not
 * against the card's capacity with the margin, the figures (allocated, reserved, device
 * used), memory by category at the predicted peak, the auto plan, how it was predicted and
 * how far it may be off, a "what fits" table across every target (POST
 * /api/predictions/batch), and the same spec run for real beside the prediction
 * (predicted against measured, with the difference, and both memory timelines overlaid). */

import { $, META, STATUS, TERMINAL, api, detailText, el, fmtBytes, fmtPct, kv, modelLabel, parseHash, statusBadge, strategyLabel } from './util.js';

const POLL_MS = 2000;
let timer = null;
let shown = null;

/** The targets a run can be predicted for (GET /api/meta `targets`), in the server's order. */
export const TARGETS = META.targets || [];

function targetLabel(name) {
  const t = TARGETS.find((x) => x.name === name);
  return t ? `${t.label}${t.capacity_bytes ? ` (${fmtBytes(t.capacity_bytes)})` : ''}` : name;
}

/** The form's target select: every target, the first GPU chosen (the question is a card's). */
export function fillTargetSelect(select) {
  select.replaceChildren(...TARGETS.map((t) => el('option', { value: t.name }, targetLabel(t.name))));
  const gpu = TARGETS.find((t) => t.device !== 'cpu');
  if (gpu) select.value = gpu.name;
}

/** POST /api/predictions for ``spec`` on ``target``; resolves to api()'s {ok, status, body}. */
export function submitPrediction(spec, target) {
  return api('/api/predictions', { json: { spec, target } });
}

function verdict(p) {
  const info = (p.summary || {}).prediction;
  if (p.status !== STATUS.SUCCEEDED || !info) {
    return el('div', { class: 'error-box', id: 'pred-verdict', role: 'status' },
      p.error || `The prediction ${p.status.replace('_', ' ')}.`);
  }
  if (info.fits === null || info.fits === undefined) {
    return el('div', { class: 'verdict', id: 'pred-verdict', role: 'status' },
      `Predicted peak ${fmtBytes(p.summary.peak_allocated_bytes)} on this machine's CPU (no capacity to fit against).`);
  }
  const margin = info.margin_bytes;
  const words = info.fits
    ? `Fits: ${fmtBytes(info.device_used_bytes)} of ${fmtBytes(info.capacity_bytes)}, ${fmtBytes(margin)} to spare`
    : `Does not fit: ${fmtBytes(info.device_used_bytes)} needed, ${fmtBytes(info.capacity_bytes)} available, short by ${fmtBytes(-margin)}`;
  return el('div', { class: `verdict ${info.fits ? 'ok' : 'bad'}`, id: 'pred-verdict', role: 'status' }, words);
}

function figures(p) {
  const s = p.summary || {};
  const info = s.prediction || {};
  const dl = el('dl', { class: 'kv', id: 'pred-figures' });
  kv(dl, [
    ['Peak allocated', fmtBytes(s.peak_allocated_bytes)],
    info.peak_reserved_bytes != null && ['Peak reserved', fmtBytes(info.peak_reserved_bytes)],
    info.device_used_bytes != null && ['Device used (estimate)', fmtBytes(info.device_used_bytes)],
    info.capacity_bytes != null && ['Capacity', fmtBytes(info.capacity_bytes)],
    ['Peak in', s.peak_phase || '—'],
    ['Activations', fmtBytes(s.activation_bytes)],
    info.fixed_bytes != null && ['Fixed (parameters, gradients, optimizer state)', fmtBytes(info.fixed_bytes)],
    info.sdpa_backend && ['Attention backend', info.sdpa_backend],
    s.peak_explanation && ['Where the peak is', s.peak_explanation],
  ]);
  return dl;
}

/** Memory by category at the predicted peak, as bars sized against the peak. */
function categoryBars(s) {
  const cats = Object.entries(s.memory_at_peak || {}).filter(([, v]) => v > 0).sort((a, b) => b[1] - a[1]);
  const peak = s.peak_allocated_bytes || 1;
  return el('table', { class: 'table bars', id: 'pred-categories' },
    el('thead', null, el('tr', null, el('th', null, 'At the peak'), el('th', { class: 'num' }, 'bytes'), el('th', null, ''))),
    el('tbody', null, ...cats.map(([k, v]) => el('tr', null,
      el('td', null, k.replace(/_/g, ' ')),
      el('td', { class: 'num' }, fmtBytes(v)),
      el('td', null, el('span', { class: 'bar', style: `width:${Math.max(1, Math.round((100 * v) / peak))}%` }))))));
}

function planBlocks(plan) {
  if (!plan || !plan.segments) return null;
  const boxes = plan.segments.map(([start, end, ck]) => el('span', { class: `segment${ck ? ' checkpointed' : ''}` },
    ...Array.from({ length: end - start }, (_, i) => el('span', { class: `block${ck ? ' recomputed' : ''}` }, String(start + i)))));
  const n = (plan.checkpointed_blocks || []).length;
  return el('div', { id: 'pred-plan' },
    el('div', { class: 'block-row', role: 'img', 'aria-label': `${n} blocks checkpointed` }, ...boxes),
    el('p', { class: 'muted small' }, `${n} of ${(plan.blocks || []).length} blocks checkpointed; predicted peak ${fmtBytes(plan.predicted_peak_bytes)}`));
}

/** The "what fits" table: one row per target from a batch prediction. */
function whatFitsTable(rows) {
  return el('table', { class: 'table', id: 'pred-what-fits' },
    el('thead', null, el('tr', null, ...['Target', 'Capacity', 'Device used', 'Fits', 'Margin'].map((h) => el('th', null, h)))),
    el('tbody', null, ...rows.map((p) => {
      const info = (p.summary || {}).prediction || {};
      const fits = p.status !== STATUS.SUCCEEDED ? p.status : info.fits === null || info.fits === undefined ? '—' : info.fits ? 'yes' : 'no';
      return el('tr', null,
        el('td', null, el('a', { href: `#/predictions/${p.id}` }, targetLabel(p.target))),
        el('td', { class: 'num' }, info.capacity_bytes != null ? fmtBytes(info.capacity_bytes) : '—'),
        el('td', { class: 'num' }, fmtBytes(info.device_used_bytes ?? (p.summary || {}).peak_allocated_bytes)),
        el('td', null, fits),
        el('td', { class: 'num' }, info.margin_bytes != null ? fmtBytes(info.margin_bytes) : '—'));
    })));
}

/** Predicted against measured, with the difference, for the same spec run for real. */
function sideBySide(p, exp) {
  const s = p.summary || {};
  const m = exp.summary || {};
  const rows = [['Peak allocated', 'peak_allocated_bytes'], ['Activations', 'activation_bytes']];
  for (const k of Object.keys(s.memory_at_peak || {})) rows.push([`At the peak: ${k.replace(/_/g, ' ')}`, ['memory_at_peak', k]]);
  const read = (obj, key) => (Array.isArray(key) ? (obj[key[0]] || {})[key[1]] : obj[key]);
  return el('table', { class: 'table', id: 'pred-vs-run' },
    el('thead', null, el('tr', null, ...['', 'Predicted', 'Measured', 'Difference'].map((h) => el('th', null, h)))),
    el('tbody', null, ...rows.map(([label, key]) => {
      const a = read(s, key);
      const b = read(m, key);
      const diff = a != null && b ? fmtPct((100 * (a - b)) / b) : '—';
      return el('tr', null, el('td', null, label), el('td', { class: 'num' }, fmtBytes(a)), el('td', { class: 'num' }, fmtBytes(b)), el('td', { class: 'num' }, diff));
    })));
}

async function compareTargets(p) {
  const box = $('pred-targets');
  box.replaceChildren(el('p', { class: 'muted' }, 'Predicting on every target…'));
  const r = await api('/api/predictions/batch', { json: { spec: p.spec, targets: TARGETS.map((t) => t.name) } });
  box.replaceChildren(r.ok && Array.isArray(r.body?.data) ? whatFitsTable(r.body.data) : el('div', { class: 'error-box' }, detailText(r.body)));
}

async function runForReal(p) {
  const spec = { ...p.spec, device: 'cpu' };
  const r = await api('/api/experiments', { json: spec });
  if (r.ok && r.body) location.hash = `#/predictions/${p.id}?run=${r.body.id}`;
  else $('pred-run').replaceChildren(el('div', { class: 'error-box' }, detailText(r.body)));
}

async function showRun(p, runId) {
  const box = $('pred-run');
  const r = await api(`/api/experiments/${runId}`);
  if (shown !== p.id || !r.ok) return;
  const exp = r.body;
  const link = el('a', { href: `#/experiments/${exp.id}` }, `experiment #${exp.id}`);
  if (exp.status === STATUS.SUCCEEDED) {
    const timelines = el('a', { href: `#/timeline?ids=${exp.id}&predictions=${p.id}`, id: 'pred-timelines' }, 'compare the memory timelines, predicted and measured');
    box.replaceChildren(el('p', null, 'Measured by ', link, ' (the same spec on this machine\'s CPU):'), sideBySide(p, exp), el('p', null, timelines));
  } else if (TERMINAL.has(exp.status)) {
    box.replaceChildren(el('p', null, link, ' ', statusBadge(exp.status), ' ', exp.error || ''));
  } else {
    box.replaceChildren(el('p', { class: 'muted' }, link, ' ', statusBadge(exp.status), ' — predicted against measured appears when it has run.'));
    timer = setTimeout(() => showRun(p, runId), POLL_MS);
  }
}

function render(p, runId) {
  $('pred-title').textContent = `Prediction #${p.id}: ${modelLabel(p.spec)} · ${strategyLabel(p.spec)} on ${targetLabel(p.target)}`;
  $('pred-status').replaceChildren(statusBadge(p.status));
  $('pred-body').replaceChildren(verdict(p));
  if (p.status !== STATUS.SUCCEEDED) return;
  const s = p.summary || {};
  const info = s.prediction || {};
  $('pred-body').append(
    el('div', { class: 'exp-grid' },
      el('section', { class: 'card' }, el('h3', null, 'Figures'), figures(p)),
      el('section', { class: 'card' }, el('h3', null, 'Memory at the peak'), categoryBars(s))),
    s.plan ? el('section', { class: 'card' }, el('h3', null, 'The plan'), planBlocks(s.plan)) : '',
    el('section', { class: 'card' }, el('h3', null, 'How it was predicted'),
      el('p', { id: 'pred-method' }, info.method || ''),
      el('p', { class: 'muted', id: 'pred-bound' }, info.error_bound || ''),
      el('ul', { id: 'pred-notes' }, ...(info.notes || []).map((n) => el('li', null, n))),
      el('p', null, el('a', { href: `#/timeline?predictions=${p.id}`, id: 'pred-timeline' }, 'Its memory timeline (the fake tensors\' allocations and frees)'))),
    el('section', { class: 'card' }, el('h3', null, 'What fits'),
      el('div', { id: 'pred-targets' }, el('button', { type: 'button', class: 'secondary', id: 'pred-compare', onclick: () => compareTargets(p) }, 'Predict on every target'))),
    el('section', { class: 'card' }, el('h3', null, 'Predicted against measured'),
      el('div', { id: 'pred-run' }, el('button', { type: 'button', class: 'secondary', id: 'pred-run-real', onclick: () => runForReal(p) }, 'Run this spec for real on the CPU'))));
  if (runId) showRun(p, runId);
}

/** Shows prediction ``id`` (#/predictions/<id>?run=<experiment id>). */
export async function showPrediction(id) {
  hidePrediction();
  shown = id;
  const runId = Number(parseHash().params.get('run')) || null;
  $('pred-title').textContent = `Prediction #${id}`;
  $('pred-body').replaceChildren(el('p', { class: 'muted' }, 'Loading…'));
  const r = await api(`/api/predictions/${id}`);
  if (shown !== id) return;
  if (!r.ok) {
    $('pred-body').replaceChildren(el('div', { class: 'error-box' }, r.status === 404 ? `No prediction #${id}.` : detailText(r.body)));
    return;
  }
  render(r.body, runId);
}

export function hidePrediction() {
  shown = null;
  if (timer) clearTimeout(timer);
  timer = null;
}
