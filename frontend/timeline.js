/* One step's memory timeline on the experiment page (issue 34): live bytes after each
 * allocation and free of the step, stacked by memory category, the forward / backward /
 * optimizer spans shaded, recomputations and the peak marked, each event's module and op on
 * hover; "who holds the peak" (module, category, saved or temporary), summing to the peak;
 * the events as JSON. A run without a timeline says why in one line (the API's 404). A run
 * with a prediction of its spec links to both overlaid ("compare with prediction").
 * The span and phase helpers here are shared with timeline_overlay.js. */

import { $, OKABE_ITO, STATUS, TERMINAL, api, byteUnit, detailText, el, fmtBytes, fmtInt, loadPlotly } from './util.js';
import { CATEGORIES, PLOT_CONFIG, baseLayout, dropFlatRuns } from './charts.js';
import { drawFitted } from './chart_fit.js';

/** Points of a timeline drawn (the server picks them: MinMaxLTTB, the peak's event kept). */
const TIMELINE_POINTS = 2000;
/** Points of a downloaded timeline: the API's most (every event of all but huge steps). */
export const DOWNLOAD_POINTS = 100000;
/** Peak holders named in the table; the rest are summed in one row. */
const HOLDERS = 15;
/** Each phase's shade, as the time chart colours its bars. */
export const PHASE_COLORS = { forward: OKABE_ITO.sky, backward: OKABE_ITO.orange, optimizer: OKABE_ITO.green };
/** Recomputations: grey bands over the phase's shade (no category is grey). */
const RECOMPUTE_COLOR = OKABE_ITO.black;
/** The peak's marker: a yellow diamond outlined in black, on every figure. */
export const PEAK_MARKER = { symbol: 'diamond', size: 12, color: OKABE_ITO.yellow, line: { color: OKABE_ITO.black, width: 1.2 } };

let cur = null; // {id, step}: the timeline on show
let offered = null; // {id}: the run whose predictions are being looked up

// ------------------------------------------------------------------ shared

/** For each event index of `xs` (ascending), the span of `spans` ({start, end}, end
 * exclusive, sorted and disjoint) that holds it, or null. */
export function spanOf(xs, spans) {
  const out = new Array(xs.length).fill(null);
  let j = 0;
  xs.forEach((x, i) => {
    while (j < spans.length && spans[j].end <= x) j += 1;
    if (j < spans.length && spans[j].start <= x) out[i] = spans[j];
  });
  return out;
}

/** Shaded x bands ({x0, x1, name, color, opacity}) as Plotly shapes behind the traces, each
 * name once in the legend. */
export function bandShapes(bands) {
  const seen = new Set();
  return bands.map((b) => {
    const first = !seen.has(b.name);
    seen.add(b.name);
    return {
      type: 'rect', xref: 'x', yref: 'paper', x0: b.x0, x1: b.x1, y0: 0, y1: 1, layer: 'below',
      fillcolor: b.color, opacity: b.opacity ?? 0.13, line: { width: 0 },
      name: b.name, legendgroup: `band ${b.name}`, showlegend: first,
    };
  });
}

/** "+1.5 MiB" / "−512 B": an event's bytes, allocated or freed. */
export function signedBytes(n) {
  return n < 0 ? `−${fmtBytes(-n)} freed` : `+${fmtBytes(n)} allocated`;
}

/** The phase that holds event `t` of a timeline ("before the step's first event" for -1). */
export function phaseAt(tl, t) {
  if (t < 0) return 'start of the step';
  const span = spanOf([t], tl.phases)[0];
  return span ? span.phase : '—';
}

/** What one event is, for hovers: "blocks.0.mlp · aten.addmm.default · +512 KiB allocated ·
 * saved for backward · backward, recomputation of blocks.0". */
export function eventText(tl, i, where) {
  const kept = tl.saved_for_backward[i] ? 'saved for backward' : 'temporary';
  const region = tl.checkpoint_region[i] ? ` of ${tl.checkpoint_region[i]}` : '';
  return `${tl.module[i]} · ${tl.op[i]} · ${signedBytes(tl.bytes_delta[i])} · ${kept} · ${where}${region}`;
}

