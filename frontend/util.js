/* Shared helpers: the server's vocabulary (META, read once at start-up), formatting, DOM
 * building, the API client, hash routes, live streams and the lazy Plotly loader.
 * No dependencies; ES module served as /static/util.js. */

export const MIB = 1024 * 1024;

/** Okabe-Ito: distinguishable with the common forms of colour blindness. */
export const OKABE_ITO = {
  black: '#000000',
  orange: '#E69F00',
  sky: '#56B4E9',
  green: '#009E73',
  yellow: '#F0E442',
  blue: '#0072B2',
  vermillion: '#D55E00',
  purple: '#CC79A7',
  grey: '#8C8C8C',
};
/** Trace colour order for charts (yellow last: weak contrast on white). */
export const COLORWAY = ['#0072B2', '#E69F00', '#009E73', '#CC79A7', '#56B4E9', '#D55E00', '#000000', '#F0E442'];

export const $ = (id) => document.getElementById(id);

// ------------------------------------------------------------------ formatting

function isNum(v) {
  return v !== null && v !== undefined && v !== '' && Number.isFinite(Number(v));
}

/** 123456789 -> "117.7 MiB" (binary units, as PyTorch's memory tools use). */
export function fmtBytes(n) {
  if (!isNum(n)) return '—';
  n = Number(n);
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = Math.abs(n);
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  const sign = n < 0 ? '-' : '';
  if (i === 0) return `${sign}${Math.round(v)} B`;
  return `${sign}${v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)} ${units[i]}`;
}

/** The binary unit that suits numbers up to `max` bytes: [divisor, name]. */
export function byteUnit(max) {
  const units = [[1, 'B'], [1024, 'KiB'], [MIB, 'MiB'], [1024 * MIB, 'GiB'], [1024 * 1024 * MIB, 'TiB']];
  let pick = units[0];
  for (const u of units) if (Math.abs(max) >= u[0]) pick = u;
  return pick;
}

/** milliseconds -> "0.42 ms", "12.3 ms", "1,234 ms", "2.5 min" */
export function fmtMs(ms) {
  if (!isNum(ms)) return '—';
  ms = Number(ms);
  const a = Math.abs(ms);
  if (a < 10) return `${ms.toFixed(2)} ms`;
  if (a < 1000) return `${ms.toFixed(1)} ms`;
  if (a < 60000) return `${Math.round(ms).toLocaleString('en-US')} ms`;
  return `${(ms / 60000).toFixed(1)} min`;
}

/** 12.345 -> "+12.3%", -3 -> "−3.0%" */
export function fmtPct(p, { sign = true } = {}) {
  if (!isNum(p)) return '—';
  p = Number(p);
  const s = sign && p > 0 ? '+' : p < 0 ? '−' : '';
  return `${s}${Math.abs(p).toFixed(Math.abs(p) < 10 ? 1 : 0)}%`;
}

export function fmtInt(n) {
  if (!isNum(n)) return '—';
  return Number(n).toLocaleString('en-US');
}

/** A gradient difference: 0 -> "0", 0.000812 -> "8.1e-4", 28.3 -> "28.3" */
export function fmtDiff(d) {
  if (!isNum(d)) return '—';
  d = Number(d);
  if (d === 0) return '0';
  if (Math.abs(d) >= 0.01 && Math.abs(d) < 1000) return d.toPrecision(3);
  return d.toExponential(1);
}

/** ISO timestamp -> Date; one without a zone is UTC (the server stores UTC). */
export function parseDate(iso) {
  const s = String(iso);
  return new Date(/(Z|[+-]\d\d:?\d\d)$/i.test(s) ? s : `${s}Z`);
}

