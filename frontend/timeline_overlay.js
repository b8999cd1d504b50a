/* Memory timelines of two or more runs on one axis (issue 34): #/timeline?ids=1,2,3, or
 * #/timeline?sweep=<id> for a sweep's runs that succeeded, and predictions beside them:
 * &predictions=7,8 (GET /api/predictions/{id}/timeline: a prediction's memory pass on fake
 * tensors, drawn dashed and named "predicted (fake tensors, <target>)"). Each run's live
 * bytes over the events of its peak step, a line per run, the phases aligned: x is an
 * event's index within its phase and each phase starts at the same x for every run (as wide
 * as its longest run's), so the forward, backward and optimizer of each run line up. Each
 * run's peak is marked; a table beside says what each line is and offers its events as JSON. */

import {
  $, COLORWAY, OKABE_ITO, STATUS, api, byteUnit, detailText, el, fmtBytes, fmtInt, loadPlotly, modelLabel, strategyLabel,
} from './util.js';
import { PLOT_CONFIG, baseLayout } from './charts.js';
import { drawFitted } from './chart_fit.js';
import { DOWNLOAD_POINTS, PHASE_COLORS, bandShapes, eventText, phaseAt, pointPlaces, sentence, spanOf } from './timeline.js';

/** Points of each run's timeline drawn (MinMaxLTTB on the server, each peak kept exact). */
const OVERLAY_POINTS = 1500;
/** Runs drawn at most: more lines than this cannot be told apart (predictions likewise). */
const MAX_RUNS = 8;
/** What a predicted line is, beside the measured ones. */
const PREDICTED_NOTE = "Dashed: a prediction's memory pass on fake tensors, its allocations and frees as the live-tensor "
  + "tracker counts them; on cpu the count a real CPU run gives, to the byte. On a CUDA target it is the fake tensor count "
  + '(each block rounded to 512 B): the predicted peak adds the cuBLAS workspaces to it, and the reserved bytes and the '
  + 'CUDA context are modelled apart.';

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
  return { sweep: null, ids: idList(params.get('ids')), labels: new Map() };
}

/** The positive whole numbers of a comma-separated list, each once, in order. */
function idList(text) {
  return [...new Set((text || '').split(',').map((s) => Number(s.trim())).filter((n) => Number.isInteger(n) && n > 0))];
}

/** Each prediction's name in the legend: "predicted (fake tensors, cpu)", its id added when
 * two are of one target. */
