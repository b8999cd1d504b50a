/* One sweep (#/sweeps/<id>?budget=&overhead=&sort=): progress live from the sweep's event
 * stream, the API's four charts (updated as runs finish), a sortable table of the runs and
 * the recommendation for a memory budget. */

import {
  $, STATUS, TERMINAL, api, debounce, detailText, el, fmtBytes, fmtDiff, fmtInt, fmtMs, fmtPct, gradBadge, loadPlotly, parseHash, setHashParams, statusBadge,
} from './util.js';
import { SEPARATE_RUNS, markPicks, overheadParts, pickLine, rankOf } from './sweep_picks.js';
import { LiveStream, liveBadge } from './live.js';
import { shortName, valueText, num, renderProgress, renderHeader } from './sweep_header.js';
import { PLOT_CONFIG, sweepFigure } from './charts.js';
import { drawFitted } from './chart_fit.js';
import { parseBytes } from './budget.js';

export const CHARTS = [
  ['memory_vs_segments', 'sweep-chart-memory'],
  ['time_vs_segments', 'sweep-chart-time'],
  ['pareto', 'sweep-chart-pareto'],
  ['correctness', 'sweep-chart-correctness'],
  ['memory_per_rank', 'sweep-chart-ranks'],
];

let cur = null; // {id, sweep, results, stream, poll, loading, again}

// ------------------------------------------------------------------ table

function columns(axes) {
  const cols = [
    { key: 'id', label: '#', num: true, get: (r) => r.experiment_id },
    { key: 'role', label: 'role', get: (r) => r.role },
  ];
  for (const p of axes) cols.push({ key: `axis:${p}`, label: shortName(p), get: (r) => r.values[p], axis: true });
  cols.push(
    { key: 'status', label: 'status', get: (r) => r.status },
    { key: 'activation', label: 'activations', num: true, bytes: true, get: (r) => r.metrics.activation_bytes },
    { key: 'saving', label: 'saved', num: true, pct: true, get: (r) => r.metrics.activation_saving_pct },
    { key: 'peak', label: 'peak', num: true, bytes: true, get: (r) => r.metrics.peak_allocated_bytes },
    { key: 'recompute', label: 'recompute peak', num: true, bytes: true, get: (r) => r.metrics.recompute_peak_bytes },
    { key: 'time', label: 'step time (own run)', title: `each run's own median: ${SEPARATE_RUNS}`, num: true, get: (r) => r.metrics.step_time_ms },
    // Sorted by the server's ranking (the recommendation's order), shown as the overhead.
    { key: 'overhead', label: 'overhead (95% CI)', title: 'against its baseline, paired in one process where timed so; sorts by the recommendation\'s ranking', num: true, get: (r) => rankOf(cur.rec && cur.rec.server).get(r.experiment_id) },
    { key: 'grad', label: 'gradients', num: false, get: (r) => r.metrics.grad_max_abs_diff },
  );
  return cols;
}

function compare(a, b) {
  if (a === b) return 0;
  if (a === null || a === undefined) return 1;
  if (b === null || b === undefined) return -1;
  if (typeof a === 'number' && typeof b === 'number') return a - b;
  return String(a).localeCompare(String(b), 'en', { numeric: true });
}

