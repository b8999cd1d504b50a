/* A plan for a memory budget: submitting one from the form (POST /api/plans), with a hint of
 * the model's un-checkpointed peak (a prediction, on request), and its page (#/plans/<id>,
 * GET /api/plans/{id}): the model in the title, the plan as the block list with its
 * checkpointed segments, predicted against measured peak with the budget line, peak against
 * the paired step-time overhead of every point with the front and the budget
 * (plan_front.js), every point in a table with the same figures, and the server's
 * recommendation. Memory is in binary units everywhere (text, axes, bar labels); step times
 * of separate runs appear only in the table, labelled as such. */

import { drawFitted } from './chart_fit.js';
import { $, BASELINE, STATUS, api, detailText, el, fmtBytes, fmtMs, gradBadge, loadPlotly, modelLabel, statusBadge } from './util.js';
import { PLOT_CONFIG, baseLayout } from './charts.js';
import { parseBytes } from './budget.js';
import { SEPARATE, budgetLine, frontFigure, frontPoints, intervalText, pairedOf, peakAxis, placeLabels, setting, unitOf } from './plan_front.js';
import { TARGETS, submitPrediction } from './prediction.js';
import { compiledNotRun, overheadWords, predictedPct, scopeWords } from './plan_overhead.js';

const POLL_MS = 2000;
let timer = null;
let shown = null;

/** The form's summary line in plan mode, with the hint of the un-checkpointed peak. */
export function planSummary(spec, budgetText) {
  const budget = parseBytes(budgetText);
  return el('div', null,
    el('div', { class: 'big' }, el('strong', { id: 'run-count-total' }, '1'), ' plan'),
    el('div', { class: 'muted small' }, `${modelLabel(spec)} · batch ${spec.batch_size ?? '?'} under `,
      budget ? fmtBytes(budget) : 'a budget (type one above)',
      ': auto, none, per_block and sequential splits, as one sweep'),
    peakHint(spec, budget));
}

// ------------------------------------------------------------------ the un-checkpointed peak

/** Predictions of the un-checkpointed step asked for on this page: key -> {pending} | the
 * prediction (GET /api/predictions/{id}'s body) | {error}. */
const HINTS = new Map();

/** The target a plan's spec is predicted on: the CPU for a CPU run, else the GPU chosen in
 * the form's "Will it fit?" row (the first GPU target by default). */
function hintTarget(spec) {
  const own = TARGETS.find((t) => t.device === spec.device);
  if (spec.device === 'cpu' && own) return own.name;
  const chosen = $('predict-target') && $('predict-target').value;
  return chosen || (TARGETS.find((t) => t.device !== 'cpu') || TARGETS[0] || {}).name;
}

/** The spec of the un-checkpointed step: the form's, strategy none. */
function uncheckpointed(spec) {
  return { ...spec, checkpoint: { strategy: BASELINE } };
}

function hintKey(spec, target) {
  const { checkpoint: _, ...rest } = spec;
  return JSON.stringify([rest, target]);
}

/** What the prediction says about budgets: the un-checkpointed peak, the activations in it
 * (what checkpointing can shrink) and where the typed budget stands. */
function hintWords(known, budget) {
  if (known.pending) return ['Predicting the un-checkpointed peak…'];
  if (known.error) return [`No hint: ${known.error}`];
  const s = known.summary || {};
  const peak = s.peak_allocated_bytes;
  const acts = s.activation_bytes;
  const link = el('a', { href: `#/predictions/${known.id}` }, `prediction #${known.id}`);
  const rest = Number.isFinite(acts) ? peak - acts : null;
  const words = [`Un-checkpointed, a step peaks at about ${fmtBytes(peak)} (`, link, ')',
    Number.isFinite(acts) ? `, ${fmtBytes(acts)} of it activations, the part checkpointing shrinks` : '',
    `: a budget under ${fmtBytes(peak)} needs checkpointing`,
    rest !== null ? `, and none under ${fmtBytes(rest)} can fit (the rest is not activations).` : '.'];
  if (budget && budget >= peak) words.push(` ${fmtBytes(budget)} is above it: nothing needs checkpointing.`);
  else if (budget && rest !== null && budget <= rest) words.push(` ${fmtBytes(budget)} is under ${fmtBytes(rest)}: no plan fits.`);
  return words;
}

/** Asks for the prediction of the un-checkpointed step, and shows it where the hint is. */
async function predictPeak(spec, target, key) {
  HINTS.set(key, { pending: true });
  showHint(key);
  let known;
  try {
    const r = await submitPrediction(uncheckpointed(spec), target);
    const failed = r.ok && r.body.status !== STATUS.SUCCEEDED;
    known = !r.ok ? { error: `the server answered HTTP ${r.status}: ${detailText(r.body)}` }
      : failed ? { error: r.body.error || `the prediction ${r.body.status}` } : r.body;
  } catch (_) {
    known = { error: 'the server did not answer' };
  }
  HINTS.set(key, known);
  showHint(key);
}