/** Where each point of `tl` falls: its phase, and "recomputation" inside one. */
export function pointPlaces(tl) {
  const phases = spanOf(tl.t_index, tl.phases);
  const recomputed = spanOf(tl.t_index, tl.recomputations);
  return tl.t_index.map((_, i) => [phases[i] ? phases[i].phase : '—', recomputed[i] ? 'recomputation' : null].filter(Boolean).join(', '));
}

// ------------------------------------------------------------------ one run's figure

/** The stacked timeline of one step (GET /api/experiments/{id}/timeline): y in the binary
 * unit that suits its peak. SVG traces, not WebGL: at most TIMELINE_POINTS points each, and
 * WebGL draws no fill between traces ('tonexty'); a category's flat stretches keep their ends. */
export function timelineFigure(tl) {
  const [div, unit] = byteUnit(Math.max(1, tl.peak_bytes));
  const x = tl.t_index;
  const places = pointPlaces(tl);
  const cum = new Array(x.length).fill(0);
  const traces = CATEGORIES.filter(([key]) => tl.by_category[key]).map(([key, label, color], i) => {
    const vals = tl.by_category[key];
    vals.forEach((v, j) => { cum[j] += v; });
    return dropFlatRuns({
      type: 'scatter', mode: 'lines', name: label, x, y: cum.map((v) => v / div), fill: i === 0 ? 'tozeroy' : 'tonexty',
      line: { color, width: 0.5, shape: 'hv' }, fillcolor: `${color}B3`, customdata: vals.map((v) => fmtBytes(v)),
      hovertemplate: `%{customdata}<extra>${label}</extra>`,
    });
  });
  traces.push({
    type: 'scatter', mode: 'lines', name: 'live, all categories', x, y: tl.live_bytes.map((v) => v / div),
    line: { color: OKABE_ITO.black, width: 1.2, shape: 'hv' },
    customdata: x.map((_, i) => [fmtBytes(tl.live_bytes[i]), eventText(tl, i, places[i])]),
    hovertemplate: '<b>%{customdata[0]}</b> after event %{x}: %{customdata[1]}<extra>live</extra>',
  });
  const at = x.indexOf(tl.peak_index);
  traces.push({
    type: 'scatter', mode: 'markers', name: `peak ${fmtBytes(tl.peak_bytes)}`, x: [tl.peak_index], y: [tl.peak_bytes / div],
    marker: PEAK_MARKER,
    customdata: [at >= 0 ? eventText(tl, at, places[at]) : phaseAt(tl, tl.peak_index)],
    hovertemplate: `<b>peak ${fmtBytes(tl.peak_bytes)}</b>: %{customdata}<extra></extra>`,
    meta: { peak: true },
  });
  const bands = [
    ...tl.phases.map((s) => ({ x0: s.start - 0.5, x1: s.end - 0.5, name: s.phase, color: PHASE_COLORS[s.phase] || OKABE_ITO.grey })),
    ...tl.recomputations.map((s) => ({ x0: s.start - 0.5, x1: s.end - 0.5, name: 'recomputation', color: RECOMPUTE_COLOR, opacity: 0.16 })),
  ];
  const layout = baseLayout({
    height: 420,
    hovermode: 'closest',
    xaxis: { ...baseLayout().xaxis, title: { text: `event of step ${tl.step} (allocations and frees, in order)` }, tickformat: 'd' },
    yaxis: { ...baseLayout().yaxis, title: { text: `live memory (${unit})` } },
    shapes: bandShapes(bands),
  });
  layout.legend.traceorder = 'normal';
  return { data: traces, layout };
}

// ------------------------------------------------------------------ who holds the peak

/** The peak holders (GET /api/experiments/{id}/peak-holders) as a table whose rows (the
 * named groups, the rest in one) sum to the peak, shown in its last row. */