export function fmtDate(iso) {
  if (!iso) return '—';
  const d = parseDate(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
}

/** "3 min ago", "2 h ago", or the date for older times. */
export function fmtAgo(iso, now = Date.now()) {
  if (!iso) return '—';
  const d = parseDate(iso);
  const s = (now - d.getTime()) / 1000;
  if (!Number.isFinite(s)) return String(iso);
  if (s < 45) return 'just now';
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return d.toLocaleDateString();
}

export function fmtDuration(startIso, endIso) {
  if (!startIso || !endIso) return null;
  const s = (parseDate(endIso) - parseDate(startIso)) / 1000;
  if (!Number.isFinite(s) || s < 0) return null;
  if (s < 60) return `${s.toFixed(1)} s`;
  return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

/** A label template filled from `values`: "{field}" reads the value, "?" when it has none; a
 * "[bracketed part]" shows only when every field in it has a value (the tables' templates). */
function fillTemplate(template, values) {
  const has = (key) => values[key] !== undefined && values[key] !== null && values[key] !== '';
  const fields = (text) => [...text.matchAll(/\{(\w+)\}/g)].map((m) => m[1]);
  const kept = template.replace(/\[([^[\]]*)\]/g, (_, part) => (fields(part).every(has) ? part : ''));
  return kept.replace(/\{(\w+)\}/g, (_, key) => (has(key) ? String(values[key]) : '?'));
}

/** "mlp 32×1024": the model kind's label template (model-kind table) filled from the spec's
 * model; an emptied field reads "?". */
export function modelLabel(spec) {
  const raw = (spec && spec.model) || {};
  const entry = MODEL_KIND.get(raw.kind ?? DEFAULT_KIND);
  if (!entry) return `${raw.kind || '?'} ${raw.depth ?? ''}`.trim();
  return fillTemplate(entry.label, { ...raw, kind: entry.name });
}

/** "sequential (4)": the strategy's label template (strategy table) filled from the spec. */
export function strategyLabel(spec) {
  const c = { strategy: BASELINE, ...((spec && spec.checkpoint) || {}) };
  const entry = STRATEGY.get(c.strategy);
  if (!entry) return String(c.strategy);
  const text = (key) => (c[key] === undefined || c[key] === null ? '?' : key.endsWith('_bytes') ? fmtBytes(c[key]) : String(c[key]));
  return entry.label.replace(/\{(\w+)\}/g, (_, key) => text(key));
}

/** Whether a spec's strategy recomputes through torch.utils.checkpoint (the flags matter). */
export function recomputes(spec) {
  const c = (spec && spec.checkpoint) || {};
  const entry = STRATEGY.get(c.strategy || BASELINE);
  return Boolean(entry && entry.recomputes);
}

/** yes/no for a checkpoint flag; a dash when nothing is recomputed (the flag is unused). */
export function flagLabel(spec, key) {
  const c = (spec && spec.checkpoint) || {};
  if (!recomputes(spec)) return '—';
  return c[key] ? 'on' : 'off';
}

// ------------------------------------------------------------------ DOM

/** Element builder: el('td', {class: 'num'}, 'text', childNode). Text is never parsed as HTML. */
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k === 'dataset') Object.assign(node.dataset, v);
    else if (k.startsWith('on') && typeof v === 'function') node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

export function statusBadge(status) {
  return el('span', { class: `badge status-${status}` }, status.replace('_', ' '));
}

/** Correctness of a run's gradients: match / differ / not verified. */
export function gradBadge(match, diff, verdict = null) {
  if (verdict && verdict.startsWith('undetermined')) {
    return el('span', { class: 'badge neutral', title: 'every reference gradient is below 1e-20: nothing to compare' }, verdict);
  }
  if (match === true) return el('span', { class: 'badge ok', title: `max |Δgrad| = ${fmtDiff(diff)}` }, '✓ match');
  if (match === false) return el('span', { class: 'badge bad', title: `max |Δgrad| = ${fmtDiff(diff)}` }, '✗ differ');
  return el('span', { class: 'badge neutral' }, 'not verified');
}

/** Definition list from [label, value, ddAttrs] entries. */
export function kv(dl, entries) {
  const nodes = [];
  for (const entry of entries) {
    if (!entry) continue;
    const [label, val, opts] = entry;
    nodes.push(el('dt', null, label));
    nodes.push(el('dd', opts || null, val));
  }
  dl.replaceChildren(...nodes);
}

// ------------------------------------------------------------------ API

let onConnection = () => {};
export function setConnectionHandler(fn) {
  onConnection = fn;
}
/** Tell the page whether the server answered (shows or hides the connection banner). */
export function connectionChanged(ok) {
  onConnection(ok);
}

let onAuthNeeded = () => {};
/** `fn(detail)` runs when a write is refused for want of the API token (401). */
export function setAuthHandler(fn) {
  onAuthNeeded = fn;
}

/* The API token (CKPTLAB_API_TOKEN), kept for this browser tab's session only. */
const TOKEN_KEY = 'ckptlab.apiToken';

export function apiToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || '';
  } catch (_) {
    return '';
  }
}

