/* Pure logic, no DOM (tests/frontend/test_plan.py runs it under node against the server's
 * planner): the experiment spec's defaults and limits, the sweep expansion exactly as
 * ckptlab/db/sweeps.py plan_sweep does it (product of the axes, one `none` baseline per
 * combination of the non-checkpoint axes, runs whose spec equals an earlier one dropped,
 * combinations that do not validate reported), byte-size parsing and the sweep
 * recommendation. */

export const MODEL_KINDS = ['mlp', 'resnet', 'transformer', 'densenet', 'custom'];
export const STRATEGIES = ['none', 'sequential', 'per_block', 'selective', 'offload'];
export const POLICIES = ['save_matmuls', 'save_matmuls_and_attention', 'recompute_all'];
/** The server's default `max_sweep_size` (experiments per sweep, baselines included). */
export const DEFAULT_MAX_SWEEP_SIZE = 256;

const INT = 'int';
const FLOAT = 'float';
const BOOL = 'bool';

/** Field rules of ckptlab/spec.py: [type, default, min, max, {exclusiveMax, choices, ...}]. */
const DROPOUT = { type: FLOAT, default: 0.0, min: 0, max: 1, exclusiveMax: true };
export const MODEL_FIELDS = {
  mlp: {
    depth: { type: INT, default: 32, min: 1, max: 1024 },
    width: { type: INT, default: 1024, min: 1, max: 16384 },
    dropout: DROPOUT,
    stem: { type: BOOL, default: true },
  },
  resnet: {
    depth: { type: INT, default: 9, min: 1, max: 256 },
    channels: { type: INT, default: 16, min: 1, max: 1024 },
    image_size: { type: INT, default: 64, min: 8, max: 1024 },
    dropout: DROPOUT,
  },
  transformer: {
    depth: { type: INT, default: 4, min: 1, max: 256 },
    d_model: { type: INT, default: 128, min: 8, max: 16384 },
    heads: { type: INT, default: 4, min: 1, max: 256 },
    seq_len: { type: INT, default: 128, min: 2, max: 32768 },
    vocab_size: { type: INT, default: 1000, min: 2, max: 1000000 },
    dropout: DROPOUT,
  },
  densenet: {
    depth: { type: INT, default: 12, min: 1, max: 256 },
    growth_rate: { type: INT, default: 12, min: 1, max: 256 },
    bn_size: { type: INT, default: 4, min: 1, max: 16 },
    image_size: { type: INT, default: 32, min: 4, max: 512 },
    dropout: DROPOUT,
  },
  custom: {
    name: { type: 'name', default: undefined },
    depth: { type: INT, default: undefined, min: 1, max: 4096 },
    options: { type: 'options', default: {} },
  },
};
export const CHECKPOINT_FIELDS = {
  strategy: { type: 'choice', default: 'none', choices: STRATEGIES },
  segments: { type: INT, default: 1, min: 1 },
  every: { type: INT, default: 1, min: 1 },
  policy: { type: 'choice', default: 'save_matmuls', choices: POLICIES },
  use_reentrant: { type: BOOL, default: false },
  preserve_rng_state: { type: BOOL, default: true },
};
export const TOP_FIELDS = {
  batch_size: { type: INT, default: 64, min: 1, max: 65536 },
  steps: { type: INT, default: 5, min: 1, max: 100000 },
  warmup_steps: { type: INT, default: 1, min: 0 },
  grad_accum_steps: { type: INT, default: 1, min: 1, max: 1024 },
  amp: { type: 'choice', default: 'off', choices: ['off', 'fp16', 'bf16'] },
  optimizer: { type: 'choice', default: 'adam', choices: ['sgd', 'adam', 'adamw'] },
  device: { type: 'choice', default: 'auto', choices: ['auto', 'cpu', 'cuda'] },
  seed: { type: INT, default: 0, min: 0, max: 2 ** 63 - 1 },
  memory_limit_bytes: { type: INT, default: null, min: 1, nullable: true },
  verify_gradients: { type: BOOL, default: true },
  memory_snapshot: { type: BOOL, default: false },
  timeout_s: { type: FLOAT, default: null, min: 0, exclusiveMin: true, max: 7 * 24 * 3600, nullable: true },
};

