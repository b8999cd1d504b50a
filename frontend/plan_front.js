/* The plan page's front (issue 31, item 5): peak (MiB/GiB) against the step-time overhead
 * each point paid over the un-checkpointed copy it was timed with, round by round in its
 * own process (the paired overhead, with its 95% CI as error bars), never raw step times
 * of separate runs. The budget line stands at the budget's exact value; measured points
 * are solid, the planner's predicted front (plan.front) dashed and hollow, the auto run's
 * predicted point a hollow diamond dotted to its measured one; each measured point's setting
 * is written beside it, placed where it stays inside the plot and clear of the others
 * (placeLabels), else left to the hover and the table. */

import { BASELINE, STATUS, byteUnit, fmtBytes, fmtPct } from './util.js';
import { baseLayout } from './charts.js';

/** Raw step times of a plan's runs: each measured in its own run, one after another. */
export const SEPARATE = 'separate runs, not comparable on a busy host';
/** Axis numbers as numbers: no SI letters ("115M"), thousands separated. */
const NUMBERS = { exponentformat: 'none', separatethousands: true };
const MEASURED = '#0072B2';
const OVER = '#BBBBBB';
const PREDICTED = '#E69F00';
const MARKER = 11;
const LABEL_FONT = 11.5;

/** A point's setting without the axis name: "sequential segments=2". */
export const setting = (p) => p.label.replace('strategy=', '');

/** [divisor, name] of the binary unit that suits the plan's largest peak or its budget. */
export function unitOf(v) {
  const bytes = v.points.flatMap((p) => [p.peak_allocated_bytes, p.predicted_peak_bytes])
    .concat((v.predicted_front || []).map((p) => p.peak_bytes)).filter(Number.isFinite);
  return byteUnit(Math.max(v.budget_bytes, ...bytes));
}

/** The budget as a dashed line across the plot at its exact value, named at its right end. */
export function budgetLine(v, [div]) {
  const y = v.budget_bytes / div;
  return {
    shapes: [{ type: 'line', xref: 'paper', x0: 0, x1: 1, y0: y, y1: y, line: { color: '#D55E00', dash: 'dash', width: 2 } }],
    annotations: [{ xref: 'paper', x: 1, xanchor: 'right', y, yanchor: 'bottom', showarrow: false,
      text: `budget ${fmtBytes(v.budget_bytes)}`, font: { size: 11.5, color: '#A04000' }, bgcolor: 'rgba(255,255,255,0.85)' }],
  };
}

/** A linear axis in `unit` from 0 to a little above `top` (room for the labels above it). */
export function peakAxis([, name], top, title = 'peak') {
  return { ...baseLayout().yaxis, ...NUMBERS, title: { text: `${title} (${name})` }, range: [0, top * 1.15] };
}

/** A point's overhead on the front: the paired interval; the baseline is the reference (0);
 * null for a point timed unpaired (its time is from a separate run). */
export function pairedOf(p) {
  if (p.strategy === BASELINE) return { estimate_pct: 0, low_pct: 0, high_pct: 0, measurable: false, reference: true };
  return p.paired_overhead || null;
}

/** "+12% (95% CI +8% to +16%)", the words of the table and the hover alike. */
export function intervalText(o) {
  if (o.reference) return 'the reference (0%)';
  const ci = Number.isFinite(o.low_pct) && Number.isFinite(o.high_pct) ? ` (95% CI ${fmtPct(o.low_pct)} to ${fmtPct(o.high_pct)})` : '';
  return `${fmtPct(o.estimate_pct)}${ci}${o.measurable === false ? `, ${o.unmeasured_why || 'within the noise'}` : ''}`;
}

/** The succeeded points with a peak, split into those with a paired overhead and the others. */
export function frontPoints(v) {
  const done = v.points.filter((p) => p.status === STATUS.SUCCEEDED && Number.isFinite(p.peak_allocated_bytes));
  const paired = done.filter((p) => pairedOf(p)).sort((a, b) => Number(b.fits === true) - Number(a.fits === true));
  return { paired, unpaired: done.filter((p) => !pairedOf(p)) }; // fitting first: the legend shows their colour
}

