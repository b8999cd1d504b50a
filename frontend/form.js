/* The "New experiment / sweep" form (#/new): presets, every spec option, sweep axes, the
 * number of runs before submitting, and 422 errors shown next to the field they name. */

import './form_view.js';
import {
  $, BASELINE, DEFAULT_KIND, META, MODEL_KINDS, STRATEGIES, STRATEGY, api, detailText, el, modelLabel, setHashParams, strategyLabel,
  syncOptions,
} from './util.js';
import { readAxes as readAxesOf, readSpec as readSpecOf, setControl } from './form_read.js';
import { buildModelControls, fillModel, resetModel } from './form_hf.js';
import { buildDistributedControls, distributedLabel, dropOneProcess, fillDistributed, syncDistributed } from './distributed.js';

/** The presets (ckptlab/spec/presets.py): name -> {spec, axes}. */
const PRESETS = META.presets;
import { autoName, dropPendingPlan, showSweepPlan } from './sweep_plan.js';
import { planBody, planSummary, submitPlan } from './plan.js';
import { fillTargetSelect, submitPrediction } from './prediction.js';

const form = $('experiment-form');

let navigate = (hash) => { location.hash = hash; };
let onSweepCreated = () => {};
let planTimer = null;

function isSweep() {
  return form.elements.namedItem('mode').value === 'sweep';
}

function isPlan() {
  return form.elements.namedItem('mode').value === 'plan';
}

function kind() {
  return $('model.kind').value;
}

const readSpec = () => dropOneProcess(readSpecOf(form));
const readAxes = () => readAxesOf(form);

// ------------------------------------------------------------------ dependent fields

/** Shows the model kind's field group, and the checkpoint knobs the chosen strategies use. */
function syncVisibility() {
  const k = kind();
  for (const g of form.querySelectorAll('.kind-group')) {
    const on = g.dataset.kind === k;
    g.hidden = !on;
    g.disabled = !on;
  }
  const strategies = new Set();
  if (isSweep() && $('axis-strategy').checked) {
    for (const c of form.querySelectorAll('[data-axis-value="checkpoint.strategy"]:checked')) strategies.add(c.value);
  } else {
    strategies.add($('checkpoint.strategy').value);
  }
  // Every axis's base field is sent unless hidden below or set by a ticked axis.
  for (const toggle of form.querySelectorAll('[data-axis]')) {
    const base = form.querySelector(`[name="${toggle.dataset.axis}"]`);
    if (base) base.disabled = false;
  }
  // A checkpoint field shows when a chosen strategy reads it (the strategy table's fields).
  const fields = new Set([...strategies].flatMap((s) => (STRATEGY.get(s) ? STRATEGY.get(s).fields : [])));
  for (const node of form.querySelectorAll('[data-ck-fields]')) {
    const on = node.dataset.ckFields.split(' ').some((f) => fields.has(f));
    node.hidden = !on;
    for (const c of node.querySelectorAll('input, select')) c.disabled = !on;
  }
  // A base field that a ticked axis sets is not sent (the axis gives each run its value).
  for (const f of form.querySelectorAll('.field.by-axis')) f.classList.remove('by-axis');
  if (isSweep()) {
    for (const toggle of form.querySelectorAll('[data-axis]:checked')) {
      const base = form.querySelector(`[name="${toggle.dataset.axis}"]`);
      if (!base) continue;
      base.disabled = true;
      base.closest('.field').classList.add('by-axis');
    }
  }
  syncDistributed();
  form.classList.toggle('is-sweep', isSweep());
  form.classList.toggle('is-plan', isPlan());
  $('plan-budget').disabled = !isPlan();
  $('plan-compile').disabled = !isPlan();
  if (isPlan()) for (const c of $('checkpoint-fieldset').querySelectorAll('input, select')) c.disabled = true;
  for (const axis of form.querySelectorAll('.axis')) {
    const toggle = axis.querySelector('[data-axis]');
    axis.classList.toggle('on', toggle.checked);
    for (const c of axis.querySelectorAll('.axis-values input')) c.disabled = !toggle.checked || !isSweep();
  }
  $('sweep-name').disabled = !isSweep();
}

/** Ticking an axis whose knob the base strategy ignores switches the strategy to the
 * simplest one that reads it (the strategy table's fields and rank). */
function onAxisToggle(toggle) {
  const path = toggle.dataset.axis;
  if (!toggle.checked || $('axis-strategy').checked || !path.startsWith('checkpoint.')) return;
  const field = path.slice('checkpoint.'.length);
  const strategy = $('checkpoint.strategy');
  const reads = (name) => STRATEGY.has(name) && STRATEGY.get(name).fields.includes(field);
  if (reads(strategy.value)) return;
  const first = STRATEGIES.find(reads);
  if (first) strategy.value = first;
}