function renderTable() {
  const c = cur;
  const res = c.results;
  if (!res) return;
  const { params } = parseHash();
  const sort = params.get('sort') || 'id';
  const desc = sort.startsWith('-');
  const key = sort.replace(/^-/, '');
  const cols = columns(res.axes);
  const col = cols.find((x) => x.key === key) || cols[0];
  const rows = res.data.slice().sort((a, b) => {
    const va = col.get(a);
    const vb = col.get(b);
    if ((va === null || va === undefined) !== (vb === null || vb === undefined)) return va === null || va === undefined ? 1 : -1;
    return (desc ? -1 : 1) * compare(va, vb) || a.experiment_id - b.experiment_id;
  });
  const table = $('sweep-runs');
  table.tHead.replaceChildren(el('tr', null, cols.map((x) => el('th', {
    scope: 'col', class: x.num ? 'num' : null, dataset: { sort: x.key }, title: x.title || null,
    'aria-sort': x.key === col.key ? (desc ? 'descending' : 'ascending') : 'none', tabindex: 0,
  }, x.label)), el('th', { scope: 'col' }, 'budget')));
  const rec = c.rec || {};
  table.tBodies[0].replaceChildren(...rows.map((r) => {
    const m = r.metrics;
    const fits = rec.fitting && rec.fitting.has(r.experiment_id) ? true : rec.over && rec.over.has(r.experiment_id) ? false : null;
    const classes = ['clickable'];
    if (rec.recommended && rec.recommended.experiment_id === r.experiment_id) classes.push('recommended');
    if (rec.smallest && rec.smallest.experiment_id === r.experiment_id) classes.push('smallest');
    const rank = rankOf(rec.server).get(r.experiment_id);
    if (fits === false) classes.push('over-budget');
    if (fits === true) classes.push('fits');
    if (r.role === 'baseline') classes.push('baseline');
    const cells = cols.map((x) => {
      const v = x.get(r);
      if (x.key === 'id') return el('td', { class: 'num' }, el('a', { href: `#/experiments/${r.experiment_id}` }, String(v)));
      if (x.key === 'status') return el('td', { class: 'status' }, statusBadge(v));
      if (x.key === 'role') return el('td', null, el('span', { class: `role role-${v}` }, v));
      if (x.key === 'grad') {
        return el('td', null, r.status === STATUS.SUCCEEDED ? gradBadge(r.gradients_match, m.grad_max_abs_diff) : '',
          r.status === STATUS.SUCCEEDED && num(v) ? el('span', { class: 'muted small' }, ` ${fmtDiff(v)}`) : '');
      }
      if (x.bytes) return el('td', { class: 'num', title: num(v) !== null ? `${fmtInt(v)} bytes` : null }, fmtBytes(v));
      if (x.key === 'overhead') { // paired overhead and its CI; a drift for a baseline's second run
        const o = overheadParts(r);
        const muted = r.role === 'baseline' || !r.overhead || !r.overhead.measurable ? ' muted' : '';
        return el('td', { class: `num wrap${muted}`, title: o.title }, o.main, o.ci ? el('span', { class: 'small muted ci' }, ` ${o.ci}`) : '');
      }
      if (x.pct) return el('td', { class: 'num' }, r.role === 'baseline' ? '—' : fmtPct(v));
      if (x.key === 'time') return el('td', { class: 'num muted', title: `${fmtMs(v)}: ${SEPARATE_RUNS}` }, fmtMs(v));
      return el('td', null, valueText(v));
    });
    const tags = [];
    if (classes.includes('recommended')) tags.push(el('span', { class: 'tag tag-rec' }, '★ recommended'));
    if (classes.includes('smallest')) tags.push(el('span', { class: 'tag tag-small', title: `smallest peak whose overhead against its baseline is at most ${fmtPct(c.overhead)}` }, `smallest ≤${fmtPct(c.overhead)}`));
    const budgetCell = el('td', { class: 'budget-cell wrap' },
      fits === true ? el('span', { class: 'fit yes' }, 'fits') : fits === false ? el('span', { class: 'fit no' }, 'over') : '', ...tags);
    return el('tr', { dataset: { id: r.experiment_id, rank: rank ?? '' }, class: classes.join(' '), title: r.label }, cells, budgetCell);
  }));
}

// ------------------------------------------------------------------ recommendation

function readInputs() {
  const raw = $('budget').value.trim();
  const budget = raw ? parseBytes(raw) : null;
  const overheadRaw = $('overhead').value.trim();
  const overhead = overheadRaw === '' ? null : Number(overheadRaw);
  return { raw, budget, overhead: Number.isFinite(overhead) ? overhead : null };
}

let recTicket = 0;

/** The card's state from the server's recommendation (GET /api/sweeps/{id}/recommendation),
 * the only recommender: only real savings count, time differences inside the 95% CI are
 * ties, and it says why. `over`: measured runs whose peak is above the budget. */