const bars = (xs, lows, highs) => ({
  type: 'data', symmetric: false, thickness: 1.5, width: 4,
  array: xs.map((x, i) => (Number.isFinite(highs[i]) ? Math.max(0, highs[i] - x) : 0)),
  arrayminus: xs.map((x, i) => (Number.isFinite(lows[i]) ? Math.max(0, x - lows[i]) : 0)),
});

/** The planner's front (dashed, hollow): for each budget, the predicted peak and overhead of
 * the plan it would choose (plan.front); none where the plan carries none. */
function predictedFront(v, div) {
  const front = (v.predicted_front || []).filter((p) => Number.isFinite(p.overhead_pct));
  if (!front.length) return [];
  const xs = front.map((p) => p.overhead_pct);
  return [{ type: 'scatter', mode: 'lines+markers', name: 'predicted front (the planner)', x: xs, y: front.map((p) => p.peak_bytes / div),
    line: { color: PREDICTED, dash: 'dash', width: 2 }, marker: { size: MARKER - 2, symbol: 'circle-open', color: PREDICTED, line: { width: 2 } },
    error_x: { ...bars(xs, front.map((p) => p.overhead_low_pct), front.map((p) => p.overhead_high_pct)), color: PREDICTED },
    customdata: front.map((p) => [fmtBytes(p.peak_bytes), fmtBytes(p.budget_bytes)]),
    hovertemplate: 'predicted for a budget of %{customdata[1]}: %{x:+.1f}%, peak %{customdata[0]}<extra></extra>' }];
}

/** The planner's predictions: its front (predictedFront), then the auto run's own predicted
 * point (a hollow diamond, dotted to its measured one) where it has a predicted peak. */
function predictedTraces(v, div) {
  return [...predictedFront(v, div), ...autoPredicted(v, div)];
}

/** The auto run's predicted point: its plan's predicted peak at its predicted overhead (at
 * its measured overhead where the plan predicted none), dotted to where it was measured. */
function autoPredicted(v, div) {
  const auto = v.points.find((p) => Number.isFinite(p.predicted_peak_bytes));
  const measured = auto && pairedOf(auto);
  const own = auto && auto.predicted_overhead;
  const x = own ? own.estimate_pct : measured ? measured.estimate_pct : null;
  if (!Number.isFinite(x)) return [];
  const tail = measured && Number.isFinite(auto.peak_allocated_bytes) ? [[measured.estimate_pct, auto.peak_allocated_bytes / div]] : [];
  return [{ type: 'scatter', mode: 'lines+markers', name: `predicted by ${setting(auto)}'s plan`,
    x: [x, ...tail.map((t) => t[0])], y: [auto.predicted_peak_bytes / div, ...tail.map((t) => t[1])],
    line: { color: PREDICTED, dash: 'dot', width: 1.5 }, marker: { size: [MARKER + 1, 0], symbol: 'diamond-open', color: PREDICTED, line: { width: 2 } },
    hovertemplate: `predicted: ${own ? '%{x:+.1f}%, ' : ''}peak ${fmtBytes(auto.predicted_peak_bytes)}<extra></extra>` }];
}

/** Peak against paired overhead: every measured point with its CI (grey: over the budget),
 * the measured front joined, the predictions dashed and hollow, the budget line. */