export function setApiToken(token) {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch (_) {
    /* storage disabled: the token lasts until the page reloads */
  }
}

/** Most times one call is sent again after a 503 with Retry-After (a busy database). */
const BUSY_RETRIES = 3;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * fetch + JSON; resolves to {ok, status, body}. Network errors reject (and show the banner).
 * Sends the API token when one was entered; a 503 with Retry-After (the database was busy
 * and nothing changed) is sent again up to BUSY_RETRIES times after the wait it names.
 */
export async function api(path, options) {
  const opts = Object.assign({ headers: { Accept: 'application/json' } }, options);
  if (opts.json !== undefined) {
    opts.method = opts.method || 'POST';
    opts.headers = { 'Content-Type': 'application/json', Accept: 'application/json' };
    opts.body = JSON.stringify(opts.json);
    delete opts.json;
  }
  const token = apiToken();
  if (token) opts.headers = { ...opts.headers, Authorization: `Bearer ${token}` };
  let resp;
  for (let attempt = 0; ; attempt += 1) {
    try {
      resp = await fetch(path, opts);
    } catch (err) {
      onConnection(false);
      throw err;
    }
    onConnection(true);
    const wait = Number(resp.headers.get('Retry-After'));
    if (resp.status !== 503 || !(wait >= 0) || attempt >= BUSY_RETRIES) break;
    await sleep(Math.min(wait, 30) * 1000);
  }
  const text = await resp.text();
  let body = null;
  if (text) {
    try {
      body = JSON.parse(text);
    } catch (_) {
      body = text;
    }
  }
  if (resp.status === 401) onAuthNeeded(detailText(body));
  return { ok: resp.ok, status: resp.status, body };
}

/** A readable line from an error body ({"detail": ...}). */
export function detailText(body) {
  if (!body) return 'no details';
  if (typeof body === 'string') return body.slice(0, 300);
  if (typeof body.detail === 'string') return body.detail;
  if (Array.isArray(body.detail)) {
    return body.detail.map((d) => `${(d.loc || []).join('.')}: ${d.msg}`).join('; ');
  }
  return JSON.stringify(body).slice(0, 300);
}

// ------------------------------------------------------------------ vocabulary

/* The vocabulary and field rules, read once from the server (GET /api/meta) before any
 * other module runs (top-level await), so the frontend spells no status, strategy, model
 * kind or bound of its own. Retries every second while the server is unreachable. */