/** The strategy choices, the policy choices and the strategy axis, from the strategy table. */
function buildStrategyControls() {
  const select = $('checkpoint.strategy');
  select.replaceChildren(...STRATEGIES.map((name) => el('option', { value: name }, `${name} — ${STRATEGY.get(name).summary}`)));
  select.value = BASELINE;
  syncOptions($('checkpoint.policy'), META.policies);
  const swept = STRATEGIES.filter((name) => name !== BASELINE);
  $('axis-strategy-values').replaceChildren(...swept.map((name) => el('label', null,
    el('input', { type: 'checkbox', 'data-axis-value': 'checkpoint.strategy', value: name, checked: STRATEGY.get(name).sweep_default }),
    ` ${name}`)));
  $('axis-every-hint').textContent = swept.filter((name) => STRATEGY.get(name).fields.includes('every')).join(' and ');
}

// ------------------------------------------------------------------ run count

/** Shows what will be queued: one experiment, or the server's plan of the sweep (a dry run). */
function updatePlan() {
  syncVisibility();
  const box = $('run-count');
  const notes = $('plan-notes');
  const { spec } = readSpec();
  const button = $('submit');
  if (isPlan()) {
    dropPendingPlan();
    box.dataset.total = '';
    box.replaceChildren(planSummary(spec, $('plan-budget').value));
    notes.replaceChildren();
    button.textContent = 'Plan for this budget';
    $('request-preview').textContent = JSON.stringify(planBody(spec, $('plan-budget').value, $('plan-compile').checked), null, 2);
    return;
  }
  if (!isSweep()) {
    dropPendingPlan();
    box.dataset.total = '1';
    box.replaceChildren(
      el('div', { class: 'big' }, el('strong', { id: 'run-count-total' }, '1'), ' experiment'),
      el('div', { class: 'muted small' }, `${modelLabel(spec)} · ${strategyLabel(spec)} · batch ${spec.batch_size ?? '?'}${
        distributedLabel(spec) ? ` per rank · ${distributedLabel(spec)}` : ''} · ${spec.steps ?? '?'} steps on ${spec.device}`),
    );
    notes.replaceChildren();
    button.textContent = 'Run experiment';
    $('request-preview').textContent = JSON.stringify(spec, null, 2);
    return;
  }
  const { axes, errors } = readAxes();
  const paths = Object.keys(axes);
  $('request-preview').textContent = JSON.stringify({ name: $('sweep-name').value.trim() || autoName(spec, axes), base: spec, axes }, null, 2);
  if (errors.length || !paths.length) {
    dropPendingPlan();
    box.dataset.total = '';
    box.replaceChildren(
      el('div', { class: 'big' }, el('strong', { id: 'run-count-total' }, '–'), ' experiments'),
      el('div', { class: 'muted small' }, errors.length ? 'fix the axes listed below' : 'tick at least one axis to vary'),
    );
    notes.replaceChildren(...errors.map((e) => {
      const axis = e.input.closest('.axis');
      const label = axis ? axis.querySelector('.axis-toggle').textContent.trim() : 'axes';
      return el('li', { class: 'bad' }, `${label}: ${e.msg}`);
    }));
    button.textContent = 'Submit sweep';
    return;
  }
  showSweepPlan({ spec, axes, body: { name: $('sweep-name').value.trim() || autoName(spec, axes), base: spec, axes } });
}

function schedulePlan() {
  clearTimeout(planTimer);
  planTimer = setTimeout(updatePlan, 30);
}

// ------------------------------------------------------------------ errors

function fieldOf(node) {
  return node.closest('.field') || node.parentElement;
}

function clearFieldError(node) {
  const field = fieldOf(node);
  field.querySelectorAll('.field-error').forEach((n) => n.remove());
  field.querySelectorAll('[aria-invalid]').forEach((n) => n.removeAttribute('aria-invalid'));
  if (field.hasAttribute('aria-invalid')) field.removeAttribute('aria-invalid');
}

export function clearErrors() {
  form.querySelectorAll('.field-error').forEach((n) => n.remove());
  form.querySelectorAll('[aria-invalid]').forEach((n) => {
    n.removeAttribute('aria-invalid');
    n.removeAttribute('aria-describedby');
  });
  const box = $('form-error');
  box.replaceChildren();
  box.hidden = true;
}

function showFormError(...lines) {
  const box = $('form-error');
  box.append(lines.length === 1 ? el('p', null, lines[0]) : el('ul', null, lines.map((l) => el('li', null, l))));
  box.hidden = false;
}

