/* A plan for a memory budget: submitting one from the form (POST /api/plans) and its page
 * (#/plans/<id>, GET /api/plans/{id}): the plan as the block list with its checkpointed
 * segments, predicted against measured peak with the budget line, peak against step time
 * of every point with the front and the budget, every point in a table, and the server's
 * recommendation. Memory is in binary units everywhere (text, axes, bar labels); step
 * times of separate runs are labelled as such. */

import { drawFitted } from './chart_fit.js';
import { $, BASELINE, STATUS, api, byteUnit, el, fmtBytes, fmtMs, gradBadge, loadPlotly, modelLabel, statusBadge } from './util.js';
import { PLOT_CONFIG, baseLayout } from './charts.js';
import { parseBytes } from './budget.js';

const POLL_MS = 2000;
let timer = null;
let shown = null;

/** The form's summary line in plan mode. */
export function planSummary(spec, budgetText) {
  const budget = parseBytes(budgetText);
  return el('div', null,
    el('div', { class: 'big' }, el('strong', { id: 'run-count-total' }, '1'), ' plan'),
    el('div', { class: 'muted small' }, `${modelLabel(spec)} · batch ${spec.batch_size ?? '?'} under `,
      budget ? fmtBytes(budget) : 'a budget (type one above)',
      ': auto, none, per_block and sequential splits, as one sweep'));
}

/**
 * The body of POST /api/plans: the spec without its checkpoint setting (the plan's), the
 * budget text and, without torch.compile, no compile budgets (the server's default list
 * applies otherwise).
 */
export function planBody(spec, budgetText, withCompile) {
  const base = { ...spec };
  delete base.checkpoint;
  return withCompile ? { base, budget: budgetText.trim() } : { base, budget: budgetText.trim(), compile_budgets: [] };
}

/** POST /api/plans (see planBody). */
export function submitPlan(spec, budgetText, withCompile) {
  return api('/api/plans', { json: planBody(spec, budgetText, withCompile) });
}

/** The plan's blocks as a row of boxes, the checkpointed segments marked. */
function blockDiagram(plan) {
  if (!plan) return el('p', { class: 'muted' }, 'The plan appears when the auto run has profiled the model.');
  const boxes = [];
  for (const [start, end, checkpointed] of plan.segments) {
    const members = [];
    for (let i = start; i < end; i += 1) {
      members.push(el('span', { class: `block${checkpointed ? ' recomputed' : ''}`, title: `block ${i}: keeps ${fmtBytes(plan.blocks[i].retained_bytes)}, forward ${fmtMs(plan.blocks[i].forward_ms)}` }, String(i)));
    }
    boxes.push(el('span', { class: `segment${checkpointed ? ' checkpointed' : ''}` }, ...members));
  }
  const n = plan.checkpointed_blocks.length;
  return el('div', null,
    el('div', { class: 'block-row', id: 'plan-blocks-row', role: 'img', 'aria-label': `${n} of ${plan.blocks.length} blocks checkpointed` }, ...boxes),
    el('p', { class: 'muted small' }, n
      ? `${n} of ${plan.blocks.length} blocks checkpointed (outlined segments are recomputed in backward), recomputing ${fmtMs(plan.recompute_ms)} per step`
      : 'No block needs checkpointing for this budget.'));
}

/** Raw step times of a plan's runs: each measured in its own run, one after another. */
const SEPARATE = 'separate runs, not comparable on a busy host';
/** Axis numbers as numbers: no SI letters ("115M"), thousands separated. */
const NUMBERS = { exponentformat: 'none', separatethousands: true };

const setting = (p) => p.label.replace('strategy=', '');

/** [divisor, name] of the binary unit that suits the plan's largest peak or its budget. */
function unitOf(v) {
  const bytes = v.points.flatMap((p) => [p.peak_allocated_bytes, p.predicted_peak_bytes]).filter(Number.isFinite);
  return byteUnit(Math.max(v.budget_bytes, ...bytes));
}