async function loadMeta() {
  for (;;) {
    try {
      const r = await api('/api/meta');
      if (r.ok) return r.body;
    } catch (_) {
      /* the server is not up yet: try again */
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

/** {statuses: [{name, finished}], memory_categories, model_kinds, model_kind_table, strategies, strategy_table,
 *  policies, sweep_axes, presets, series_metrics, chart_names, max_sweep_size, spec_schema, ...} */
export const META = await loadMeta();

/** Status names by upper-case member name: STATUS.SUCCEEDED, STATUS.RUNNING, ... */
export const STATUS = Object.freeze(Object.fromEntries(META.statuses.map((s) => [s.name.toUpperCase(), s.name])));
/** Every status, in lifecycle order. */
export const STATUSES = META.statuses.map((s) => s.name);
/** Statuses after which an experiment never changes again. */
export const TERMINAL = new Set(META.statuses.filter((s) => s.finished).map((s) => s.name));
/** Every model kind's name, by rank. */
export const MODEL_KINDS = META.model_kinds;
/** The model-kind table (ckptlab/spec/model_kinds.py) by name: summary, label, example, fields, ... */
export const MODEL_KIND = new Map(META.model_kind_table.map((k) => [k.name, k]));
/** The kind of a model that names none. */
export const DEFAULT_KIND = META.model_kind_table.find((k) => k.default).name;
export const STRATEGIES = META.strategies;
/** The strategy table (ckptlab/strategies.py) by name: summary, label, fields, recomputes, ... */
export const STRATEGY = new Map(META.strategy_table.map((s) => [s.name, s]));
/** The strategy every comparison is made against (keep every activation). */
export const BASELINE = META.strategy_table.find((s) => s.baseline).name;
/** Sweep axis names by path: [short name, one value, several values]. */
export const AXIS_NAMES = META.sweep_axes;

/** "checkpoint.preserve_rng_state" -> "rng" (the server's short name, else the last part). */
export function shortName(path) {
  return AXIS_NAMES[path] ? AXIS_NAMES[path][0] : path.split('.').pop();
}

/** An axis value as the pages show it: on/off, a dash for none, JSON for objects. */
export function valueText(v) {
  if (v === true) return 'on';
  if (v === false) return 'off';
  if (v === null || v === undefined) return '—';
  return typeof v === 'object' ? JSON.stringify(v) : String(v);
}

/**
 * Make a <select>'s options the server's `names`: options already described in the page
 * are kept (in the server's order), ones the server does not know go, new names are added.
 */
export function syncOptions(select, names) {
  const known = new Map([...select.options].map((o) => [o.value, o]));
  const selected = select.value;
  select.replaceChildren(...names.map((n) => known.get(n) || el('option', { value: n }, n)));
  if (names.includes(selected)) select.value = selected;
}

// ------------------------------------------------------------------ hash routes

/** "#/sweeps/3?budget=2GiB" -> {path: "/sweeps/3", params: URLSearchParams} */
export function parseHash(hash = location.hash) {
  const h = hash.replace(/^#/, '') || '/';
  const q = h.indexOf('?');
  const path = (q < 0 ? h : h.slice(0, q)) || '/';
  const params = new URLSearchParams(q < 0 ? '' : h.slice(q + 1));
  return { path, params };
}

/** Replace the hash's query (no history entry, no hashchange): shareable view state. */
export function setHashParams(values) {
  const { path, params } = parseHash();
  for (const [k, v] of Object.entries(values)) {
    if (v === null || v === undefined || v === '') params.delete(k);
    else params.set(k, String(v));
  }
  const qs = params.toString();
  const hash = `#${path}${qs ? `?${qs}` : ''}`;
  if (hash !== location.hash) history.replaceState(null, '', hash);
}

// ------------------------------------------------------------------ misc

/** Runs `fn` at most once per `ms`, trailing call included. */
export function throttle(fn, ms) {
  let last = 0;
  let timer = null;
  return function throttled() {
    const wait = last + ms - Date.now();
    if (wait <= 0) {
      last = Date.now();
      fn();
    } else if (!timer) {
      timer = setTimeout(() => {
        timer = null;
        last = Date.now();
        fn();
      }, wait);
    }
  };
}

export function debounce(fn, ms) {
  let timer = null;
  const d = (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
  d.cancel = () => clearTimeout(timer);
  return d;
}

let plotlyPromise = null;
/** Loads /static/plotly.min.js once, on first need (the list view never waits for it). */
export function loadPlotly() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!plotlyPromise) {
    const meta = document.querySelector('meta[name="ckptlab-plotly"]');
    const src = meta ? meta.content : '/static/plotly.min.js';
    plotlyPromise = new Promise((resolve, reject) => {
      const s = document.createElement('script');
      s.src = src;
      s.async = true;
      s.onload = () => resolve(window.Plotly);
      s.onerror = () => {
        plotlyPromise = null;
        reject(new Error(`${src} did not load`));
      };
      document.head.append(s);
    });
  }
  return plotlyPromise;
}
