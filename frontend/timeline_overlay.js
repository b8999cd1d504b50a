/* Memory timelines of two or more runs on one axis (issue 34): #/timeline?ids=1,2,3, or
 * #/timeline?sweep=<id> for a sweep's runs that succeeded. Each run's live bytes over the
 * events of its peak step, a line per run, the phases aligned: x is an event's index within
 * its phase and each phase starts at the same x for every run (as wide as its longest run's),
 * so the forward, backward and optimizer of each run line up. Each run's peak is marked; a
 * table beside says what each line is and offers its events as JSON. */

import {
  $, COLORWAY, OKABE_ITO, STATUS, api, byteUnit, detailText, el, fmtBytes, fmtInt, loadPlotly, modelLabel, strategyLabel,
} from './util.js';
import { PLOT_CONFIG, baseLayout } from './charts.js';
import { drawFitted } from './chart_fit.js';
import { DOWNLOAD_POINTS, PHASE_COLORS, bandShapes, eventText, phaseAt, pointPlaces, sentence, spanOf } from './timeline.js';

/** Points of each run's timeline drawn (MinMaxLTTB on the server, each peak kept exact). */
const OVERLAY_POINTS = 1500;
/** Runs drawn at most: more lines than this cannot be told apart. */
const MAX_RUNS = 8;

let token = 0;

// ------------------------------------------------------------------ which runs

/** The runs the route names: `ids` in their order, or the runs of `sweep` that succeeded
 * (a baseline once, not its repeat), with the sweep's label of each. */
async function chooseRuns(params) {
  const sweep = Number(params.get('sweep'));
  if (Number.isInteger(sweep) && sweep > 0) {
    const r = await api(`/api/sweeps/${sweep}/results`);
    if (!r.ok) return { sweep, ids: [], labels: new Map(), error: `Sweep #${sweep}: ${detailText(r.body)}` };
    const rows = r.body.data.filter((row) => row.status === STATUS.SUCCEEDED && !row.repeat_of);
    return { sweep, ids: rows.map((row) => row.experiment_id), labels: new Map(rows.map((row) => [row.experiment_id, row.label])) };
  }
  const ids = (params.get('ids') || '').split(',').map((s) => Number(s.trim())).filter((n) => Number.isInteger(n) && n > 0);
  return { sweep: null, ids: [...new Set(ids)], labels: new Map() };
}

/** Each run's name in the legend: "#12 per_block"; runs whose strategies read the same are
 * told apart by their sweep label, or their model and batch. */
function runNames(runs, labels) {
  const base = runs.map((r) => strategyLabel(r.exp.spec));
  return runs.map((r, i) => {
    const same = base.filter((b) => b === base[i]).length > 1;
    const extra = labels.get(r.id) || `${modelLabel(r.exp.spec)} batch ${r.exp.spec.batch_size}`;
    return `#${r.id} ${base[i]}${same ? ` · ${extra}` : ''}`;
  });
}

// ------------------------------------------------------------------ the figure

/** The phases of all runs in order, each as wide as its longest run's, and where each starts. */
function phaseGrid(tls) {
  const order = [];
  const width = {};
  for (const tl of tls) {
    for (const s of tl.phases) {
      if (!order.includes(s.phase)) order.push(s.phase);
      width[s.phase] = Math.max(width[s.phase] || 0, s.end - s.start);
    }
  }
  const offset = {};
  let at = 0;
  for (const p of order) {
    offset[p] = at;
    at += width[p];
  }
  return { order, width, offset };
}

/** The x of event indices `ts` (ascending) of `tl` on the aligned axis. */
function alignedX(tl, ts, grid) {
  const spans = spanOf(ts, tl.phases);
  return ts.map((t, i) => (spans[i] ? grid.offset[spans[i].phase] + t - spans[i].start : t));
}

/** A run's line on the aligned axis: x, y (in units of `div`) and hover text per point, with
 * a gap where a phase ends, so that a line does not run on across the room a longer run's
 * phase leaves it. */