/** The budget as a dashed line across the plot, named at its right end. */
function budgetLine(v, [div]) {
  const y = v.budget_bytes / div;
  return {
    shapes: [{ type: 'line', xref: 'paper', x0: 0, x1: 1, y0: y, y1: y, line: { color: '#D55E00', dash: 'dash', width: 2 } }],
    annotations: [{ xref: 'paper', x: 1, xanchor: 'right', y, yanchor: 'bottom', showarrow: false,
      text: `budget ${fmtBytes(v.budget_bytes)}`, font: { size: 11.5, color: '#A04000' }, bgcolor: 'rgba(255,255,255,0.85)' }],
  };
}

/** A linear axis in `unit` from 0 to a little above `top` (room for the labels above it). */
function peakAxis([, name], top, title = 'peak') {
  return { ...baseLayout().yaxis, ...NUMBERS, title: { text: `${title} (${name})` }, range: [0, top * 1.15] };
}

/** Predicted and measured peak of the auto run against the budget, each bar with its number. */
function peakFigure(v, unit) {
  const auto = v.points.find((p) => p.predicted_peak_bytes !== null && p.predicted_peak_bytes !== undefined);
  const bytes = auto ? [auto.predicted_peak_bytes, auto.peak_allocated_bytes] : [];
  const div = unit[0];
  return {
    data: [{
      type: 'bar', x: ['predicted by the plan', 'measured in the auto run'], y: bytes.map((b) => (Number.isFinite(b) ? b / div : null)),
      text: bytes.map((b) => (Number.isFinite(b) ? fmtBytes(b) : '')), textposition: 'inside', insidetextanchor: 'end',
      hovertemplate: '%{x}: %{text}<extra></extra>', marker: { color: ['#56B4E9', '#0072B2'] }, name: auto ? setting(auto) : '',
    }],
    layout: baseLayout({ title: { text: 'auto: predicted and measured peak' }, showlegend: false,
      yaxis: peakAxis(unit, Math.max(v.budget_bytes, ...bytes.filter(Number.isFinite)) / div), ...budgetLine(v, unit) }),
  };
}

/** Peak against step time of every measured point: the front joined, over-budget points grey.
 * Each point's setting is written beside it, towards the middle of the plot (inside it). */
function frontFigure(v, unit) {
  const div = unit[0];
  const done = v.points.filter((p) => p.peak_allocated_bytes !== null && p.step_time_ms !== null);
  const front = done.filter((p) => p.on_front).sort((a, b) => a.step_time_ms - b.step_time_ms);
  const xs = done.map((p) => p.step_time_ms);
  const [lo, hi] = [Math.min(...xs), Math.max(...xs)];
  const pad = (hi - lo) * 0.08 || Math.abs(hi) * 0.1 || 1;
  const top = Math.max(v.budget_bytes, ...done.map((p) => p.peak_allocated_bytes)) / div;
  return {
    data: [
      { type: 'scatter', mode: 'lines', x: front.map((p) => p.step_time_ms), y: front.map((p) => p.peak_allocated_bytes / div), name: 'front', line: { color: '#009E73' } },
      { type: 'scatter', mode: 'markers+text', name: 'runs', x: xs, y: done.map((p) => p.peak_allocated_bytes / div),
        text: done.map(setting), textposition: xs.map((x) => (x <= (lo + hi) / 2 ? 'middle right' : 'middle left')), cliponaxis: false,
        customdata: done.map((p) => fmtBytes(p.peak_allocated_bytes)), hovertemplate: '%{text}: %{x:.1f} ms, peak %{customdata}<extra></extra>',
        marker: { size: 10, color: done.map((p) => (p.fits ? '#0072B2' : '#BBBBBB')) } },
    ],
    layout: baseLayout({ title: { text: 'Peak against step time (grey: over the budget)' },
      xaxis: { ...baseLayout().xaxis, ...NUMBERS, title: { text: `step time, ms (${SEPARATE})` }, range: done.length ? [lo - pad, hi + pad] : undefined },
      yaxis: peakAxis(unit, top, 'peak allocated'), ...budgetLine(v, unit) }),
  };
}

/** Every point: setting, status, peak and fit, its overhead as the API measured it (with its
 * interval and how it was measured), the raw step time labelled as separate runs, gradients. */