function showHint(key) {
  const box = $('plan-peak-hint');
  if (!box || box.dataset.key !== key) return; // the form has moved on to another spec
  box.replaceChildren(...hintWords(HINTS.get(key), parseBytes($('plan-budget').value)));
}

/** The hint under the plan's summary: the prediction of the un-checkpointed peak once asked
 * for (it takes a few seconds and is stored as a prediction), else the button to ask. */
function peakHint(spec, budget) {
  const target = hintTarget(spec);
  const key = hintKey(spec, target);
  const box = el('div', { class: 'small plan-hint', id: 'plan-peak-hint', role: 'status', dataset: { key } });
  const known = HINTS.get(key);
  if (known) box.append(...hintWords(known, budget));
  else if (target) {
    box.append('Which budgets matter? ', el('button', { type: 'button', class: 'secondary small', id: 'plan-predict-peak',
      onclick: () => predictPeak(spec, target, key) }, 'Predict the un-checkpointed peak'));
  }
  return box;
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

/** The plan's blocks as a row of boxes, the checkpointed segments marked, and the overhead
 * the plan predicted against the one its auto run (`auto`, a point) measured paired. */
function blockDiagram(plan, auto) {
  if (!plan) return el('p', { class: 'muted' }, 'The plan appears when the auto run has profiled the model.');
  const boxes = [];
  // A fourth item names the selective policy a block is checkpointed under (issue 31).
  for (const [start, end, checkpointed, policy] of plan.segments) {
    const members = [];
    for (let i = start; i < end; i += 1) {
      const b = plan.blocks[i];
      const p = policy && (b.policy_profiles || []).find((x) => x.policy === policy);
      const title = p
        ? `block ${i} (selective: ${policy}): keeps ${fmtBytes(p.kept_bytes)}, adds ${fmtMs(p.ms)} a step`
        : `block ${i}: keeps ${fmtBytes(b.retained_bytes)}, forward ${fmtMs(b.forward_ms)}`;
      members.push(el('span', { class: `block${checkpointed ? ' recomputed' : ''}`, title }, policy ? `${i}s` : String(i)));
    }
    boxes.push(el('span', { class: `segment${checkpointed ? ' checkpointed' : ''}` }, ...members));
  }
  const selective = Object.entries(plan.selective_blocks || {});
  const n = plan.checkpointed_blocks.length;
  const c = plan.compiled && plan.compiled.chosen ? plan.compiled : null; // auto's compiled choice (search_compile)
  if (c) {
    return el('div', null,
      el('p', { class: 'small', id: 'plan-compiled' }, `auto runs torch.compile ${scopeWords(c)} at activation memory budget ${c.activation_memory_budget}: `
        + `measured at ${fmtBytes(c.peak_bytes)} after ${c.probes.length} compiled builds tried, measurably cheaper than its eager plan below.`),
      el('div', { class: 'block-row', id: 'plan-blocks-row', role: 'img', 'aria-label': `eager plan: ${n} of ${plan.blocks.length} blocks checkpointed` }, ...boxes),
      el('p', { class: 'small', id: 'plan-overhead' }, `Step-time overhead over ${BASELINE}: `,
        overheadWords(plan, auto && auto.status === STATUS.SUCCEEDED ? auto.paired_overhead : null)));
  }
  return el('div', null,
    el('div', { class: 'block-row', id: 'plan-blocks-row', role: 'img', 'aria-label': `${n} of ${plan.blocks.length} blocks checkpointed` }, ...boxes),
    el('p', { class: 'muted small' }, n
      ? `${n} of ${plan.blocks.length} blocks checkpointed (outlined segments are recomputed in backward)${selective.length ? `; selective (matmul/attention outputs kept, "s"): ${selective.map(([b, p]) => `block ${b} ${p}`).join(', ')}` : ''}`
      : 'No block needs checkpointing for this budget.'),
    n ? el('p', { class: 'small', id: 'plan-overhead' }, `Step-time overhead over ${BASELINE}: `,
      overheadWords(plan, auto && auto.status === STATUS.SUCCEEDED ? auto.paired_overhead : null)) : null,
    plan.compiled ? el('p', { class: 'muted small', id: 'plan-compiled' }, `${compiledNotRun(plan.compiled)}.`) : null);
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

/** Every point: setting, status, peak (the auto run's prediction beside it) and fit, its
 * paired overhead with its interval as the chart draws it (an unpaired point's overhead in
 * the server's words, which say how it was measured), the raw step time labelled as
 * separate runs, and the gradient check. */
function pointsTable(v) {
  const rec = v.recommendation && v.recommendation.experiment_id;
  const heads = ['setting', 'status', 'peak', `budget ${fmtBytes(v.budget_bytes)}`,
    `step-time overhead over ${BASELINE}, paired in one process (95% CI)`, `median step time (${SEPARATE})`, 'gradient check'];
  const fit = (p) => (p.fits === true ? el('span', { class: 'fit yes' }, 'fits')
    : p.fits === false ? el('span', { class: 'fit no' }, `over by ${fmtBytes(p.peak_allocated_bytes - v.budget_bytes)}`) : '—');
  const overhead = (p) => {
    const o = pairedOf(p);
    const guess = predictedPct(p.predicted_overhead) ? el('div', { class: 'muted small' }, `predicted ${intervalText(p.predicted_overhead)}`) : null;
    if (o && p.status === STATUS.SUCCEEDED) return [intervalText(o), p.on_front ? el('div', { class: 'muted small' }, 'on the measured front') : null, guess];
    if (p.status !== STATUS.SUCCEEDED) return '—';
    return [p.overhead_text ?? '—', el('div', { class: 'muted small' }, 'not paired: not on the chart')];
  };
  const peak = (p) => [fmtBytes(p.peak_allocated_bytes),
    Number.isFinite(p.predicted_peak_bytes) ? el('div', { class: 'muted small' }, `predicted ${fmtBytes(p.predicted_peak_bytes)}`) : null];
  const rows = v.points.map((p) => el('tr', { dataset: { id: p.experiment_id }, class: p.experiment_id === rec ? 'recommended' : null },
    el('td', { class: 'wrap' }, el('a', { href: `#/experiments/${p.experiment_id}` }, setting(p)),
      p.experiment_id === rec ? el('span', { class: 'tag tag-rec' }, '★ recommended') : null),
    el('td', null, statusBadge(p.status)),
    el('td', { class: 'num' }, peak(p)),
    el('td', null, fit(p)),
    el('td', { class: 'wrap overhead' }, overhead(p)),
    el('td', { class: 'num' }, fmtMs(p.step_time_ms)),
    el('td', null, p.status === STATUS.SUCCEEDED && p.strategy !== BASELINE ? gradBadge(p.gradients_match, null) : '—')));
  return el('table', { class: 'data', id: 'plan-points' },
    el('thead', null, el('tr', null, heads.map((h, i) => el('th', { scope: 'col', class: i === 2 || i === 5 ? 'num' : null }, h)))),
    el('tbody', null, rows));
}

/** Under the front: the measured points it cannot draw (timed unpaired), named. */
function frontNote(v) {
  const { paired, unpaired } = frontPoints(v);
  const gd = $('plan-chart-front');
  let note = $('plan-front-note');
  if (!note) {
    note = el('p', { id: 'plan-front-note', class: 'muted small' });
    gd.after(note);
  }
  const off = unpaired.length
    ? `Not drawn, timed unpaired (their overheads come from separate runs, see the table): ${unpaired.map(setting).join(', ')}.` : '';
  note.textContent = paired.length ? off : 'The front appears as the runs finish.';
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
  $('plan-title').textContent = v.model && !v.name.includes(v.model) ? `${v.name} · ${v.model}` : v.name;
  const measured = v.points.filter((p) => p.peak_allocated_bytes !== null).length;
  const state = v.finished ? '' : ` · ${await pending(v)}`;
  if (shown !== id) return;
  $('plan-status').textContent = `budget ${fmtBytes(v.budget_bytes)} · ${measured} of ${v.points.length} points measured${state}`;
  $('plan-sweep-link').href = `#/sweeps/${v.sweep_id}`;
  $('plan-blocks').replaceChildren(blockDiagram(v.plan, v.points.find((p) => Number.isFinite(p.predicted_peak_bytes))));
  const rec = v.recommendation;
  $('plan-recommendation').replaceChildren(rec && rec.experiment_id !== null
    ? el('p', null, el('strong', null, `Use ${rec.label.replace('strategy=', '')}`), `: ${rec.reason}`)
    : el('p', { class: 'muted' }, rec ? rec.reason : 'No recommendation yet.'));
  $('plan-points-box').replaceChildren(pointsTable(v));
  await loadPlotly();
  const unit = unitOf(v);
  frontNote(v);
  const [, front] = await Promise.all([['plan-chart-peak', peakFigure(v, unit)], ['plan-chart-front', frontFigure(v, unit)]]
    .map(([node, fig]) => drawFitted(node, fig, PLOT_CONFIG)));
  if (shown === id) await placeLabels(front);
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