export function frontFigure(v, unit) {
  const div = unit[0];
  const { paired } = frontPoints(v);
  const intervals = paired.map(pairedOf);
  const xs = intervals.map((o) => o.estimate_pct);
  const front = paired.filter((p) => p.on_front).sort((a, b) => pairedOf(a).estimate_pct - pairedOf(b).estimate_pct);
  const predicted = predictedTraces(v, div);
  const predictedX = predicted.flatMap((t) => (t.error_x ? t.x.flatMap((x, i) => [x - t.error_x.arrayminus[i], x + t.error_x.array[i]]) : t.x));
  const spanX = [0, ...xs, ...intervals.flatMap((o) => [o.low_pct, o.high_pct]), ...predictedX].filter(Number.isFinite);
  const [lo, hi] = [Math.min(...spanX), Math.max(...spanX)];
  const pad = (hi - lo) * 0.12 || 5;
  const peaks = [...paired.map((p) => p.peak_allocated_bytes / div), ...predicted.flatMap((t) => t.y)];
  const top = Math.max(v.budget_bytes / div, ...peaks);
  const data = [
    { type: 'scatter', mode: 'lines', name: 'measured front', x: front.map((p) => pairedOf(p).estimate_pct),
      y: front.map((p) => p.peak_allocated_bytes / div), line: { color: '#009E73', width: 2 }, hoverinfo: 'skip' },
    { type: 'scatter', mode: 'markers+text', name: 'measured (95% CI)', x: xs, y: paired.map((p) => p.peak_allocated_bytes / div),
      text: paired.map(setting), textposition: xs.map((x) => (x <= (lo + hi) / 2 ? 'middle right' : 'middle left')),
      textfont: { size: LABEL_FONT }, cliponaxis: false,
      error_x: { ...bars(xs, intervals.map((o) => o.low_pct), intervals.map((o) => o.high_pct)), color: '#5A6270' },
      customdata: paired.map((p, i) => [setting(p), fmtBytes(p.peak_allocated_bytes), intervalText(intervals[i])]),
      hovertemplate: '%{customdata[0]}: %{customdata[2]}, peak %{customdata[1]}<extra></extra>',
      marker: { size: MARKER, color: paired.map((p) => (p.fits ? MEASURED : OVER)), line: { color: '#fff', width: 1 } } },
    ...predicted,
  ];
  return {
    data,
    layout: baseLayout({
      title: { text: `${v.model || 'plan'}: peak against step-time overhead (grey: over the budget)` },
      showlegend: true,
      xaxis: { ...baseLayout().xaxis, ...NUMBERS, zeroline: true, zerolinecolor: '#c8ccd2',
        title: { text: `step-time overhead over ${BASELINE}, % (paired, 95% CI)` },
        range: [lo - pad, hi + pad] },
      yaxis: peakAxis(unit, top, 'peak allocated'),
      ...budgetLine(v, unit),
    }),
  };
}

// ------------------------------------------------------------------ labels inside the plot

const POSITIONS = ['top center', 'bottom center', 'middle right', 'middle left', 'top right', 'top left', 'bottom right', 'bottom left'];
let ruler = null;

function textWidth(text) {
  ruler = ruler || document.createElement('canvas').getContext('2d');
  ruler.font = `${LABEL_FONT}px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif`;
  return ruler.measureText(text).width + 2;
}

/** The box (plot pixels) of a label of size w×h at `pos` beside a marker at (px, py), as
 * Plotly places it (Drawing.textPointPosition: an offset of radius / 0.8 + 1). */
function boxAt(pos, px, py, w, h) {
  const r = MARKER / 2 / 0.8 + 1;
  const x0 = pos.includes('right') ? px + r : pos.includes('left') ? px - r - w : px - w / 2;
  const y0 = pos.startsWith('top') ? py - r - h : pos.startsWith('bottom') ? py + r : py - h / 2;
  return { l: x0, r: x0 + w, t: y0, b: y0 + h };
}

const hits = (a, b, gap = 2) => a.l < b.r + gap && b.l < a.r + gap && a.t < b.b + gap && b.t < a.b + gap;
const within = (a, plot) => a.l >= plot.l + 2 && a.r <= plot.r - 2 && a.t >= plot.t + 2 && a.b <= plot.b - 2;

/** The labels of trace `index` as drawn: [{i, box}] in client pixels, and the plot's box. */
function drawnLabels(gd, texts) {
  const plot = gd.querySelector('.nsewdrag');
  if (!plot) return null;
  const p = plot.getBoundingClientRect();
  const nodes = [...gd.querySelectorAll('.scatterlayer .textpoint text')];
  const used = new Set();
  const out = [];
  texts.forEach((t, i) => {
    if (!t) return;
    const node = nodes.find((n) => !used.has(n) && n.textContent === t);
    if (!node) return;
    used.add(node);
    const r = node.getBoundingClientRect();
    out.push({ i, box: { l: r.left, r: r.right, t: r.top, b: r.bottom } });
  });
  return { plot: { l: p.left, r: p.right, t: p.top, b: p.bottom }, labels: out };
}

/**
 * Places the setting labels of the measured points (trace 1 of frontFigure) where each lies
 * inside the plot, clear of the other labels, markers and the budget's name: the first of
 * right, left, above, below and the corners that fits; a label that fits nowhere is left out
 * (the hover and the table name its point). Checked again as drawn; runs again after a resize.
 */