export function holdersTable(ph) {
  const label = new Map(CATEGORIES.map(([key, text]) => [key, text]));
  const share = (b) => (ph.peak_bytes ? `${((100 * b) / ph.peak_bytes).toFixed(1)}%` : '—');
  const rows = ph.holders.map((h) => el('tr', { dataset: { bytes: h.bytes } },
    el('td', { class: 'wrap' }, h.module),
    el('td', null, label.get(h.category) || h.category),
    el('td', null, h.saved ? 'saved for backward' : 'temporary'),
    el('td', { class: 'num' }, fmtBytes(h.bytes)),
    el('td', { class: 'num' }, share(h.bytes)),
    el('td', { class: 'wrap muted' }, h.ops.join(', '), h.recomputed_bytes ? ` (${fmtBytes(h.recomputed_bytes)} recomputed)` : ''),
  ));
  if (ph.others_groups) {
    rows.push(el('tr', { dataset: { bytes: ph.others_bytes }, class: 'muted' },
      el('td', { class: 'wrap', colspan: 3 }, `${fmtInt(ph.others_groups)} smaller groups`),
      el('td', { class: 'num' }, fmtBytes(ph.others_bytes)), el('td', { class: 'num' }, share(ph.others_bytes)), el('td', null, '')));
  }
  const head = ['module', 'category', 'kept as', 'bytes', 'share', 'made by'];
  return el('table', { class: 'data', id: 'timeline-holders-table' },
    el('thead', null, el('tr', null, ...head.map((h, i) => el('th', { scope: 'col', class: i === 3 || i === 4 ? 'num' : null }, h)))),
    el('tbody', null, ...rows),
    el('tfoot', null, el('tr', { dataset: { total: ph.peak_bytes } },
      el('th', { scope: 'row', colspan: 3 }, `the peak (${fmtInt(ph.groups)} groups)`),
      el('td', { class: 'num' }, fmtBytes(ph.peak_bytes)), el('td', { class: 'num' }, '100%'), el('td', null, ''))));
}

/** One line on what was attributed, and on regions that kept more than they meant to. */
function holdersNote(ph, tl) {
  const named = ph.peak_bytes ? (100 * ph.named_bytes) / ph.peak_bytes : 100;
  const parts = [`At event ${ph.peak_index} (${ph.phase || 'start of the step'}): ${named.toFixed(1)}% of the peak held by a named module`];
  if (ph.unknown_bytes) parts.push(`${fmtBytes(ph.unknown_bytes)} by nothing named`);
  for (const k of tl.region_keeps || []) {
    if (k.excess_bytes > 0) parts.push(`checkpoint region ${k.region} kept ${fmtBytes(k.excess_bytes)} more than it meant to (${fmtBytes(k.intended_bytes)})`);
  }
  return `${parts.join('; ')}.`;
}

// ------------------------------------------------------------------ the card

/** The API's reason as a sentence: capitalised, ending with a full stop. */
export function sentence(text) {
  const t = String(text).trim();
  return `${t.charAt(0).toUpperCase()}${t.slice(1)}${/[.!?]$/.test(t) ? '' : '.'}`;
}

function downloads(id, step) {
  const q = `step=${step}`;
  return [
    el('a', { href: `/api/experiments/${id}/timeline?${q}&max_points=${DOWNLOAD_POINTS}`, download: `experiment-${id}-timeline-step-${step}.json`, class: 'button secondary small', id: 'timeline-json' }, 'Timeline JSON'),
    el('a', { href: `/api/experiments/${id}/peak-holders?${q}&top=1000`, download: `experiment-${id}-peak-holders-step-${step}.json`, class: 'button secondary small' }, 'Peak holders JSON'),
  ];
}

function stepButtons(tl, id) {
  return tl.steps.map((s) => el('button', {
    type: 'button', class: 'secondary small', 'aria-pressed': String(s === tl.step),
    onclick: () => loadStep(id, s),
  }, s === tl.peak_step ? `step ${s} (the peak)` : s === tl.steps[0] ? `step ${s} (the first)` : `step ${s}`));
}

function clearCard() {
  $('timeline-none').hidden = true;
  $('timeline-body').hidden = true;
  $('timeline-steps').replaceChildren();
  $('timeline-downloads').replaceChildren();
  $('timeline-holders').replaceChildren();
  $('timeline-note').textContent = '';
  if (window.Plotly) window.Plotly.purge('chart-timeline');
}

