/* The experiments list (#/?status=&model_kind=&strategy=&sort=&offset=) and the recent
 * sweeps with their progress. Rows of unfinished work update live from the API's event
 * streams (a few at a time: browsers allow ~6 connections per host); a cheap poll of the
 * listing finds new experiments and covers whatever no stream watches. */

import {
  $, META, STATUS, STATUSES, TERMINAL, api, debounce, el, flagLabel, fmtAgo, fmtBytes, fmtDate, fmtInt, fmtMs, gradBadge,
  modelLabel, parseHash, setHashParams, shortName, statusBadge, strategyLabel, valueText,
} from './util.js';
import { LiveStream } from './live.js';

const PAGE = 100;
const MAX_STREAMS = 3;
const POLL_MS = 3000;
const POLL_COVERED_MS = 8000;
/** Sort keys done in the browser (the API sorts by id, dates, status, kind, strategy, sweep). */
const CLIENT_SORTS = {
  peak: (e) => num(e.summary && e.summary.peak_allocated_bytes),
  activation: (e) => num(e.summary && e.summary.activation_bytes),
  time: (e) => num(e.summary && e.summary.step_time_ms),
};
const FILTERS = ['status', 'model_kind', 'strategy', 'sort', 'offset'];

let active = false;
let pollTimer = null;
let lastKey = null;
let lastSweepsKey = null;
let rows = [];
let refreshSeq = 0;
const streams = new Map(); // url -> LiveStream

