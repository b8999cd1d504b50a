/* The sweep plan on the form, before submitting: the server's own answer to a dry run
 * (POST /api/sweeps?dry_run=true), so the count shown is the count queued. A newer request
 * makes older answers stale; they are dropped. */

import { $, AXIS_NAMES, api, el, modelLabel, shortName, valueText } from './util.js';

let latest = 0;
let timer = null;

function plural(n, pair) {
  return `${n} ${n === 1 ? pair[0] : pair[1]}`;
}

function valuesText(values) {
  return Object.entries(values)
    .map(([p, v]) => `${shortName(p)}=${valueText(v)}`)
    .join(' ');
}

/** The default name of a sweep: the model and the axes varied ("MLP 8×64 · segment × AMP"). */
export function autoName(spec, axes) {
  const names = Object.keys(axes).map((p) => (AXIS_NAMES[p] ? AXIS_NAMES[p][1].split(' ')[0] : p.split('.').pop()));
  return `${modelLabel(spec)} · ${names.join(' × ') || 'sweep'}`;
}

/** Forget any dry run in flight (the form no longer shows a sweep, or its axes are bad). */
export function dropPendingPlan() {
  latest += 1;
  clearTimeout(timer);
}

/**
 * Ask the server for the plan of `body` ({name, base, axes}) after a short pause (typing)
 * and show it in #run-count, #plan-notes and the submit button.
 */
export function showSweepPlan({ spec, axes, body }) {
  dropPendingPlan();
  const ticket = latest;
  const box = $('run-count');
  box.dataset.total = '';
  box.setAttribute('aria-busy', 'true');
  timer = setTimeout(async () => {
    let r;
    try {
      r = await api('/api/sweeps?dry_run=true', { json: body });
    } catch (_) {
      return; // the connection banner says why
    }
    if (ticket !== latest) return;
    box.removeAttribute('aria-busy');
    render(spec, axes, r);
  }, 250);
}

function render(spec, axes, r) {
  const box = $('run-count');
  const notes = $('plan-notes');
  const button = $('submit');
  const paths = Object.keys(axes);
  const factors = paths.map((p) => plural(axes[p].length, AXIS_NAMES[p] ? AXIS_NAMES[p].slice(1) : ['value', 'values']));
  if (!r.ok) {
    const detail = Array.isArray(r.body?.detail) ? r.body.detail : [{ type: '', msg: String(r.body?.detail ?? r.status) }];
    const tooLarge = detail.find((e) => e.type === 'sweep_too_large');
    box.replaceChildren(
      el('div', { class: 'big bad' }, el('strong', { id: 'run-count-total' }, '–'), ' experiments'),
      el('div', { class: 'small' }, tooLarge ? `${factors.join(' × ')}: ${tooLarge.msg}` : 'this sweep cannot be queued'),
    );
    const items = detail.filter((e) => e !== tooLarge).map((e) => {
      const prefix = e.type === 'no_valid_combination' ? 'No valid combination: ' : '';
      return el('li', { class: 'bad' }, `${prefix}${e.msg.replace(/^no valid combination among \d+: /, '')}`);
    });
    notes.replaceChildren(...items);
    button.textContent = 'Submit sweep';
    return;
  }
  const plan = r.body;
  const total = plan.total;
  const runs = plan.runs.filter((x) => !x.baseline).length;
  const baselines = total - runs;
  const skipped = plan.invalid.filter((i) => !i.baseline).length + (plan.duplicates || 0);
  box.dataset.total = String(total);
  box.replaceChildren(
    el('div', { class: 'big' }, el('strong', { id: 'run-count-total' }, String(total)), total === 1 ? ' experiment' : ' experiments'),
    el('div', { class: 'muted small' }, `${modelLabel(spec)} · batch ${spec.batch_size ?? 'varied'} · ${spec.steps ?? '?'} steps on ${spec.device}`),
    el('div', { class: 'small' },
      `${plural(runs, ['run', 'runs'])} (${factors.join(' × ')}${skipped ? `, ${skipped} not queued: see below` : ''}) + ${plural(baselines, ['baseline', 'baselines'])} `,
      el('span', { class: 'muted' }, `(strategy none, one per ${plan.baselines > 1 ? 'combination of AMP / batch size' : 'sweep'}`
        + `${plan.repeats ? ', run first and again last so that drift shows' : ''})`)),
  );
  const items = [];
  if (plan.duplicates) {
    items.push(el('li', null, `${plural(plan.duplicates, ['combination is', 'combinations are'])} the same spec as another run and queued once.`));
  }
  const invalidRuns = plan.invalid.filter((i) => !i.baseline);
  if (invalidRuns.length) {
    const ex = invalidRuns[0];
    items.push(el('li', { class: 'warn' },
      `${plural(invalidRuns.length, ['combination is', 'combinations are'])} invalid and will not be queued, e.g. `,
      el('code', null, valuesText(ex.values)), `: ${ex.errors[0].msg}.`));
  }
  const invalidBase = plan.invalid.filter((i) => i.baseline);
  if (invalidBase.length) {
    items.push(el('li', { class: 'warn' }, `${plural(invalidBase.length, ['baseline is', 'baselines are'])} invalid: ${invalidBase[0].errors[0].msg}.`));
  }
  notes.replaceChildren(...items);
  button.textContent = `Submit sweep (${total} runs)`;
}