function pointsTable(v) {
  const rec = v.recommendation && v.recommendation.experiment_id;
  const heads = ['setting', 'status', 'peak', `budget ${fmtBytes(v.budget_bytes)}`, 'step time overhead against none (95% CI)',
    `median step time (${SEPARATE})`, 'gradient check'];
  const fit = (p) => (p.fits === true ? el('span', { class: 'fit yes' }, 'fits')
    : p.fits === false ? el('span', { class: 'fit no' }, `over by ${fmtBytes(p.peak_allocated_bytes - v.budget_bytes)}`) : '—');
  const rows = v.points.map((p) => el('tr', { dataset: { id: p.experiment_id }, class: p.experiment_id === rec ? 'recommended' : null },
    el('td', { class: 'wrap' }, el('a', { href: `#/experiments/${p.experiment_id}` }, setting(p)),
      p.experiment_id === rec ? el('span', { class: 'tag tag-rec' }, '★ recommended') : null),
    el('td', null, statusBadge(p.status)),
    el('td', { class: 'num' }, fmtBytes(p.peak_allocated_bytes)),
    el('td', null, fit(p)),
    el('td', { class: 'wrap' }, p.strategy === BASELINE ? 'the baseline' : p.overhead_text ?? '—'),
    el('td', { class: 'num' }, fmtMs(p.step_time_ms)),
    el('td', null, p.status === STATUS.SUCCEEDED && p.strategy !== BASELINE ? gradBadge(p.gradients_match, null) : '—')));
  return el('table', { class: 'data', id: 'plan-points' },
    el('thead', null, el('tr', null, heads.map((h, i) => el('th', { scope: 'col', class: i === 2 || i === 5 ? 'num' : null }, h)))),
    el('tbody', null, rows));
}

/** Where the plan stands while it is not finished: running, or queued with its place (that of
 * its next run: GET /api/experiments/{id} `progress.queue_position`). */
async function pending(v) {
  const running = v.points.some((p) => p.status === STATUS.RUNNING);
  const queued = v.points.filter((p) => p.status === STATUS.QUEUED).map((p) => p.experiment_id);
  if (running || !queued.length) return `running…${queued.length ? ` (${queued.length} queued)` : ''}`;
  const r = await api(`/api/experiments/${Math.min(...queued)}`);
  const place = r.ok && r.body.progress ? r.body.progress.queue_position : null;
  return place ? `${STATUS.QUEUED} (position ${place})` : STATUS.QUEUED;
}

async function render(id) {
  const r = await api(`/api/plans/${id}`);
  if (shown !== id) return;
  if (!r.ok) {
    $('plan-title').textContent = `Plan ${id}`;
    $('plan-status').textContent = r.status === 404 ? 'No such plan.' : `The server answered HTTP ${r.status}.`;
    return;
  }
  const v = r.body;
  $('plan-title').textContent = v.name;
  const measured = v.points.filter((p) => p.peak_allocated_bytes !== null).length;
  const state = v.finished ? '' : ` · ${await pending(v)}`;
  if (shown !== id) return;
  $('plan-status').textContent = `budget ${fmtBytes(v.budget_bytes)} · ${measured} of ${v.points.length} points measured${state}`;
  $('plan-sweep-link').href = `#/sweeps/${v.sweep_id}`;
  $('plan-blocks').replaceChildren(blockDiagram(v.plan));
  const rec = v.recommendation;
  $('plan-recommendation').replaceChildren(rec && rec.experiment_id !== null
    ? el('p', null, el('strong', null, `Use ${rec.label.replace('strategy=', '')}`), `: ${rec.reason}`)
    : el('p', { class: 'muted' }, rec ? rec.reason : 'No recommendation yet.'));
  $('plan-points-box').replaceChildren(pointsTable(v));
  await loadPlotly();
  const unit = unitOf(v);
  await Promise.all([['plan-chart-peak', peakFigure(v, unit)], ['plan-chart-front', frontFigure(v, unit)]]
    .map(([node, fig]) => drawFitted(node, fig, PLOT_CONFIG)));
  if (!v.finished && shown === id) timer = setTimeout(() => render(id), POLL_MS);
}

/** Route #/plans/<id>: draw the verdict, and again every 2 s until every point finished. */
export function showPlan(id) {
  hidePlan();
  shown = id;
  $('plan-title').textContent = `Plan ${id}`;
  render(id);
}

export function hidePlan() {
  shown = null;
  clearTimeout(timer);
}