function recState(server, rows, budget) {
  const over = new Set(budget === null ? [] : rows
    .filter((r) => num(r.metrics.peak_allocated_bytes) !== null && r.metrics.peak_allocated_bytes > budget)
    .map((r) => r.experiment_id));
  return {
    recommended: server && server.experiment_id ? rows.find((r) => r.experiment_id === server.experiment_id) || null : null,
    smallest: server && server.smallest_within ? rows.find((r) => r.experiment_id === server.smallest_within.experiment_id) || null : null,
    fitting: server && server.fitting ? new Set(server.fitting) : null,
    over,
    server,
  };
}

async function renderRecommendation() {
  const c = cur;
  const { raw, budget, overhead } = readInputs();
  c.overhead = overhead;
  const hint = $('budget');
  hint.toggleAttribute('aria-invalid', Boolean(raw) && budget === null);
  const budgetHint = $('budget-hint');
  budgetHint.textContent = !raw ? 'peak allocated must fit' : budget === null ? 'not a size: try 24 GiB, 512 MiB or a number of bytes' : `= ${fmtInt(budget)} bytes (${fmtBytes(budget)})`;
  budgetHint.classList.toggle('bad', Boolean(raw) && budget === null);
  const ticket = ++recTicket;
  const params = new URLSearchParams();
  if (budget !== null) params.set('budget_bytes', String(budget));
  if (overhead !== null && overhead >= 0) params.set('within_pct', String(overhead));
  const q = params.toString();
  const r = await api(`/api/sweeps/${c.id}/recommendation${q ? `?${q}` : ''}`).catch(() => null);
  if (ticket !== recTicket || c !== cur) return;
  const rows = (c.results && c.results.data) || [];
  const server = r && r.ok ? r.body : null;
  const rec = recState(server, rows, budget);
  c.rec = rec;
  const recBox = $('pick-recommended');
  const smallBox = $('pick-smallest');
  $('recommend-reason').replaceChildren(...(server ? [el('strong', null, 'Why: '), `${server.reason}.`] : []));
  const differ = server ? server.excluded.filter((e) => e.why === 'its gradients differ').length : 0;
  if (!server || !server.considered.length) {
    recBox.replaceChildren(el('span', { class: 'pick-title' }, 'Recommended'), el('span', { class: 'muted' }, 'appears when runs succeed'));
  } else if (!rec.recommended) {
    recBox.replaceChildren(el('span', { class: 'pick-title bad' }, budget === null ? 'No recommendation' : `Nothing fits in ${fmtBytes(budget)}`),
      el('span', { class: 'muted' }, server.reason));
  } else {
    const title = budget === null ? '★ Recommended (no budget: the lowest real peak)' : `★ Recommended for ${fmtBytes(budget)}`;
    const fitNote = rec.fitting ? `${rec.fitting.size} of ${server.considered.length} configurations fit` : '';
    recBox.replaceChildren(el('span', { class: 'pick-title' }, title), ...pickLine(rec.recommended, fitNote));
  }
  if (differ) {
    recBox.append(el('span', { class: 'pick-note warn' },
      `${differ} configuration${differ > 1 ? 's are' : ' is'} never recommended: gradients differ from the run without checkpointing.`));
  }
  recBox.dataset.id = rec.recommended ? rec.recommended.experiment_id : '';
  const within = `within ${fmtPct(overhead)} overhead of its baseline`;
  if (overhead === null || !server || !server.considered.length) smallBox.replaceChildren();
  else if (!rec.smallest) {
    smallBox.replaceChildren(el('span', { class: 'pick-title' }, `Smallest peak ${within}`),
      el('span', { class: 'muted' }, `none: no ${rec.fitting ? 'fitting ' : ''}configuration's overhead estimate is at most ${fmtPct(overhead)}`));
  } else {
    smallBox.replaceChildren(el('span', { class: 'pick-title' }, `Smallest peak ${within}`), ...pickLine(rec.smallest));
  }
  smallBox.dataset.id = rec.smallest ? rec.smallest.experiment_id : '';
  renderTable();
  markCharts();
}