function alignedLine(tl, grid, div) {
  const spans = spanOf(tl.t_index, tl.phases);
  const places = pointPlaces(tl);
  const line = { x: [], y: [], customdata: [] };
  tl.t_index.forEach((t, i) => {
    if (i > 0 && spans[i] !== spans[i - 1]) {
      line.x.push(null);
      line.y.push(null);
      line.customdata.push(null);
    }
    line.x.push(spans[i] ? grid.offset[spans[i].phase] + t - spans[i].start : t);
    line.y.push(tl.live_bytes[i] / div);
    line.customdata.push([fmtBytes(tl.live_bytes[i]), t, eventText(tl, i, places[i])]);
  });
  return line;
}

/** Lines of live bytes, one per run, on the phase-aligned axis, each peak a diamond. SVG
 * traces: at most MAX_RUNS x OVERLAY_POINTS points. */
export function overlayFigure(runs) {
  const grid = phaseGrid(runs.map((r) => r.tl));
  const [div, unit] = byteUnit(Math.max(1, ...runs.map((r) => r.tl.peak_bytes)));
  const data = [];
  runs.forEach((run, k) => {
    const { tl, name } = run;
    const color = COLORWAY[k % COLORWAY.length];
    data.push({
      type: 'scatter', mode: 'lines', name, legendgroup: `run ${run.id}`, ...alignedLine(tl, grid, div),
      line: { color, width: 1.6, shape: 'hv' }, connectgaps: false,
      hovertemplate: `<b>%{customdata[0]}</b> after event %{customdata[1]}: %{customdata[2]}<extra>#${run.id}</extra>`,
      meta: { run: run.id },
    });
    const at = tl.t_index.indexOf(tl.peak_index);
    const places = at >= 0 ? pointPlaces(tl) : [];
    data.push({
      type: 'scatter', mode: 'markers', name: `${name}: peak`, legendgroup: `run ${run.id}`, showlegend: false,
      x: alignedX(tl, [tl.peak_index], grid), y: [tl.peak_bytes / div],
      marker: { symbol: 'diamond', size: 13, color, line: { color: OKABE_ITO.black, width: 1 } },
      customdata: [at >= 0 ? eventText(tl, at, places[at]) : phaseAt(tl, tl.peak_index)],
      hovertemplate: `<b>peak ${fmtBytes(tl.peak_bytes)}</b> at event ${tl.peak_index}: %{customdata}<extra>#${run.id}</extra>`,
      meta: { run: run.id, peak: true },
    });
  });
  const bands = grid.order.map((p) => ({
    x0: grid.offset[p] - 0.5, x1: grid.offset[p] + grid.width[p] - 0.5, name: p, color: PHASE_COLORS[p] || OKABE_ITO.grey, opacity: 0.1,
  }));
  const layout = baseLayout({
    height: 460,
    hovermode: 'closest',
    xaxis: {
      ...baseLayout().xaxis, tickmode: 'array', tickvals: grid.order.map((p) => grid.offset[p] + grid.width[p] / 2 - 0.5),
      ticktext: grid.order, title: { text: "event within its phase (each run's phases start together)" },
    },
    yaxis: { ...baseLayout().yaxis, title: { text: `live memory (${unit})` } },
    shapes: bandShapes(bands),
  });
  layout.legend.traceorder = 'normal';
  return { data, layout };
}

// ------------------------------------------------------------------ the page

function runsTable(runs) {
  const head = ['run', 'strategy', 'model', 'step', 'events', 'recomputed', 'peak', 'at', 'summary peak', ''];
  const num = new Set([3, 4, 5, 6, 8]);
  return el('table', { class: 'data', id: 'overlay-runs-table' },
    el('thead', null, el('tr', null, ...head.map((h, i) => el('th', { scope: 'col', class: num.has(i) ? 'num' : null }, h)))),
    el('tbody', null, ...runs.map(({ id, exp, tl }, k) => el('tr', { dataset: { id } },
      el('td', null, el('span', { class: 'swatch', style: `background:${COLORWAY[k % COLORWAY.length]}` }), ' ', el('a', { href: `#/experiments/${id}` }, `#${id}`)),
      el('td', { class: 'wrap' }, strategyLabel(exp.spec)),
      el('td', { class: 'wrap' }, `${modelLabel(exp.spec)} · batch ${exp.spec.batch_size}`),
      el('td', { class: 'num' }, String(tl.step)),
      el('td', { class: 'num' }, fmtInt(tl.n_events)),
      el('td', { class: 'num' }, fmtInt(tl.recomputations.reduce((n, s) => n + s.end - s.start, 0))),
      el('td', { class: 'num', dataset: { bytes: tl.peak_bytes } }, fmtBytes(tl.peak_bytes)),
      el('td', null, `${phaseAt(tl, tl.peak_index)}, event ${tl.peak_index}`),
      el('td', { class: 'num' }, fmtBytes(exp.summary && exp.summary.peak_allocated_bytes)),
      el('td', null, el('a', {
        href: `/api/experiments/${id}/timeline?step=${tl.step}&max_points=${DOWNLOAD_POINTS}`,
        download: `experiment-${id}-timeline-step-${tl.step}.json`, class: 'button secondary small',
      }, 'JSON')),
    ))));
}