function predictionNames(preds) {
  return preds.map((p) => {
    const name = `predicted (fake tensors, ${p.tl.target})`;
    return preds.filter((q) => q.tl.target === p.tl.target).length > 1 ? `${name} · prediction #${p.id}` : name;
  });
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
    const group = run.predicted ? `prediction ${run.id}` : `run ${run.id}`;
    const who = run.predicted ? `prediction #${run.id}` : `#${run.id}`;
    const meta = run.predicted ? { prediction: run.id } : { run: run.id };
    data.push({
      type: 'scatter', mode: 'lines', name, legendgroup: group, ...alignedLine(tl, grid, div),
      line: { color, width: 1.6, shape: 'hv', dash: run.predicted ? 'dash' : 'solid' }, connectgaps: false,
      hovertemplate: `<b>%{customdata[0]}</b> after event %{customdata[1]}: %{customdata[2]}<extra>${who}</extra>`,
      meta,
    });
    const at = tl.t_index.indexOf(tl.peak_index);
    const places = at >= 0 ? pointPlaces(tl) : [];
    data.push({
      type: 'scatter', mode: 'markers', name: `${name}: peak`, legendgroup: group, showlegend: false,
      x: alignedX(tl, [tl.peak_index], grid), y: [tl.peak_bytes / div],
      marker: { symbol: run.predicted ? 'diamond-open' : 'diamond', size: 13, color, line: { color: run.predicted ? color : OKABE_ITO.black, width: run.predicted ? 2 : 1 } },
      customdata: [at >= 0 ? eventText(tl, at, places[at]) : phaseAt(tl, tl.peak_index)],
      hovertemplate: `<b>peak ${fmtBytes(tl.peak_bytes)}</b> at event ${tl.peak_index}: %{customdata}<extra>${who}</extra>`,
      meta: { ...meta, peak: true },
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

/** A line's first cell: its colour (dashed for a prediction) and a link to its page. */
function whoCell({ id, predicted, tl }, k) {
  const color = COLORWAY[k % COLORWAY.length];
  const swatch = el('span', { class: 'swatch', style: predicted ? `background:transparent;border:2px dashed ${color}` : `background:${color}` });
  const link = predicted
    ? el('a', { href: `#/predictions/${id}` }, `prediction #${id} (${tl.target})`)
    : el('a', { href: `#/experiments/${id}` }, `#${id}`);
  return el('td', { class: predicted ? 'wrap' : null }, swatch, ' ', link);
}

function runsTable(runs) {
  const head = ['run', 'strategy', 'model', 'step', 'events', 'recomputed', 'peak', 'at', 'summary peak', ''];
  const num = new Set([3, 4, 5, 6, 8]);
  return el('table', { class: 'data', id: 'overlay-runs-table' },
    el('thead', null, el('tr', null, ...head.map((h, i) => el('th', { scope: 'col', class: num.has(i) ? 'num' : null }, h)))),
    el('tbody', null, ...runs.map((run, k) => {
      const { id, exp, tl, predicted } = run;
      const what = predicted ? 'prediction' : 'experiment';
      return el('tr', predicted ? { dataset: { prediction: id } } : { dataset: { id } },
        whoCell(run, k),
        el('td', { class: 'wrap' }, strategyLabel(exp.spec)),
        el('td', { class: 'wrap' }, `${modelLabel(exp.spec)} · batch ${exp.spec.batch_size}`),
        el('td', { class: 'num' }, String(tl.step)),
        el('td', { class: 'num' }, fmtInt(tl.n_events)),
        el('td', { class: 'num' }, fmtInt(tl.recomputations.reduce((n, s) => n + s.end - s.start, 0))),
        el('td', { class: 'num', dataset: { bytes: tl.peak_bytes } }, fmtBytes(tl.peak_bytes)),
        el('td', null, `${phaseAt(tl, tl.peak_index)}, event ${tl.peak_index}`),
        el('td', { class: 'num' }, fmtBytes(exp.summary && exp.summary.peak_allocated_bytes)),
        el('td', null, el('a', {
          href: `/api/${what}s/${id}/timeline?step=${tl.step}&max_points=${DOWNLOAD_POINTS}`,
          download: `${what}-${id}-timeline-step-${tl.step}.json`, class: 'button secondary small',
        }, 'JSON')));
    })));
}

function reset() {
  $('overlay-status').textContent = 'Loading…';
  $('overlay-missing').replaceChildren();
  $('overlay-note').hidden = true;
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

/** The runs `ids`: each {id, exp, tl} with a timeline, and a line for each without. */
async function loadRuns(ids) {
  if (!ids.length) return { found: [], missing: [] };
  const [list, ...answers] = await Promise.all([
    api(`/api/experiments?ids=${ids.join(',')}&limit=${ids.length}&per_step=false`),
    ...ids.map((id) => api(`/api/experiments/${id}/timeline?max_points=${OVERLAY_POINTS}`)),
  ]);
  const exps = new Map(((list.ok && list.body.data) || []).map((e) => [e.id, e]));
  const found = [];
  const missing = [];
  ids.forEach((id, i) => {
    const r = answers[i];
    if (r.ok && exps.has(id)) found.push({ id, exp: exps.get(id), tl: r.body });
    else missing.push(el('li', null, `#${id}: ${r.ok ? `experiment ${id} not found.` : sentence(detailText(r.body))}`));
  });
  return { found, missing };
}

/** The predictions `ids`: each {id, exp: the prediction (its spec and summary), tl,
 * predicted} with a timeline, and a line for each without. */
async function loadPredictions(ids) {
  const answers = await Promise.all(ids.map((id) => Promise.all([
    api(`/api/predictions/${id}/timeline?max_points=${OVERLAY_POINTS}`), api(`/api/predictions/${id}`)])));
  const found = [];
  const missing = [];
  ids.forEach((id, i) => {
    const [t, p] = answers[i];
    if (t.ok && p.ok) found.push({ id, exp: p.body, tl: t.body, predicted: true });
    else missing.push(el('li', null, `prediction #${id}: ${sentence(detailText((t.ok ? p : t).body))}`));
  });
  return { found, missing };
}

/** "3 runs and 1 prediction", each count said only when there are any. */
function counted(runs, preds, more) {
  const say = (n, what) => `${n} ${what}${n > 1 ? 's' : ''}`;
  return [runs.length && `${say(runs.length, 'run')}${more}`, preds.length && say(preds.length, 'prediction')].filter(Boolean).join(' and ');
}

async function load(params, mine) {
  const chosen = await chooseRuns(params);
  if (mine !== token) return;
  const pids = idList(params.get('predictions')).slice(0, MAX_RUNS);
  $('overlay-ids').value = chosen.sweep ? '' : chosen.ids.join(',');
  $('overlay-predictions').value = pids.join(',');
  const titles = ['Memory timelines, overlaid', 'Predicted memory timelines', 'Memory timelines, predicted and measured'];
  $('overlay-title').textContent = chosen.sweep ? `Memory timelines of sweep #${chosen.sweep}`
    : titles[pids.length ? 1 + Math.sign(chosen.ids.length) : 0];
  document.title = 'ckptlab · timelines';
  if (chosen.sweep) $('overlay-crumb').replaceChildren(' · ', el('a', { href: `#/sweeps/${chosen.sweep}` }, `Sweep #${chosen.sweep}`));
  const ids = chosen.ids.slice(0, MAX_RUNS);
  if (chosen.error || ids.length + pids.length < 1) {
    $('overlay-status').textContent = chosen.error ? sentence(chosen.error) : 'Name two or more runs to overlay: their ids, e.g. 1,2,3.';
    return;
  }
  const [measured, predicted] = await Promise.all([loadRuns(ids), loadPredictions(pids)]);
  if (mine !== token) return;
  const runs = measured.found;
  const preds = predicted.found;
  runNames(runs, chosen.labels).forEach((name, i) => { runs[i].name = name; });
  predictionNames(preds).forEach((name, i) => { preds[i].name = name; });
  const more = chosen.ids.length > ids.length ? ` (the first ${MAX_RUNS} of ${chosen.ids.length})` : '';
  const all = [...runs, ...preds];
  $('overlay-status').textContent = all.length
    ? `${counted(runs, preds, more)}: the step of each one's peak, live bytes after each allocation and free.`
    : 'None of these runs has a memory timeline.';
  $('overlay-missing').replaceChildren(...measured.missing, ...predicted.missing);
  $('overlay-note').textContent = PREDICTED_NOTE;
  $('overlay-note').hidden = !preds.length;
  if (!all.length) return;
  $('overlay-runs').replaceChildren(runsTable(all));
  $('overlay-card').hidden = false;
  const Plotly = await loadPlotly().catch(() => null);
  if (mine !== token) return;
  if (!Plotly) {
    $('overlay-chart').textContent = 'Charts unavailable: Plotly did not load.';
    return;
  }
  await drawFitted('overlay-chart', overlayFigure(all), PLOT_CONFIG);
}

export function hideOverlay() {
  token += 1;
}

/** The page's form: the runs to overlay, and predictions beside them, by id. */
export function initOverlay() {
  $('overlay-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const read = (id) => $(id).value.split(/[\s,]+/).filter((s) => /^\d+$/.test(s)).join(',');
    const preds = read('overlay-predictions');
    location.hash = `#/timeline?ids=${read('overlay-ids')}${preds ? `&predictions=${preds}` : ''}`;
  });
}