// ------------------------------------------------------------------ data

async function drawCharts(figs) {
  const c = cur;
  try {
    await loadPlotly();
  } catch (err) {
    for (const [, id] of CHARTS) $(id).textContent = `Charts unavailable: ${err.message}.`;
    return;
  }
  if (c !== cur) return;
  await Promise.all(CHARTS.map(([name, id], i) => {
    const card = $(id).closest('section');
    if (card) card.hidden = Boolean(figs[i]?.layout?.meta?.empty); // a chart this sweep has no axis for
    if (!figs[i] || card?.hidden) return null;
    return drawFitted(id, sweepFigure(name, figs[i]), PLOT_CONFIG);
  }));
  if (c === cur) markCharts();
}

/** The card's picks marked on the charts (their points carry experiment ids). */
function markCharts() {
  const rec = cur && cur.rec;
  markPicks(CHARTS.map(([, id]) => id), {
    recommended: rec && rec.recommended ? rec.recommended.experiment_id : null,
    smallest: rec && rec.smallest ? rec.smallest.experiment_id : null,
  });
}

/** Re-reads the sweep, its results and its charts (coalesced: one load at a time). */
async function refresh() {
  const c = cur;
  if (!c) return;
  if (c.loading) {
    c.again = true;
    return;
  }
  c.loading = true;
  try {
    const [sr, rr, ...charts] = await Promise.all([
      api(`/api/sweeps/${c.id}?per_step=false`),
      api(`/api/sweeps/${c.id}/results`),
      ...CHARTS.map(([name]) => api(`/api/sweeps/${c.id}/charts/${name}`)),
    ]);
    if (c !== cur) return;
    if (sr.status === 404) {
      $('sweep-notfound').textContent = `There is no sweep ${c.id}.`;
      $('sweep-notfound').hidden = false;
      return;
    }
    if (sr.ok) {
      c.sweep = sr.body;
      renderHeader(c.sweep);
    }
    if (rr.ok) {
      c.results = rr.body;
      renderRecommendation();
    }
    await drawCharts(charts.map((r) => (r.ok ? r.body : null)));
  } catch (_) {
    // banner shown by api()
  } finally {
    c.loading = false;
    if (c.again && c === cur) {
      c.again = false;
      refresh();
    }
  }
}

function startStream() {
  const c = cur;
  const soon = debounce(() => { if (c === cur) refresh(); }, 300);
  c.stream = new LiveStream(`/api/sweeps/${c.id}/events?steps=false`, {
    progress(p) {
      if (c !== cur) return;
      renderProgress(p, c.sweep && c.sweep.cancelled);
    },
    status(d) {
      if (TERMINAL.has(d.status)) soon();
    },
    end() {
      if (c !== cur) return;
      $('sweep-live').hidden = true;
      soon();
    },
  }, { onState: liveBadge('sweep-live', () => startPolling()) });
  $('sweep-live').hidden = false;
}

function startPolling() {
  const c = cur;
  if (!c) return;
  $('sweep-live').hidden = true;
  let finished = -1;
  const tick = async () => {
    if (c !== cur) return;
    try {
      const r = await api(`/api/sweeps/${c.id}?per_step=false`);
      if (c !== cur) return;
      if (r.ok) {
        renderProgress(r.body.progress, r.body.cancelled);
        if (r.body.progress.finished !== finished) {
          finished = r.body.progress.finished;
          await refresh();
        }
        if (r.body.progress.finished >= r.body.progress.total) return;
      }
    } catch (_) { /* banner */ }
    if (c === cur) c.poll = setTimeout(tick, 2000);
  };
  tick();
}