export async function placeLabels(gd, index = 1) {
  const Plotly = window.Plotly;
  const fl = gd && gd._fullLayout;
  const trace = gd && gd.data && gd.data[index];
  if (!Plotly || !fl || !trace || !trace.customdata) return;
  const names = trace.customdata.map((c) => c[0]);
  const xa = fl.xaxis;
  const ya = fl.yaxis;
  const plot = { l: xa._offset, r: xa._offset + xa._length, t: ya._offset, b: ya._offset + ya._length };
  const svg = gd.querySelector('.main-svg').getBoundingClientRect();
  const notes = [...gd.querySelectorAll('.annotation')].map((a) => a.getBoundingClientRect())
    .map((r) => ({ l: r.left - svg.left, r: r.right - svg.left, t: r.top - svg.top, b: r.bottom - svg.top }));
  const px = trace.x.map((x) => xa._offset + xa.l2p(x));
  const py = trace.y.map((y) => ya._offset + ya.l2p(y));
  const markers = px.map((x, i) => ({ l: x - MARKER / 2, r: x + MARKER / 2, t: py[i] - MARKER / 2, b: py[i] + MARKER / 2 }));
  const ex = trace.error_x || {};
  const bar = (arr, i) => ((arr || [])[i] || 0) * Math.abs(xa._m || 0);
  const errorBars = px.map((x, i) => ({ l: x - bar(ex.arrayminus, i), r: x + bar(ex.array, i), t: py[i] - 3, b: py[i] + 3 }));
  // The other traces' markers (the predictions): avoided where a place clear of them exists.
  const others = gd.data.flatMap((t, j) => (j === index || !(t.mode || '').includes('markers') ? []
    : t.x.map((x, k) => ({ x: xa._offset + xa.l2p(x), y: ya._offset + ya.l2p(t.y[k]) }))
      .map(({ x, y }) => ({ l: x - MARKER / 2, r: x + MARKER / 2, t: y - MARKER / 2, b: y + MARKER / 2 }))));
  const placed = [];
  const positions = [];
  const fits = (box, i, strict) => within(box, plot) && !placed.some((b) => hits(b, box)) && !notes.some((b) => hits(b, box))
    && !markers.some((m, j) => j !== i && hits(m, box, 1))
    && (!strict || (!errorBars.some((e) => hits(e, box, 0)) && !others.some((m) => hits(m, box, 1))));
  const texts = names.map((name, i) => {
    const w = textWidth(name);
    const h = LABEL_FONT * 1.3;
    for (const strict of [true, false]) {
      const pos = POSITIONS.find((at) => fits(boxAt(at, px[i], py[i], w, h), i, strict));
      if (pos) {
        placed.push(boxAt(pos, px[i], py[i], w, h));
        positions.push(pos);
        return name;
      }
    }
    positions.push('middle right');
    return '';
  });
  await Plotly.restyle(gd, { text: [texts], textposition: [positions] }, [index]);
  // As drawn: a label that still runs out of the plot or into another one is left out.
  const drawn = drawnLabels(gd, texts);
  if (!drawn) return;
  const bad = new Set();
  drawn.labels.forEach((a, k) => {
    if (!within(a.box, { ...drawn.plot, l: drawn.plot.l - 1, r: drawn.plot.r + 1, t: drawn.plot.t - 1, b: drawn.plot.b + 1 })) bad.add(a.i);
    drawn.labels.slice(k + 1).forEach((b) => { if (hits(a.box, b.box, 0) && !bad.has(a.i)) bad.add(b.i); });
  });
  if (bad.size) await Plotly.restyle(gd, { text: [texts.map((t, i) => (bad.has(i) ? '' : t))] }, [index]);
  if (!gd.dataset.placeLabels) {
    // Again once the plot has its new size or margins (a resize, fitText's relayout).
    gd.dataset.placeLabels = '1';
    let timer = null;
    const again = () => {
      clearTimeout(timer);
      timer = setTimeout(() => { if (gd.isConnected && gd._fullLayout) placeLabels(gd, index); }, 300);
    };
    window.addEventListener('resize', again);
    gd.on('plotly_relayout', again);
  }
}