/** A message under `target` (an input, or an axis box of checkboxes), marked invalid. */
function markError(target, msg) {
  const field = fieldOf(target);
  const n = field.querySelectorAll('.field-error').length;
  const errId = `${target.id || field.dataset.name || 'field'}-error-${n}`.replace(/[^\w-]/g, '_');
  field.append(el('p', { class: 'field-error', id: errId }, msg));
  const input = target.matches('input, select, textarea') ? target : target.querySelector('.axis-values input') || target;
  input.setAttribute('aria-invalid', 'true');
  const described = input.getAttribute('aria-describedby');
  input.setAttribute('aria-describedby', described ? `${described} ${errId}` : errId);
  return input;
}

/** The control a spec path names ("model.width", "axes.amp", "name"), or null. */
function controlFor(path) {
  const sel = CSS.escape(path);
  const candidates = [...form.querySelectorAll(`[name="${sel}"]`), ...form.querySelectorAll(`[data-name="${sel}"]`)];
  for (const c of candidates) if (!c.matches(':disabled') && !c.closest('[hidden]')) return c;
  return null;
}

/**
 * A 422 `loc` -> the form path it names. Experiments: ["body", "model", "width"] (a field
 * of the model's kind; a loc with the kind as a union tag, ["body", "model", <kind>, "width"],
 * is read the same); sweeps: ["body", "base", "checkpoint", "segments"],
 * ["body", "axes", "checkpoint.segments"], ["body", "name"]; predictions: ["body", "spec", ...].
 */
export function pathOfLoc(loc) {
  const l = Array.isArray(loc) ? loc.slice() : [];
  if (l[0] === 'body') l.shift();
  if (l[0] === 'axes') return l.length > 1 ? `axes.${l[1]}` : 'axes';
  if (l[0] === 'base' || l[0] === 'spec') l.shift();
  if (l[0] === 'model' && l.length > 2 && MODEL_KINDS.includes(l[1])) l.splice(1, 1);
  return l.join('.');
}

function showValidationErrors(detail) {
  const general = [];
  let first = null;
  for (const item of detail) {
    const path = pathOfLoc(item.loc);
    const msg = item.msg || JSON.stringify(item);
    // The exact control, else the nearest enclosing one ("model.options.x" -> "model.options").
    let target = null;
    const parts = path.split('.');
    for (let i = parts.length; i > 0 && !target; i -= 1) target = controlFor(parts.slice(0, i).join('.'));
    if (!target && path === 'axes') target = form.querySelector('[data-name="axes"]');
    if (!target) {
      general.push(path ? `${path}: ${msg}` : msg);
      continue;
    }
    const input = markError(target, msg);
    if (!first) first = input;
  }
  if (general.length) showFormError(...general);
  if (first) {
    const adv = first.closest('details');
    if (adv) adv.open = true;
    first.focus();
  }
}

// ------------------------------------------------------------------ submit

/** "Predict": the form's one experiment, predicted on the chosen target (POST /api/predictions). */
async function onPredict() {
  clearErrors();
  const { spec, errors } = readSpec();
  if (errors.length) {
    markError(errors[0].input, errors[0].msg).focus();
    return;
  }
  const button = $('predict');
  button.disabled = true;
  try {
    const r = await submitPrediction(spec, $('predict-target').value);
    if (r.ok && r.body && r.body.id !== undefined) navigate(`#/predictions/${r.body.id}`);
    else if (r.status === 422 && r.body && Array.isArray(r.body.detail)) showValidationErrors(r.body.detail);
    else showFormError(`The server refused the prediction (HTTP ${r.status}): ${detailText(r.body)}`);
  } catch (err) {
    showFormError(`Cannot reach the server: ${err.message}`);
  } finally {
    button.disabled = false;
  }
}

async function onSubmit(event) {
  event.preventDefault();
  clearErrors();
  const { spec, errors } = readSpec();
  const sweep = isSweep();
  const axesRead = sweep ? readAxes() : { axes: {}, errors: [] };
  const local = [...errors, ...axesRead.errors];
  if (sweep && !Object.keys(axesRead.axes).length && !axesRead.errors.length) {
    local.push({ input: form.querySelector('[data-name="axes"]'), msg: 'tick at least one axis to vary' });
  }
  if (local.length) {
    let first = null;
    for (const e of local) {
      const input = markError(e.input, e.msg);
      first = first || input;
    }
    first.focus();
    return;
  }
  const button = $('submit');
  const label = button.textContent;
  button.disabled = true;
  button.textContent = 'Submitting…';
  try {
    if (isPlan()) {
      const r = await submitPlan(spec, $('plan-budget').value, $('plan-compile').checked);
      if (r.ok && r.body) navigate(`#/plans/${r.body.sweep_id}`);
      else if (r.status === 422 && r.body && Array.isArray(r.body.detail)) showValidationErrors(r.body.detail);
      else showFormError(`The server refused the plan (HTTP ${r.status}): ${detailText(r.body)}`);
      return;
    }
    const r = sweep
      ? await api('/api/sweeps', {
        json: { name: $('sweep-name').value.trim() || autoName(spec, axesRead.axes), base: spec, axes: axesRead.axes },
      })
      : await api('/api/experiments', { json: spec });
    if (r.ok && r.body && r.body.id !== undefined) {
      if (sweep) {
        onSweepCreated(r.body);
        navigate(`#/sweeps/${r.body.id}`);
      } else {
        navigate(`#/experiments/${r.body.id}`);
      }
    } else if (r.status === 422 && r.body && Array.isArray(r.body.detail)) {
      showValidationErrors(r.body.detail);
    } else {
      showFormError(`The server refused the ${sweep ? 'sweep' : 'experiment'} (HTTP ${r.status}): ${detailText(r.body)}`);
    }
  } catch (err) {
    showFormError(`Cannot reach the server: ${err.message}`);
  } finally {
    button.disabled = false;
    button.textContent = label;
  }
}

