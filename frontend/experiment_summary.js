/* The parts of the experiment page that render one finished or running experiment: its
 * summary against the `none` baseline, the peak and its findings, the memory breakdown,
 * the spec, the environment, downloads, and finding / submitting that baseline. */

import {
  $, BASELINE, STATUS, TERMINAL, api, detailText, el, fmtAgo, fmtBytes, fmtDate, fmtDiff, fmtDuration, fmtInt, fmtMs, fmtPct, gradBadge, kv, recomputes, statusBadge, strategyLabel,
} from './util.js';
import { CATEGORIES } from './charts.js';
import { batchText, distributedRows } from './distributed.js';
import { renderRanks } from './ranks.js';
import { compiledNotRun, overheadWords, scopeWords } from './plan_overhead.js';

// ------------------------------------------------------------------ rendering

export function setStatus(status) {
  const node = $('exp-status');
  node.textContent = status;
  node.className = `status badge status-${status}`;
  $('exp-cancel').hidden = TERMINAL.has(status);
}

/** "blocks 0–2, 5 checkpointed of 8" from a summary's plan (strategy auto); its time side is
 * the summary's "Step-time overhead, plan against run" row. */
function planText(plan) {
  const c = plan.compiled;
  if (c && c.chosen) {
    return `torch.compile ${scopeWords(c)} at activation memory budget ${c.activation_memory_budget}, measured at ${fmtBytes(c.peak_bytes)} `
      + `(${c.probes.length} compiled builds tried); measurably cheaper than the eager plan (${eagerPlanText(plan)})`;
  }
  return c ? `${eagerPlanText(plan)}; ${compiledNotRun(c)}` : eagerPlanText(plan);
}

function eagerPlanText(plan) {
  const n = plan.blocks.length;
  const runs = plan.segments.filter((seg) => seg[2]).map((seg) => (seg[1] - seg[0] > 1 ? `${seg[0]}–${seg[1] - 1}` : `${seg[0]}`));
  if (!runs.length) return `no block checkpointed of ${n}: nothing needed for this budget`;
  return `blocks ${runs.join(', ')} checkpointed of ${n}`;
}