function isObj(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** A field's value against its rule: an error message or null. */
function fieldError(rule, v) {
  if (v === undefined && rule.default === undefined) return 'Field required';
  if (v === undefined) return null;
  if (v === null) return rule.nullable ? null : 'Input should be a valid value, not null';
  switch (rule.type) {
    case INT:
      if (typeof v !== 'number' || !Number.isInteger(v)) return 'Input should be a valid integer';
      break;
    case FLOAT:
      if (typeof v !== 'number' || !Number.isFinite(v)) return 'Input should be a valid number';
      break;
    case BOOL:
      return typeof v === 'boolean' ? null : 'Input should be a valid boolean';
    case 'choice':
      return rule.choices.includes(v) ? null : `Input should be ${rule.choices.map((c) => `'${c}'`).join(', ')}`;
    case 'name':
      return typeof v === 'string' && /^[A-Za-z0-9_.-]{1,100}$/.test(v)
        ? null
        : 'name must be 1 to 100 letters, digits, _ . or -';
    case 'options':
      return isObj(v) && Object.keys(v).length <= 64 ? null : 'options must be an object of at most 64 entries';
    default:
      return null;
  }
  if (rule.min !== undefined && (rule.exclusiveMin ? v <= rule.min : v < rule.min)) {
    return `Input should be greater than ${rule.exclusiveMin ? '' : 'or equal to '}${rule.min}`;
  }
  if (rule.max !== undefined && (rule.exclusiveMax ? v >= rule.max : v > rule.max)) {
    return `Input should be less than ${rule.exclusiveMax ? '' : 'or equal to '}${rule.max}`;
  }
  return null;
}

function checkObject(obj, rules, loc, errors) {
  if (!isObj(obj)) {
    errors.push({ loc, msg: 'Input should be an object' });
    return;
  }
  for (const key of Object.keys(obj)) {
    if (!(key in rules) && key !== 'kind') errors.push({ loc: [...loc, key], msg: 'Extra inputs are not permitted' });
  }
  for (const [key, rule] of Object.entries(rules)) {
    const msg = fieldError(rule, obj[key]);
    if (msg) errors.push({ loc: [...loc, key], msg });
  }
}

/**
 * Validate an experiment spec as ckptlab/spec.py ExperimentSpec does (field limits, then
 * the cross-field checks, which pydantic runs only when the fields are valid).
 * @returns {{loc: (string|number)[], msg: string}[]} locations without pydantic's union tag
 */
export function validateSpec(spec) {
  const errors = [];
  if (!isObj(spec)) return [{ loc: [], msg: 'Input should be an object' }];
  for (const key of Object.keys(spec)) {
    if (!(key in TOP_FIELDS) && key !== 'model' && key !== 'checkpoint') {
      errors.push({ loc: [key], msg: 'Extra inputs are not permitted' });
    }
  }
  const model = spec.model === undefined ? {} : spec.model;
  const kind = isObj(model) ? (model.kind === undefined ? 'mlp' : model.kind) : null;
  if (kind !== null && !MODEL_KINDS.includes(kind)) {
    return [{ loc: ['model', 'kind'], msg: `unknown model kind '${kind}'` }];
  }
  if (kind === null) errors.push({ loc: ['model'], msg: 'Input should be an object' });
  else checkObject(model, MODEL_FIELDS[kind], ['model'], errors);
  const ck = spec.checkpoint === undefined ? {} : spec.checkpoint;
  checkObject(ck, CHECKPOINT_FIELDS, ['checkpoint'], errors);
  for (const [key, rule] of Object.entries(TOP_FIELDS)) {
    const msg = fieldError(rule, spec[key]);
    if (msg) errors.push({ loc: [key], msg });
  }
  if (errors.length) return errors;
  // Model-level checks (run by pydantic once the model's own fields are valid).
  if (kind === 'resnet' && (model.image_size ?? 64) % 4) {
    return [{ loc: ['model', 'image_size'], msg: 'image_size must be a multiple of 4' }];
  }
  if (kind === 'transformer' && (model.d_model ?? 128) % (model.heads ?? 4)) {
    return [{ loc: ['model', 'heads'], msg: `heads (${model.heads ?? 4}) must divide d_model (${model.d_model ?? 128})` }];
  }
  const full = normalizeSpec(spec);
  const c = full.checkpoint;
  const depth = full.model.depth;
  if (full.warmup_steps >= full.steps) {
    return [{ loc: ['warmup_steps'], msg: `warmup_steps (${full.warmup_steps}) must be less than steps (${full.steps})` }];
  }
  if (c.strategy === 'sequential' && c.segments > depth) {
    return [{ loc: ['checkpoint', 'segments'], msg: `segments (${c.segments}) must not exceed model.depth (${depth})` }];
  }
  if ((c.strategy === 'per_block' || c.strategy === 'selective') && c.every > depth) {
    return [{ loc: ['checkpoint', 'every'], msg: `every (${c.every}) must not exceed model.depth (${depth})` }];
  }
  if (c.strategy === 'selective' && c.use_reentrant) {
    return [{ loc: ['checkpoint', 'use_reentrant'], msg: "strategy 'selective' needs use_reentrant false" }];
  }
  return [];
}

/** The spec with every default filled in (what the server's model_dump holds). */
export function normalizeSpec(spec) {
  const model = isObj(spec.model) ? spec.model : {};
  const kind = model.kind === undefined ? 'mlp' : model.kind;
  const fill = (obj, rules) => {
    const out = {};
    for (const [k, r] of Object.entries(rules)) out[k] = obj[k] === undefined ? r.default : obj[k];
    return out;
  };
  return {
    ...fill(spec, TOP_FIELDS),
    model: { kind, ...fill(model, MODEL_FIELDS[kind] || {}) },
    checkpoint: fill(isObj(spec.checkpoint) ? spec.checkpoint : {}, CHECKPOINT_FIELDS),
  };
}

/** JSON with sorted keys: equal for equal values whatever the key order. */
export function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (isObj(value)) {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(',')}}`;
  }
  return JSON.stringify(value === undefined ? null : value);
}

export function isCheckpointAxis(path) {
  return path === 'checkpoint' || path.startsWith('checkpoint.');
}

function setPath(obj, path, value) {
  const parts = path.split('.');
  let node = obj;
  for (const p of parts.slice(0, -1)) {
    if (!isObj(node[p])) node[p] = {};
    node = node[p];
  }
  node[parts[parts.length - 1]] = value;
}

function product(lists) {
  let out = [[]];
  for (const list of lists) out = out.flatMap((prefix) => list.map((v) => [...prefix, v]));
  return out;
}

/**
 * What POST /api/sweeps will queue for `base` and `axes` (ckptlab/db/sweeps.py plan_sweep).
 * @returns {{combinations: number, baselines: number, runs: {values, spec, baseline}[],
 *   invalid: {values, baseline, errors}[], duplicates: number, axisErrors: {path, msg}[],
 *   tooLarge: boolean, noValid: boolean}}
 */
export function planSweep(base, axes, { maxSize = DEFAULT_MAX_SWEEP_SIZE } = {}) {
  const paths = Object.keys(axes);
  const other = paths.filter((p) => !isCheckpointAxis(p));
  const axisErrors = [];
  for (const p of paths) {
    const canon = axes[p].map(canonical);
    if (new Set(canon).size !== canon.length) axisErrors.push({ path: p, msg: `axis '${p}' repeats a value` });
    if (!axes[p].length) axisErrors.push({ path: p, msg: 'give at least one value' });
  }
  const combinations = paths.reduce((n, p) => n * axes[p].length, 1);
  const baselines = other.reduce((n, p) => n * axes[p].length, 1);
  const plan = {
    combinations, baselines, runs: [], invalid: [], duplicates: 0, axisErrors,
    tooLarge: combinations + baselines > maxSize, noValid: false,
  };
  if (axisErrors.length || plan.tooLarge) return plan;
  const seen = new Set();
  const add = (values, baseline) => {
    const data = JSON.parse(JSON.stringify(base));
    for (const [p, v] of Object.entries(values)) setPath(data, p, JSON.parse(JSON.stringify(v)));
    const errors = validateSpec(data);
    if (errors.length) {
      plan.invalid.push({ values, baseline, errors });
      return false;
    }
    const spec = normalizeSpec(data);
    const key = canonical(spec);
    if (seen.has(key)) plan.duplicates += 1;
    else {
      seen.add(key);
      plan.runs.push({ values, spec, baseline });
    }
    return true;
  };
  for (const combo of product(other.map((p) => axes[p]))) {
    const values = Object.fromEntries(other.map((p, i) => [p, combo[i]]));
    add({ ...values, 'checkpoint.strategy': 'none' }, true);
  }
  let anyValid = false;
  for (const combo of product(paths.map((p) => axes[p]))) {
    if (add(Object.fromEntries(paths.map((p, i) => [p, combo[i]])), false)) anyValid = true;
  }
  plan.noValid = !anyValid;
  return plan;
}

/**
 * A list typed by the user ("1, 2, 4 8") -> values.
 * @param {'int'|'float'|'str'} type
 * @returns {{values: any[], error: string|null}}
 */
export function parseList(text, type = 'int') {
  const parts = String(text).split(/[\s,;]+/).filter(Boolean);
  if (!parts.length) return { values: [], error: 'give at least one value' };
  const values = [];
  for (const p of parts) {
    if (type === 'str') {
      values.push(p);
      continue;
    }
    const n = Number(p);
    if (!/^[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$/i.test(p) || !Number.isFinite(n)) {
      return { values: [], error: `“${p}” is not a number` };
    }
    if (type === 'int' && !Number.isInteger(n)) return { values: [], error: `“${p}” is not a whole number` };
    values.push(n);
  }
  const seen = new Set();
  for (const v of values) {
    const k = canonical(v);
    if (seen.has(k)) return { values, error: `repeats a value (${v})` };
    seen.add(k);
  }
  return { values, error: null };
}

const BYTE_UNITS = {
  '': 1, b: 1, byte: 1, bytes: 1,
  k: 1024, kib: 1024, kb: 1e3,
  m: 1024 ** 2, mib: 1024 ** 2, mb: 1e6,
  g: 1024 ** 3, gib: 1024 ** 3, gb: 1e9,
  t: 1024 ** 4, tib: 1024 ** 4, tb: 1e12,
};

/**
 * "2 GiB", "512MiB", "1.5G", "800000" -> bytes (KiB/MiB/GiB and bare K/M/G are binary,
 * kB/MB/GB decimal); null when the text is not a size.
 */
export function parseBytes(text) {
  const m = /^\s*(\d+(?:\.\d*)?|\.\d+)(?:e([-+]?\d+))?\s*([a-z]*)\s*$/i.exec(String(text ?? ''));
  if (!m) return null;
  const unit = BYTE_UNITS[m[3].toLowerCase()];
  if (unit === undefined) return null;
  const n = Number(m[1]) * 10 ** Number(m[2] || 0) * unit;
  return Number.isFinite(n) ? Math.round(n) : null;
}

function num(v) {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

/**
 * Which configurations of a sweep (rows of GET /api/sweeps/{id}/results) fit a memory
 * budget, the fastest of those ("recommended"), and the one with the smallest peak whose
 * step time is within `overheadPct` of its baseline. Only succeeded experiments count, and
 * only those whose gradients did not differ from the un-checkpointed run are recommended
 * (a setting that changes the gradients is a bug, however fast); the baseline (no
 * checkpointing) is a configuration like any other.
 * @returns {{candidates: number, excluded: number, fitting: Set<number>|null, recommended: object|null,
 *   smallest: object|null, fastest: object|null, leanest: object|null}}
 */
export function recommend(rows, { budget = null, overheadPct = null } = {}) {
  const measured = rows.filter(
    (r) => r.status === 'succeeded' && num(r.metrics.peak_allocated_bytes) !== null && num(r.metrics.step_time_ms) !== null,
  );
  const candidates = measured.filter((r) => r.gradients_match !== false);
  const byTime = (a, b) =>
    a.metrics.step_time_ms - b.metrics.step_time_ms ||
    a.metrics.peak_allocated_bytes - b.metrics.peak_allocated_bytes ||
    a.experiment_id - b.experiment_id;
  const byBytes = (a, b) =>
    a.metrics.peak_allocated_bytes - b.metrics.peak_allocated_bytes ||
    (num(a.metrics.activation_bytes) ?? Infinity) - (num(b.metrics.activation_bytes) ?? Infinity) ||
    byTime(a, b);
  let fitting = null;
  let recommended = null;
  if (budget !== null && budget !== undefined) {
    fitting = new Set(measured.filter((r) => r.metrics.peak_allocated_bytes <= budget).map((r) => r.experiment_id));
    recommended = candidates.filter((r) => fitting.has(r.experiment_id)).sort(byTime)[0] || null;
  }
  let smallest = null;
  if (overheadPct !== null && overheadPct !== undefined) {
    const within = candidates.filter((r) => num(r.metrics.overhead_pct) !== null && r.metrics.overhead_pct <= overheadPct);
    smallest = within.sort(byBytes)[0] || null;
  }
  const fastest = candidates.slice().sort(byTime)[0] || null;
  const leanest = candidates.slice().sort(byBytes)[0] || null;
  return { candidates: candidates.length, excluded: measured.length - candidates.length, fitting, recommended, smallest, fastest, leanest };
}