function reset(id) {
  $('sweep-title').textContent = `Sweep #${id}`;
  $('sweep-notfound').hidden = true;
  $('sweep-progress-text').textContent = '—';
  $('sweep-counts').textContent = '';
  $('sweep-desc').replaceChildren();
  $('sweep-downloads').replaceChildren();
  $('sweep-cancel').hidden = true;
  $('sweep-live').hidden = true;
  $('sweep-invalid').hidden = true;
  $('sweep-runs').tHead.replaceChildren();
  $('sweep-runs').tBodies[0].replaceChildren();
  $('pick-recommended').replaceChildren();
  $('pick-smallest').replaceChildren();
  if (window.Plotly) for (const [, chart] of CHARTS) window.Plotly.purge(chart);
}

/**
 * @param {number} id
 * @param {URLSearchParams} params budget, overhead, sort
 * @param {object|null} seed the POST /api/sweeps answer, shown at once when we just made it
 */
export async function showSweep(id, params, seed) {
  hideSweep();
  cur = { id, sweep: null, results: null, stream: null, poll: null, loading: false, again: false, rec: null, overhead: null };
  const c = cur;
  reset(id);
  loadPlotly().catch(() => {});
  $('budget').value = params.get('budget') || '';
  $('overhead').value = params.has('overhead') ? params.get('overhead') : '20';
  const live = () => {
    if (typeof EventSource === 'function') startStream();
    else startPolling();
  };
  let started = false;
  if (seed && seed.id === id) {
    // Just created: show it at once ("0 of N") and follow it from the start.
    c.sweep = seed;
    renderHeader(seed);
    if (seed.progress.finished < seed.progress.total) {
      live();
      started = true;
    }
  }
  await refresh();
  if (c !== cur || !c.sweep || started) return;
  const p = c.sweep.progress;
  if (p.finished < p.total) live();
}

export function hideSweep() {
  if (!cur) return;
  if (cur.stream) cur.stream.close();
  clearTimeout(cur.poll);
  cur = null;
}

export function initSweep() {
  const onInputs = debounce(() => {
    if (!cur) return;
    setHashParams({ budget: $('budget').value.trim() || null, overhead: $('overhead').value.trim() === '20' ? null : $('overhead').value.trim() });
    renderRecommendation();
  }, 120);
  $('budget').addEventListener('input', onInputs);
  $('overhead').addEventListener('input', onInputs);
  const sortBy = (th) => {
    const { params } = parseHash();
    const sort = params.get('sort') || 'id';
    const key = th.dataset.sort;
    const next = sort === key ? `-${key}` : key;
    setHashParams({ sort: next === 'id' ? null : next });
    renderTable();
  };
  $('sweep-runs').tHead.addEventListener('click', (e) => {
    const th = e.target.closest('th[data-sort]');
    if (th) sortBy(th);
  });
  $('sweep-runs').tHead.addEventListener('keydown', (e) => {
    const th = e.target.closest('th[data-sort]');
    if (th && (e.key === 'Enter' || e.key === ' ')) {
      e.preventDefault();
      sortBy(th);
    }
  });
  $('sweep-runs').tBodies[0].addEventListener('click', (e) => {
    if (e.target.closest('a')) return;
    const tr = e.target.closest('tr[data-id]');
    if (tr) location.hash = `#/experiments/${tr.dataset.id}`;
  });
  $('sweep-cancel').addEventListener('click', async () => {
    if (!cur) return;
    const c = cur;
    const left = c.sweep && c.sweep.progress ? c.sweep.progress.total - c.sweep.progress.finished : null;
    const what = left === null ? 'every unfinished run' : `the ${left} unfinished run${left === 1 ? '' : 's'}`;
    if (!window.confirm(`Cancel ${what} of sweep #${c.id}? Finished runs keep their results.`)) return;
    const b = $('sweep-cancel');
    b.disabled = true;
    try {
      const r = await api(`/api/sweeps/${c.id}/cancel`, { method: 'POST' });
      if (c !== cur) return;
      if (r.ok) {
        c.sweep = r.body;
        renderHeader(r.body);
      } else {
        $('sweep-notfound').textContent = `Cannot cancel: ${detailText(r.body)}`;
        $('sweep-notfound').hidden = false;
      }
    } finally {
      b.disabled = false;
    }
  });
}