function num(v) {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

function state() {
  const { params } = parseHash();
  const s = {};
  for (const k of FILTERS) s[k] = params.get(k) || '';
  s.offset = Math.max(0, parseInt(s.offset, 10) || 0);
  return s;
}

function query(s) {
  // per_step=false: the rows show figures, never the per-step lists, which grow with each
  // run's timed steps (a 1,000-step run's are ~76 KB of its ~79 KB summary).
  const q = new URLSearchParams({ limit: String(PAGE), per_step: 'false' });
  for (const k of ['status', 'model_kind', 'strategy']) if (s[k]) q.set(k, s[k]);
  const key = s.sort.replace(/^-/, '');
  if (s.sort && !(key in CLIENT_SORTS)) q.set('sort', s.sort);
  if (s.offset) q.set('offset', String(s.offset));
  return q.toString();
}

// ------------------------------------------------------------------ rendering

function bytesCell(v) {
  return el('td', { class: 'num', title: num(v) !== null ? `${fmtInt(v)} bytes` : null }, fmtBytes(v));
}

function experimentRow(exp) {
  const s = exp.summary || {};
  const spec = exp.spec || {};
  const href = `#/experiments/${exp.id}`;
  const tr = el('tr', { dataset: { id: exp.id, status: exp.status }, class: 'clickable' },
    el('td', { class: 'num' }, el('a', { href }, String(exp.id))),
    el('td', { class: 'wrap' }, modelLabel(spec)),
    el('td', { class: 'wrap' }, strategyLabel(spec)),
    el('td', null, flagLabel(spec, 'use_reentrant')),
    el('td', null, flagLabel(spec, 'preserve_rng_state')),
    el('td', null, spec.amp || '—'),
    el('td', { class: 'num' }, fmtInt(spec.batch_size)),
    el('td', { class: 'status' }, statusBadge(exp.status)),
    bytesCell(s.activation_bytes),
    bytesCell(s.peak_allocated_bytes),
    el('td', { class: 'num' }, fmtMs(s.step_time_ms)),
    el('td', { class: 'wrap' }, exp.status === STATUS.SUCCEEDED ? gradBadge(s.gradients_match ?? null, s.grad_max_abs_diff, s.gradient_verdict) : ''),
    el('td', null, exp.sweep_id ? el('a', { href: `#/sweeps/${exp.sweep_id}` }, `#${exp.sweep_id}`) : ''),
    el('td', { title: fmtDate(exp.created_at), class: 'muted' }, fmtAgo(exp.created_at)),
  );
  return tr;
}

function sortRows(data, sort) {
  const key = sort.replace(/^-/, '');
  if (!(key in CLIENT_SORTS)) return data;
  const f = CLIENT_SORTS[key];
  const dir = sort.startsWith('-') ? -1 : 1;
  return data.slice().sort((a, b) => {
    const x = f(a);
    const y = f(b);
    if (x === null && y === null) return b.id - a.id;
    if (x === null) return 1; // unknowns last either way
    if (y === null) return -1;
    return dir * (x - y) || b.id - a.id;
  });
}

function renderExperiments(page, s) {
  rows = page.data || [];
  const sorted = sortRows(rows, s.sort);
  $('experiments').tBodies[0].replaceChildren(...sorted.map(experimentRow));
  const count = page.count ?? rows.length;
  const filtered = s.status || s.model_kind || s.strategy;
  $('experiments-empty').hidden = rows.length > 0;
  $('experiments-empty').replaceChildren(
    ...(filtered ? ['No experiment matches these filters.'] : ['No experiments yet. ', el('a', { href: '#/new' }, 'Submit one'), '.']),
  );
  $('experiments-count').textContent = `${fmtInt(count)} ${filtered ? 'matching' : 'in all'}`;
  const from = rows.length ? s.offset + 1 : 0;
  $('page-info').textContent = count > PAGE ? `${fmtInt(from)}–${fmtInt(s.offset + rows.length)} of ${fmtInt(count)}` : '';
  $('page-prev').hidden = s.offset === 0;
  $('page-next').hidden = s.offset + rows.length >= count;
  markSortHeaders(s.sort);
}

function markSortHeaders(sort) {
  const key = sort.replace(/^-/, '') || 'id';
  const desc = sort ? sort.startsWith('-') : true;
  for (const th of $('experiments').tHead.querySelectorAll('th[data-sort]')) {
    const on = th.dataset.sort === key;
    th.setAttribute('aria-sort', on ? (desc ? 'descending' : 'ascending') : 'none');
  }
}

function progressCell(p, cancelled) {
  const frac = p.total ? p.finished / p.total : 0;
  const notOk = p.finished - (p.counts.succeeded || 0);
  return el('td', { class: 'progress-col' },
    el('div', { class: 'mini-progress' },
      el('div', { class: 'progress-bar small', role: 'progressbar', 'aria-valuemin': 0, 'aria-valuemax': p.total, 'aria-valuenow': p.finished },
        el('span', { style: `width:${(100 * frac).toFixed(1)}%` })),
      el('span', { class: 'progress-text' }, `${p.finished} of ${p.total}`),
      cancelled ? el('span', { class: 'badge status-cancelled' }, STATUS.CANCELLED)
        : p.counts.running ? el('span', { class: 'badge status-running' }, STATUS.RUNNING)
          : notOk > 0 ? el('span', { class: 'badge status-failed' }, `${notOk} not succeeded`) : ''),
  );
}

function axesText(axes) {
  return Object.entries(axes || {})
    .map(([p, vs]) => `${shortName(p)} ${vs.map(valueText).join(',')}`)
    .join(' × ');
}

function renderSweeps(page) {
  const data = page.data || [];
  $('sweeps-card').hidden = data.length === 0;
  $('sweeps-count').textContent = page.count > data.length ? `newest ${data.length} of ${page.count}` : '';
  $('sweeps').tBodies[0].replaceChildren(...data.map((sw) => el('tr', { dataset: { sweep: sw.id }, class: 'clickable' },
    el('td', { class: 'num' }, el('a', { href: `#/sweeps/${sw.id}` }, String(sw.id))),
    el('td', { class: 'wrap' }, el('a', { href: `#/sweeps/${sw.id}` }, sw.name), ' · ', el('a', { href: `#/timeline?sweep=${sw.id}`, class: 'small' }, 'timelines')),
    el('td', { class: 'muted wrap' }, axesText(sw.axes)),
    progressCell(sw.progress, sw.cancelled),
    el('td', { class: 'muted', title: fmtDate(sw.created_at) }, fmtAgo(sw.created_at)),
  )));
  return data;
}

// ------------------------------------------------------------------ live

const refreshSoon = debounce(() => refresh(), 250);

function onStatus(data) {
  const tr = $('experiments').querySelector(`tr[data-id="${data.experiment_id}"]`);
  if (tr && tr.dataset.status !== data.status) {
    tr.dataset.status = data.status;
    tr.querySelector('td.status').replaceChildren(statusBadge(data.status));
  }
  if (TERMINAL.has(data.status) || data.status === STATUS.RUNNING) refreshSoon();
}

function onProgress(sweepId, p) {
  const tr = $('sweeps').querySelector(`tr[data-sweep="${sweepId}"]`);
  if (!tr) return;
  tr.children[3].replaceWith(progressCell(p, false));
}

/** Opens streams for the unfinished work shown (sweeps first), closes the others. */
function syncStreams(sweeps) {
  const wanted = new Map();
  for (const sw of sweeps) {
    if (wanted.size >= MAX_STREAMS) break;
    if (sw.progress.finished < sw.progress.total) {
      wanted.set(`/api/sweeps/${sw.id}/events?steps=false`, { progress: (p) => onProgress(sw.id, p), status: onStatus });
    }
  }
  const covered = new Set(sweeps.filter((sw) => wanted.has(`/api/sweeps/${sw.id}/events?steps=false`)).map((sw) => sw.id));
  let uncovered = 0;
  const pending = rows.filter((e) => !TERMINAL.has(e.status) && !(e.sweep_id && covered.has(e.sweep_id)));
  pending.sort((a, b) => (a.status === STATUS.RUNNING ? 0 : 1) - (b.status === STATUS.RUNNING ? 0 : 1) || a.id - b.id);
  for (const exp of pending) {
    if (wanted.size < MAX_STREAMS) wanted.set(`/api/experiments/${exp.id}/events?steps=false`, { status: onStatus });
    else uncovered += 1;
  }
  for (const [url, s] of streams) {
    if (!wanted.has(url) || s.closed) {
      s.close();
      streams.delete(url);
    }
  }
  for (const [url, handlers] of wanted) {
    if (!streams.has(url) && document.visibilityState === 'visible') streams.set(url, new LiveStream(url, handlers));
  }
  $('live-indicator').hidden = streams.size === 0;
  return uncovered === 0;
}

function closeStreams() {
  for (const s of streams.values()) s.close();
  streams.clear();
  $('live-indicator').hidden = true;
}

/** Load and draw the lists; of overlapping calls only the latest draws (a slow answer to an
 * earlier filter never replaces a newer one), and it schedules the next poll. */
async function refresh() {
  if (!active) return;
  clearTimeout(pollTimer);
  const seq = ++refreshSeq;
  const s = state();
  let covered = false;
  try {
    const [er, sr] = await Promise.all([api(`/api/experiments?${query(s)}`), api('/api/sweeps?limit=8')]);
    if (!active || seq !== refreshSeq) return;
    if (er.ok && er.body) {
      const key = JSON.stringify([er.body, s]);
      if (key !== lastKey) {
        lastKey = key;
        renderExperiments(er.body, s);
      }
    }
    let sweeps = [];
    if (sr.ok && sr.body) {
      const key = JSON.stringify(sr.body);
      if (key !== lastSweepsKey) {
        lastSweepsKey = key;
        renderSweeps(sr.body);
      }
      sweeps = sr.body.data || [];
    }
    covered = syncStreams(sweeps);
  } catch (_) {
    // connection banner shown by api(); keep polling
  }
  if (active && seq === refreshSeq && document.visibilityState === 'visible') {
    pollTimer = setTimeout(refresh, covered ? POLL_COVERED_MS : POLL_MS);
  }
}

// ------------------------------------------------------------------ view

function syncFilterInputs(s) {
  $('filter-status').value = s.status;
  $('filter-model').value = s.model_kind;
  $('filter-strategy').value = s.strategy;
  $('filter-sort').value = s.sort;
}

export function initList() {
  // The filters' choices come from the server's vocabulary (GET /api/meta).
  for (const [id, names] of [['filter-status', STATUSES], ['filter-model', META.model_kinds], ['filter-strategy', META.strategies]]) {
    $(id).append(...names.map((n) => el('option', { value: n }, n)));
  }
  $('filters').addEventListener('change', (e) => {
    setHashParams({ [e.target.name]: e.target.value, offset: null });
    lastKey = null;
    refresh();
  });
  $('filters').addEventListener('submit', (e) => e.preventDefault());
  $('filters-clear').addEventListener('click', () => {
    setHashParams({ status: null, model_kind: null, strategy: null, sort: null, offset: null });
    syncFilterInputs(state());
    lastKey = null;
    refresh();
  });
  const sortBy = (th) => {
    const s = state();
    const key = th.dataset.sort;
    const cur = s.sort.replace(/^-/, '') || 'id';
    const curDesc = s.sort ? s.sort.startsWith('-') : true;
    // The first click on a metric sorts ascending (smallest memory, fastest); on the rest, descending.
    let next = key in CLIENT_SORTS ? key : `-${key}`;
    if (key === cur) next = curDesc ? key : `-${key}`;
    if (next === '-id') next = '';
    setHashParams({ sort: next, offset: null });
    syncFilterInputs(state());
    lastKey = null;
    refresh();
  };
  for (const th of $('experiments').tHead.querySelectorAll('th[data-sort]')) th.tabIndex = 0;
  $('experiments').tHead.addEventListener('click', (e) => {
    const th = e.target.closest('th[data-sort]');
    if (th) sortBy(th);
  });
  $('experiments').tHead.addEventListener('keydown', (e) => {
    const th = e.target.closest('th[data-sort]');
    if (th && (e.key === 'Enter' || e.key === ' ')) {
      e.preventDefault();
      sortBy(th);
    }
  });
  $('experiments').tBodies[0].addEventListener('click', (e) => {
    if (e.target.closest('a')) return;
    const tr = e.target.closest('tr[data-id]');
    if (tr) location.hash = `#/experiments/${tr.dataset.id}`;
  });
  $('sweeps').tBodies[0].addEventListener('click', (e) => {
    if (e.target.closest('a')) return;
    const tr = e.target.closest('tr[data-sweep]');
    if (tr) location.hash = `#/sweeps/${tr.dataset.sweep}`;
  });
  const page = (delta) => {
    const s = state();
    setHashParams({ offset: Math.max(0, s.offset + delta * PAGE) || null });
    lastKey = null;
    refresh();
  };
  $('page-prev').addEventListener('click', () => page(-1));
  $('page-next').addEventListener('click', () => page(1));
  document.addEventListener('visibilitychange', () => {
    if (!active) return;
    if (document.visibilityState === 'visible') refresh();
    else {
      clearTimeout(pollTimer);
      closeStreams();
    }
  });
}

export function showList() {
  active = true;
  lastKey = null;
  lastSweepsKey = null;
  syncFilterInputs(state());
  document.title = 'ckptlab · experiments';
  refresh();
}

export function hideList() {
  active = false;
  clearTimeout(pollTimer);
  refreshSoon.cancel();
  closeStreams();
}