/** The spec as rows; `summary.model` / `summary.blocks` (a ckptlab.profile run) name what was profiled. */
export function renderSpec(spec, summary = null) {
  const m = spec.model || {};
  const c = spec.checkpoint || {};
  const modelParts = Object.entries(m)
    .filter(([k, v]) => k !== 'kind' && v !== null && v !== undefined) // a field this kind leaves unset
    .map(([k, v]) => `${k} ${typeof v === 'object' && v !== null ? JSON.stringify(v) : v}`);
  const entries = [
    ['Model', [m.kind, ...modelParts].join(' · ')],
    ...(summary && summary.model ? [['Profiled', `${summary.model}; blocks ${summary.blocks}`]] : []),
    ['Batch', batchText(spec)],
    ...distributedRows(spec),
    ['Steps', `${spec.steps} memory (${spec.warmup_steps} warm-up)${spec.timed_steps ? `, then ${spec.timed_steps} timed` : ''}`],
    ['Checkpointing', strategyLabel(spec)],
    ...(summary && summary.plan ? [['Plan', planText(summary.plan)]] : []),
  ];
  if (recomputes(spec)) {
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
function delta(v, base, { lowerIsBetter = true, against = 'baseline', id = null } = {}) {
  if (typeof v !== 'number' || typeof base !== 'number' || !base) return null;
  const pct = 100 * (v / base - 1);
  const good = lowerIsBetter ? pct < -0.5 : pct > 0.5;
  const bad = lowerIsBetter ? pct > 0.5 : pct < -0.5;
  return el('span', { class: `delta ${good ? 'good' : bad ? 'bad' : ''}`, id }, `${fmtPct(pct)} vs ${against}`);
}

/** The activations against the gradient check's un-checkpointed reference forward (same
 * weights and batch, measured in this run): the saving, known without a baseline run. */
function referenceDelta(s) {
  const own = typeof s.activation_bytes === 'number' ? s.activation_bytes - (s.rng_state_bytes || 0) : null;
  return delta(own, s.reference_activation_bytes, { against: 'no checkpointing (reference forward)', id: 'm-activation-ref' });
}

/** The step-time overhead from the server's comparison: a signed number only when it is
 * measurable (95% CI excludes 0 and is not within the noise threshold). */
function overheadDelta(cmp) {
  const o = cmp && cmp.overhead;
  if (!o) return null;
  if (!o.measurable) return el('span', { class: 'delta', title: cmp.overhead_text }, `no measurable difference${o.unmeasured_why ? ` (${o.unmeasured_why})` : ''}`);
  return el('span', { class: `delta ${o.estimate_pct < 0 ? 'good' : 'bad'}`, title: cmp.overhead_text }, `${fmtPct(o.estimate_pct)} vs baseline`);
}

/** "Run the baseline" (it submits this spec with strategy `none`), or where the server
 * would refuse that spec (`comparison.baseline_refused`: a profiled model it does not
 * build), why not and what to do instead. Nothing until the comparison is known. */
function baselineAction(cmp, label) {
  if (!cmp) return null;
  if (cmp.baseline_refused) return el('span', { class: 'muted', id: 'exp-baseline-refused' }, cmp.baseline_refused);
  return el('button', { type: 'button', class: 'secondary small', id: 'exp-run-baseline' }, label);
}

/** What the recomputation produced against the first forward: the first group that differs. */
function recomputeText(s) {
  const g = s.recompute_first_differing_group;
  if (!g) return 'every checkpointed group recomputes what its first forward produced';
  const blocks = g.end - g.start > 1 ? `blocks ${g.start}–${g.end - 1}` : `block ${g.start}`;
  return `differs from the first forward from ${blocks} on (max |Δ| ${fmtDiff(g.max_abs_diff)}): a dropout mask drawn again? turn preserve_rng_state on`;
}

/** "3.31 ms (IQR 0.12 ms, 95% CI 3.01–3.47 ms, 20 timed steps)". */
function stepTimeText(s) {
  const t = s.timing && s.timing.step_ms;
  if (!t) return fmtMs(s.step_time_ms);
  const pass = s.timing_pass === 'timed' ? 'timed steps, tracker off' : 'memory steps';
  return `${fmtMs(t.median)} (IQR ${fmtMs(t.iqr)}, 95% CI ${fmtMs(t.ci_low)}–${fmtMs(t.ci_high)}, ${t.n} ${pass})`;
}

export function renderSummary(exp, baseline) {
  const s = exp.summary;
  const pending = $('summary-pending');
  pending.hidden = Boolean(s);
  pending.textContent = TERMINAL.has(exp.status)
    ? `The run ended (${exp.status.replace('_', ' ')}) without a summary.`
    : exp.status === STATUS.QUEUED
      ? `Queued${exp.progress ? ` (${exp.progress.text})` : ''}: waiting for a worker.`
      : 'Running: the summary appears when it finishes.';
  const headline = $('exp-headline');
  if (!s) {
    $('exp-summary').replaceChildren();
    $('exp-breakdown').replaceChildren();
    headline.hidden = true;
  } else {
    const b = baseline && baseline.summary;
    const cmp = baseline && baseline.comparison;
    const isBaseline = (exp.spec.checkpoint || {}).strategy === BASELINE;
    headline.hidden = false;
    headline.replaceChildren(
      el('div', { class: 'metric' }, el('span', { class: 'label' }, 'Activations'),
        el('span', { class: 'value', id: 'm-activation' }, fmtBytes(s.activation_bytes)),
        isBaseline ? null : b ? delta(s.activation_bytes, b.activation_bytes) : referenceDelta(s)),
      el('div', { class: 'metric' }, el('span', { class: 'label' }, 'Peak allocated'),
        el('span', { class: 'value', id: 'm-peak' }, fmtBytes(s.peak_allocated_bytes)),
        b && !isBaseline ? delta(s.peak_allocated_bytes, b.peak_allocated_bytes) : null,
        s.budget_bytes ? el('span', { class: 'muted small', id: 'm-plan' },
          ` budget ${fmtBytes(s.budget_bytes)} · predicted ${fmtBytes(s.predicted_peak_bytes)}`) : null),
      el('div', { class: 'metric' }, el('span', { class: 'label', title: 'median over the steps after warm-up' }, 'Step time'),
        el('span', { class: 'value', id: 'm-time' }, fmtMs(s.step_time_ms)),
        baseline && !isBaseline ? overheadDelta(baseline.comparison) : null),
      el('div', { class: 'metric' }, el('span', { class: 'label' }, 'Gradients'),
        el('span', { class: 'value', id: 'm-grad' }, gradBadge(s.gradients_match ?? null, s.grad_max_abs_diff, s.gradient_verdict))),
    );
    let baselineEntry;
    if (isBaseline) baselineEntry = ['Baseline', 'this run is a baseline (no checkpointing)'];
    else if (cmp && (cmp.baseline_ids.length || cmp.overhead)) {
      const o = cmp.overhead;
      const runs = cmp.baseline_ids.map((id, i) => [i ? ', ' : '', el('a', { href: `#/experiments/${id}` }, `#${id}`)]).flat();
      const against = cmp.paired ? [` step time against an un-checkpointed copy (strategy ${BASELINE}) timed in the same process`,
        ...(runs.length ? ['; memory against ', ...runs] : [' ', baselineAction(cmp, 'Run the baseline for the memory figures')])]
        : [' step time against ', ...runs, ` (strategy ${BASELINE})`];
      baselineEntry = ['Overhead vs baseline', el('span', null,
        el('strong', { id: 'exp-overhead' }, !o ? '—' : o.measurable ? fmtPct(o.estimate_pct) : 'no measurable difference'),
        ...against,
        cmp.overhead_text ? el('span', { class: 'muted', id: 'exp-overhead-ci' }, ` · ${cmp.overhead_text}`) : null)];
    } else {
      baselineEntry = ['Overhead vs baseline', el('span', null, 'no succeeded baseline with this spec yet', cmp ? ': ' : '',
        baselineAction(cmp, 'Run the baseline'))];
    }
    const grad = s.gradients_match === null || s.gradients_match === undefined
      ? 'not verified'
      : `${s.gradients_match ? 'match' : 'differ'}: max |Δgrad| = ${fmtDiff(s.grad_max_abs_diff)}${s.grad_max_abs ? ` (largest gradient ${fmtDiff(s.grad_max_abs)})` : ''}`;
    kv($('exp-summary'), [
      ['Activation memory', fmtBytes(s.activation_bytes), bytesDd(s.activation_bytes)],
      ['Peak allocated', fmtBytes(s.peak_allocated_bytes), bytesDd(s.peak_allocated_bytes)],
      ['Recomputation peak', fmtBytes(s.recompute_peak_bytes), bytesDd(s.recompute_peak_bytes)],
      s.reserved_bytes !== undefined && s.reserved_bytes !== null ? ['Reserved (CUDA)', fmtBytes(s.reserved_bytes), bytesDd(s.reserved_bytes)] : null,
      ['Where the peak is', s.peak_explanation || '—', { id: 'exp-peak' }],
      ['Step time (median)', stepTimeText(s)],
      ['Forward / backward / optimizer', `${fmtMs(s.forward_ms)} / ${fmtMs(s.backward_ms)} / ${fmtMs(s.optimizer_ms)}`],
      baselineEntry,
      s.plan ? ['Step-time overhead, plan against run', overheadWords(s.plan, s.paired_overhead, s.pairing_skipped), { id: 'exp-plan-overhead' }] : null,
      ['Gradient check', s.gradients_match === false && s.grad_worst_param ? `${grad}; worst: ${s.grad_worst_param}` : grad,
        s.gradients_match === false ? { class: 'bad', id: 'exp-grad' } : { id: 'exp-grad' }],
      s.recompute_verdict ? ['Recomputation', recomputeText(s), s.recompute_verdict === 'differ' ? { class: 'bad', id: 'exp-recompute' } : { id: 'exp-recompute' }] : null,
      ['Params without grad', fmtInt(s.params_without_grad), s.params_without_grad > 0 ? { class: 'bad' } : null],
      ['Parameters', fmtInt(s.param_count)],
      ['Final loss', typeof s.final_loss === 'number' ? s.final_loss.toPrecision(5) : '—'],
    ]);
    const runBaseline = $('exp-run-baseline');
    if (runBaseline) runBaseline.addEventListener('click', () => submitBaseline(exp.spec, runBaseline));
    renderBreakdown(s);
  }
  renderRanks(exp);
  const warnings = [...new Set([...(exp.warnings || []), ...((s && s.warnings) || [])])];
  $('exp-warnings').replaceChildren(...warnings.map((w) => el('li', null, w)));
  $('exp-warnings-box').hidden = warnings.length === 0;

  const errBox = $('exp-error');
  if (exp.error) {
    const first = exp.error.split('\n')[0];
    const more = exp.error.includes('\n') ? [el('details', null, el('summary', null, 'details'), el('pre', null, exp.error))] : [];
    errBox.replaceChildren(el('strong', null, `${exp.status.replace('_', ' ')}: `), first, ...more);
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

export function renderEnvironment(s) {
  const env = (s && s.environment) || null;
  if (!env) return;
  const labels = {
    torch_version: 'PyTorch', device: 'Device', device_name: 'Device name', cuda_version: 'CUDA',
    capability: 'Compute capability', host: 'Host', python: 'Python', cpu_threads: 'CPU threads',
  };
  kv($('exp-env'), Object.entries(env).map(([k, v]) => [labels[k] || k,
    v === null || v === undefined ? '—' : Array.isArray(v) ? v.join('.') : typeof v === 'object' ? JSON.stringify(v) : String(v)]));
}

export function renderDownloads(exp) {
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
  body.checkpoint = { ...(body.checkpoint || {}), strategy: BASELINE };
  try {
    const r = await api('/api/experiments', { json: body });
    if (r.ok && r.body) location.hash = `#/experiments/${r.body.id}`;
    else button.replaceWith(el('span', { class: 'bad' }, detailText(r.body)));
  } catch (_) {
    button.disabled = false;
  }
}

// ------------------------------------------------------------------ baseline

/**
 * The `none` baseline to compare with, from the server's comparison
 * (GET /api/experiments/{id}/comparison: the sweep's baseline, else the latest runs with the
 * same spec but for checkpoint): its first run, for the memory deltas, with the comparison
 * (overhead and its 95% CI, and `baseline_refused`) under `comparison`; only the comparison
 * when no baseline run is there to show. Null for a baseline, or when it cannot be read.
 */
export async function findBaseline(exp) {
  if ((exp.spec.checkpoint || {}).strategy === BASELINE) return null;
  try {
    const r = await api(`/api/experiments/${exp.id}/comparison`);
    if (!r.ok || !r.body) return null;
    if (!r.body.baseline_ids.length) return { comparison: r.body }; // no run to show (paired, or none yet)
    const b = await api(`/api/experiments/${r.body.baseline_ids[0]}`);
    return b.ok && b.body ? { ...b.body, comparison: r.body } : null;
  } catch (_) {
    return null;
  }
}

// ------------------------------------------------------------------ history

let historyTicket = 0;

/** The recorded status changes (GET /api/experiments/{id}/events/history): when, to what,
 * which attempt and worker, why. A requeued run shows the attempt its worker lost. */
export async function renderHistory(id) {
  const ticket = ++historyTicket;
  const r = await api(`/api/experiments/${id}/events/history`).catch(() => null);
  if (ticket !== historyTicket || !r || !r.ok) return;
  $('exp-history').replaceChildren(...r.body.data.map((e) => el('li', { class: `event status-${e.status}`, dataset: { attempt: e.attempt, status: e.status } },
    el('time', { datetime: e.at, title: fmtDate(e.at) }, fmtAgo(e.at)), ' ',
    statusBadge(e.status),
    e.attempt ? ` attempt ${e.attempt}` : '',
    e.worker_id ? el('span', { class: 'muted' }, ` on ${e.worker_id}`) : '',
    e.reason ? ` — ${e.reason}` : '')));
}
