/* Pure helpers of the sweep page and the form, no DOM: typed lists ("1, 2, 4"), byte sizes
 * ("2 GiB") and the client-side budget view of a sweep's results. The spec rules and the
 * sweep plan are the server's (GET /api/meta, POST /api/sweeps?dry_run=true). */

import { STATUS } from './util.js';

function isObj(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** A canonical JSON text of a value (object keys sorted), to compare values. */
function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (isObj(value)) {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(',')}}`;
  }
  return JSON.stringify(value === undefined ? null : value);
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
 * checkpointing) is a configuration like any other, its second run (`repeat_of`) not.
 * @returns {{candidates: number, excluded: number, fitting: Set<number>|null, recommended: object|null,
 *   smallest: object|null, fastest: object|null, leanest: object|null}}
 */
export function recommend(rows, { budget = null, overheadPct = null } = {}) {
  const measured = rows.filter(
    (r) => r.status === STATUS.SUCCEEDED && num(r.metrics.peak_allocated_bytes) !== null && num(r.metrics.step_time_ms) !== null,
  );
  // A baseline's second run is the same setting timed again (its drift), not a choice.
  const candidates = measured.filter((r) => r.gradients_match !== false && r.repeat_of == null);
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
