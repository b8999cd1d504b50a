/* A plan for a memory budget: submitting one from the form (POST /api/plans) and its page
 * (#/plans/<id>, GET /api/plans/{id}): the plan as the block list with its checkpointed
 * segments, predicted against measured peak with the budget line, time against peak of
 * every point with the front and the budget, and the server's recommendation. */

import { fitText } from './chart_fit.js';
import { $, api, el, fmtBytes, fmtMs, loadPlotly, modelLabel } from './util.js';
import { baseLayout } from './charts.js';
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

function budgetLine(budget) {
  return { type: 'line', xref: 'paper', x0: 0, x1: 1, y0: budget, y1: budget, line: { color: '#D55E00', dash: 'dash', width: 2 } };
}

/** Predicted and measured peak of the auto run against the budget. */
function peakFigure(v) {
  const auto = v.points.find((p) => p.predicted_peak_bytes !== null && p.predicted_peak_bytes !== undefined);
  const ys = auto ? [auto.predicted_peak_bytes, auto.peak_allocated_bytes] : [];
  return {
    data: [{ type: 'bar', x: ['predicted', 'measured'], y: ys, marker: { color: ['#56B4E9', '#0072B2'] }, name: auto ? auto.label : '' }],
    layout: baseLayout({ title: { text: 'auto: predicted and measured peak' }, yaxis: { title: { text: 'bytes' }, rangemode: 'tozero' },
      shapes: [budgetLine(v.budget_bytes)], showlegend: false }),
  };
}

/** Step time against peak of every measured point: the front joined, over-budget points grey. */
function frontFigure(v) {
  const done = v.points.filter((p) => p.peak_allocated_bytes !== null && p.step_time_ms !== null);
  const front = done.filter((p) => p.on_front).sort((a, b) => a.step_time_ms - b.step_time_ms);
  return {
    data: [
      { type: 'scatter', mode: 'lines', x: front.map((p) => p.step_time_ms), y: front.map((p) => p.peak_allocated_bytes), name: 'front', line: { color: '#009E73' } },
      { type: 'scatter', mode: 'markers+text', name: 'runs', x: done.map((p) => p.step_time_ms), y: done.map((p) => p.peak_allocated_bytes),
        text: done.map((p) => p.label.replace('strategy=', '')), textposition: 'top center',
        marker: { size: 10, color: done.map((p) => (p.fits ? '#0072B2' : '#BBBBBB')) } },
    ],
    layout: baseLayout({ title: { text: 'step time against peak (grey: over the budget)' }, xaxis: { title: { text: 'step time (ms)' } },
      yaxis: { title: { text: 'peak allocated (bytes)' } }, shapes: [budgetLine(v.budget_bytes)] }),
  };
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
  $('plan-status').textContent = `budget ${fmtBytes(v.budget_bytes)} · ${measured} of ${v.points.length} points measured${v.finished ? '' : ' · running…'}`;
  $('plan-sweep-link').href = `#/sweeps/${v.sweep_id}`;
  $('plan-blocks').replaceChildren(blockDiagram(v.plan));
  const rec = v.recommendation;
  $('plan-recommendation').replaceChildren(rec && rec.experiment_id !== null
    ? el('p', null, el('strong', null, `Use ${rec.label.replace('strategy=', '')}`), `: ${rec.reason}`)
    : el('p', { class: 'muted' }, rec ? rec.reason : 'No recommendation yet.'));
  const Plotly = await loadPlotly();
  for (const [node, fig] of [['plan-chart-peak', peakFigure(v)], ['plan-chart-front', frontFigure(v)]]) {
    Plotly.react($(node), fig.data, fig.layout, { displaylogo: false, responsive: true }).then(fitText);
  }
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