async function loadStep(id, step) {
  const mine = { id, step };
  cur = mine;
  const q = step ? `step=${step}&` : '';
  let r;
  let h;
  try {
    [r, h] = await Promise.all([
      api(`/api/experiments/${id}/timeline?${q}max_points=${TIMELINE_POINTS}`),
      api(`/api/experiments/${id}/peak-holders?${q}top=${HOLDERS}`),
    ]);
  } catch (_) {
    return; // the server is unreachable: the banner says so
  }
  if (cur !== mine) return;
  if (!r.ok || !h.ok) {
    clearCard();
    $('timeline-none').textContent = sentence(detailText(r.ok ? h.body : r.body));
    $('timeline-none').hidden = false;
    return;
  }
  const tl = r.body;
  const recomputed = tl.recomputations.reduce((n, s) => n + s.end - s.start, 0);
  $('timeline-title').textContent = `Memory over step ${tl.step}'s events, by category`;
  $('timeline-caption').textContent = [
    `${fmtInt(tl.n_events)} allocations and frees${tl.downsampled ? ` (${fmtInt(tl.t_index.length)} drawn, picked by MinMaxLTTB; the peak exact)` : ''}`,
    `peak ${fmtBytes(tl.peak_bytes)} at event ${tl.peak_index} (${phaseAt(tl, tl.peak_index)})`,
    recomputed ? `${fmtInt(recomputed)} events of recomputation, marked` : 'no recomputation',
    'shaded: forward, backward, optimizer. Hover a point for the module and op of its event.',
  ].join(' · ');
  $('timeline-steps').replaceChildren(...(tl.steps.length > 1 ? stepButtons(tl, id) : []));
  $('timeline-downloads').replaceChildren(...downloads(id, tl.step));
  $('timeline-note').textContent = holdersNote(h.body, tl);
  $('timeline-holders').replaceChildren(holdersTable(h.body));
  $('timeline-none').hidden = true;
  $('timeline-body').hidden = false;
  const Plotly = await loadPlotly().catch(() => null);
  if (cur !== mine) return;
  if (!Plotly) {
    $('chart-timeline').textContent = 'Charts unavailable: Plotly did not load.';
    return;
  }
  await drawFitted('chart-timeline', timelineFigure(tl), PLOT_CONFIG);
}

/** "compare with prediction": a link overlaying the run with the predictions of its spec
 * that have a timeline (GET /api/experiments/{id}/predictions: the same spec but for what a
 * prediction does not read, such as the device), the newest of each target, three at most. */
async function offerPredictions(id) {
  const mine = { id };
  offered = mine;
  let r;
  try {
    r = await api(`/api/experiments/${id}/predictions`);
  } catch (_) {
    return;
  }
  const newest = new Map();
  for (const p of (r.ok && r.body.data) || []) if (!newest.has(p.target) && newest.size < 3) newest.set(p.target, p.id);
  if (offered !== mine || !newest.size) return;
  const box = $('timeline-overlay');
  const link = el('a', { href: `#/timeline?ids=${id}&predictions=${[...newest.values()].join(',')}`, id: 'timeline-compare' },
    `compare with prediction (${[...newest.keys()].join(', ')})`);
  box.append(...(box.childNodes.length ? [' · ', link] : [link]));
}

/** The experiment page's timeline card for `exp`: hidden until the run has finished; then
 * the peak step's timeline and its holders, or the one line saying why there are none, and
 * a link to the predictions of its spec when there are any. */
export function renderTimeline(exp) {
  cur = null;
  offered = null;
  const card = $('exp-timeline');
  clearCard();
  card.hidden = !TERMINAL.has(exp.status);
  $('timeline-overlay').replaceChildren(...(exp.sweep_id ? [el('a', { href: `#/timeline?sweep=${exp.sweep_id}` }, `overlay with the other runs of sweep #${exp.sweep_id}`)] : []));
  if (!card.hidden) loadStep(exp.id, null);
  if (exp.status === STATUS.SUCCEEDED) offerPredictions(exp.id);
}

// Leaving the page (any route change) hides the card: a new experiment draws its own.
window.addEventListener('hashchange', () => {
  cur = null;
  offered = null;
  $('exp-timeline').hidden = true;
});