// ------------------------------------------------------------------ filling

/** Fills the form from a spec (presets and an experiment's "Copy to form"). */
export function fillForm(spec, { axes } = {}) {
  const m = spec.model || {};
  $('model.kind').value = m.kind || DEFAULT_KIND;
  syncVisibility();
  fillModel(m);
  const ck = spec.checkpoint || {};
  $('checkpoint.strategy').value = ck.strategy || BASELINE;
  for (const key of ['segments', 'every', 'policy', 'activation_memory_budget', 'compile_scope', 'search_compile', 'use_reentrant', 'preserve_rng_state']) {
    setControl($(`checkpoint.${key}`), ck[key]);
  }
  $('checkpoint.budget_bytes').value = ck.budget_bytes ? String(ck.budget_bytes) : '';
  for (const key of ['batch_size', 'grad_accum_steps', 'steps', 'timed_steps', 'warmup_steps', 'optimizer', 'amp',
    'device', 'seed', 'verify_gradients', 'memory_snapshot', 'memory_early_stop', 'timeout_s']) {
    setControl($(key), spec[key]);
  }
  $('memory_limit_bytes').value = spec.memory_limit_bytes ? String(spec.memory_limit_bytes) : '';
  fillDistributed(spec.distributed);
  if (axes) {
    for (const [path, text] of Object.entries(axes)) {
      const input = form.querySelector(`[name="axes.${path}"]`);
      if (input) input.value = text;
    }
  }
  $('sweep-name').value = ''; // named after the model and axes unless the user types a name
  clearErrors();
  updatePlan();
}

function setMode(mode) {
  form.elements.namedItem('mode').value = mode;
  setHashParams({ mode: mode === 'experiment' ? null : mode });
  clearErrors();
  updatePlan();
}

// ------------------------------------------------------------------ view

export function initForm(opts) {
  navigate = opts.navigate || navigate;
  onSweepCreated = opts.onSweepCreated || onSweepCreated;
  buildModelControls();
  buildStrategyControls();
  buildDistributedControls();
  form.addEventListener('submit', onSubmit);
  fillTargetSelect($('predict-target'));
  $('predict').addEventListener('click', onPredict);
  form.addEventListener('input', (e) => {
    if (e.target.getAttribute('aria-invalid') === 'true' || fieldOf(e.target).querySelector('.field-error')) {
      clearFieldError(e.target);
    }
    schedulePlan();
  });
  form.addEventListener('change', (e) => {
    if (e.target.name === 'mode') {
      setMode(e.target.value);
      return;
    }
    if (e.target.dataset.axis) onAxisToggle(e.target);
    if (fieldOf(e.target).querySelector('.field-error')) clearFieldError(e.target);
    schedulePlan();
  });
  $('reset').addEventListener('click', () => {
    const mode = form.elements.namedItem('mode').value;
    form.reset();
    resetModel();
    form.elements.namedItem('mode').value = mode;
    clearErrors();
    updatePlan();
  });
  for (const b of form.querySelectorAll('[data-preset]')) {
    b.addEventListener('click', () => {
      const p = PRESETS[b.dataset.preset];
      fillForm(p.spec, { axes: p.axes });
      for (const other of form.querySelectorAll('[data-preset]')) other.classList.toggle('active', other === b);
    });
  }
  updatePlan();
}

/** Route #/new?mode=sweep&preset=tiny */
export function showNew(params) {
  const mode = ['sweep', 'plan'].includes(params.get('mode')) ? params.get('mode') : 'experiment';
  form.elements.namedItem('mode').value = mode;
  const preset = params.get('preset');
  if (preset && PRESETS[preset]) fillForm(PRESETS[preset].spec, { axes: PRESETS[preset].axes });
  document.title = 'ckptlab · new';
  updatePlan();
}
