/* Pure helpers of the sweep page and the form, no DOM: typed lists ("1, 2, 4") and byte sizes
 * ("2 GiB"). The spec rules, the sweep plan and the recommendation are the server's (GET
 * /api/meta, POST /api/sweeps?dry_run=true, GET /api/sweeps/{id}/recommendation). */

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