function reset() {
  $('overlay-status').textContent = 'Loading…';
  $('overlay-missing').replaceChildren();
  $('overlay-runs').replaceChildren();
  $('overlay-card').hidden = true;
  $('overlay-crumb').replaceChildren();
  if (window.Plotly) window.Plotly.purge('overlay-chart');
}

/** The page for the route's `params` (ids= or sweep=). */
export function showOverlay(params) {
  token += 1;
  const mine = token;
  reset();
  load(params, mine).catch(() => {
    if (mine === token) $('overlay-status').textContent = 'Cannot reach the ckptlab server: reload the page to try again.';
  });
}

async function load(params, mine) {
  const chosen = await chooseRuns(params);
  if (mine !== token) return;
  $('overlay-ids').value = chosen.sweep ? '' : chosen.ids.join(',');
  $('overlay-title').textContent = chosen.sweep ? `Memory timelines of sweep #${chosen.sweep}` : 'Memory timelines, overlaid';
  document.title = 'ckptlab · timelines';
  if (chosen.sweep) $('overlay-crumb').replaceChildren(' · ', el('a', { href: `#/sweeps/${chosen.sweep}` }, `Sweep #${chosen.sweep}`));
  const ids = chosen.ids.slice(0, MAX_RUNS);
  if (chosen.error || ids.length < 1) {
    $('overlay-status').textContent = chosen.error ? sentence(chosen.error) : 'Name two or more runs to overlay: their ids, e.g. 1,2,3.';
    return;
  }
  const [list, ...answers] = await Promise.all([
    api(`/api/experiments?ids=${ids.join(',')}&limit=${ids.length}`),
    ...ids.map((id) => api(`/api/experiments/${id}/timeline?max_points=${OVERLAY_POINTS}`)),
  ]);
  if (mine !== token) return;
  const exps = new Map(((list.ok && list.body.data) || []).map((e) => [e.id, e]));
  const runs = [];
  const missing = [];
  ids.forEach((id, i) => {
    const r = answers[i];
    if (r.ok && exps.has(id)) runs.push({ id, exp: exps.get(id), tl: r.body });
    else missing.push(el('li', null, `#${id}: ${r.ok ? `experiment ${id} not found.` : sentence(detailText(r.body))}`));
  });
  runNames(runs, chosen.labels).forEach((name, i) => { runs[i].name = name; });
  const more = chosen.ids.length > ids.length ? ` (the first ${MAX_RUNS} of ${chosen.ids.length})` : '';
  $('overlay-status').textContent = runs.length
    ? `${runs.length} run${runs.length > 1 ? 's' : ''}${more}: the step of each run's peak, live bytes after each allocation and free.`
    : 'None of these runs has a memory timeline.';
  $('overlay-missing').replaceChildren(...missing);
  if (!runs.length) return;
  $('overlay-runs').replaceChildren(runsTable(runs));
  $('overlay-card').hidden = false;
  const Plotly = await loadPlotly().catch(() => null);
  if (mine !== token) return;
  if (!Plotly) {
    $('overlay-chart').textContent = 'Charts unavailable: Plotly did not load.';
    return;
  }
  await drawFitted('overlay-chart', overlayFigure(runs), PLOT_CONFIG);
}

export function hideOverlay() {
  token += 1;
}

/** The page's form: the runs to overlay, by id. */
export function initOverlay() {
  $('overlay-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const ids = $('overlay-ids').value.split(/[\s,]+/).filter((s) => /^\d+$/.test(s));
    location.hash = `#/timeline?ids=${ids.join(',')}`;
  });
}
