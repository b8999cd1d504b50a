/* Plotly figures: the per-step charts of one experiment, and the sweep figures the API
 * builds, restyled here (Okabe-Ito colours, binary byte units, WebGL above 1,000 points). */

import { COLORWAY, META, OKABE_ITO, byteUnit, fmtBytes } from './util.js';

/** The gradient chart draws one row per run (horizontal bars) above this many runs. */
const HORIZONTAL_ABOVE = 6;

/** Above this many points a chart uses WebGL traces (scattergl). */
export const GL_THRESHOLD = 1000;

export const PLOT_CONFIG = {
  displaylogo: false,
  responsive: true,
  modeBarButtonsToRemove: ['select2d', 'lasso2d', 'autoScale2d'],
  toImageButtonOptions: { format: 'png', scale: 2 },
};

const FONT = { family: 'system-ui, -apple-system, "Segoe UI", Roboto, sans-serif', size: 12.5, color: '#1f2328' };

export function baseLayout(extra = {}) {
  return {
    margin: { l: 64, r: 18, t: 16, b: 48 },
    font: FONT,
    paper_bgcolor: 'rgba(0,0,0,0)',
    plot_bgcolor: '#fff',
    colorway: COLORWAY,
    legend: { orientation: 'h', x: 0, y: 1.02, yanchor: 'bottom', font: { size: 12 } },
    hoverlabel: { font: { family: FONT.family, size: 12 } },
    xaxis: { gridcolor: '#eceef1', zeroline: false, linecolor: '#c8ccd2', automargin: true },
    yaxis: { gridcolor: '#eceef1', zeroline: false, linecolor: '#c8ccd2', rangemode: 'tozero', automargin: true },
    ...extra,
  };
}

function nPoints(traces) {
  return traces.reduce((n, t) => n + ((t.x && t.x.length) || (t.y && t.y.length) || 0), 0);
}

/**
 * Drops the inner points of runs of equal y (a flat stretch keeps its two ends): the line
 * and its fill look the same, and WebGL fills of long flat runs (parameters, optimizer
 * state never change between steps) stay cheap to triangulate.
 */
export function dropFlatRuns(trace) {
  const { x, y } = trace;
  if (!x || !y || x.length < 3) return trace;
  const keep = [];
  for (let i = 0; i < y.length; i += 1) {
    if (i === 0 || i === y.length - 1 || y[i] !== y[i - 1] || y[i] !== y[i + 1]) keep.push(i);
  }
  if (keep.length === y.length) return trace;
  const pick = (arr) => (Array.isArray(arr) && arr.length === y.length ? keep.map((i) => arr[i]) : arr);
  return { ...trace, x: pick(x), y: pick(y), customdata: pick(trace.customdata) };
}

/** scatter -> scattergl when the figure holds more than GL_THRESHOLD points. */
export function glify(traces) {
  if (nPoints(traces) <= GL_THRESHOLD) return traces;
  return traces.map((t) => ((t.type || 'scatter') === 'scatter' ? dropFlatRuns({ ...t, type: 'scattergl' }) : t));
}

// ------------------------------------------------------------------ one experiment

/** [key, label, colour] of each memory category, in the server's order (GET /api/meta). */
const CATEGORY_COLORS = [OKABE_ITO.blue, OKABE_ITO.orange, OKABE_ITO.green, OKABE_ITO.vermillion, OKABE_ITO.sky, OKABE_ITO.purple, OKABE_ITO.yellow];
export const CATEGORIES = META.memory_categories.map((name, i) => [
  name, name.replace(/_/g, ' '), CATEGORY_COLORS[i % CATEGORY_COLORS.length],
]);

/** The step axis: up to the last step drawn once the run has finished (a memory pass that
 * stopped early ends there), up to `planned` steps while it runs (the axis does not jump). */
function stepAxis(n, planned, finished) {
  const last = finished ? Math.max(n, 1) : Math.max(n, planned || 1);
  return {
    title: { text: 'step' },
    tickformat: 'd',
    dtick: last <= 15 ? 1 : undefined,
    range: [0.5, last + 0.5],
  };
}

function lastStep(steps) {
  return steps.length ? steps[steps.length - 1].step : 0;
}

function warmupShape(spec) {
  const warm = (spec && spec.warmup_steps) || 0;
  if (!warm) return [];
  return [{
    type: 'rect', xref: 'x', yref: 'paper', x0: 0.5, x1: warm + 0.5, y0: 0, y1: 1,
    fillcolor: '#8c8c8c', opacity: 0.12, line: { width: 0 }, layer: 'below',
  }];
}

function emptyNote(steps, finished) {
  if (steps.length) return [];
  return [{
    xref: 'paper', yref: 'paper', x: 0.5, y: 0.5, showarrow: false,
    text: finished ? 'no steps were recorded' : 'waiting for the first step…',
    font: { size: 14, color: '#6b7280' },
  }];
}

/**
 * Memory per step: what was live at the step's peak, stacked by category (from each step's
 * extra.memory_at_peak), with the peak allocated as a line; allocated/peak lines when the
 * steps carry no breakdown.
 */
export function memoryFigure(spec, steps, finished) {
  const gl = steps.length > GL_THRESHOLD;
  const type = gl ? 'scattergl' : 'scatter';
  const maxBytes = Math.max(1, ...steps.map((s) => s.peak_allocated_bytes || 0), ...steps.map((s) => s.reserved_bytes || 0));
  const [div, unit] = byteUnit(maxBytes);
  const scale = (v) => (v === null || v === undefined ? null : v / div);
  const markers = steps.length <= 60;
  const withBreakdown = steps.filter((s) => s.extra && s.extra.memory_at_peak);
  const traces = [];
  if (withBreakdown.length) {
    const x = withBreakdown.map((s) => s.step);
    const cum = new Array(withBreakdown.length).fill(0);
    CATEGORIES.forEach(([key, label, color], i) => {
      const vals = withBreakdown.map((s) => Number(s.extra.memory_at_peak[key]) || 0);
      vals.forEach((v, j) => { cum[j] += v; });
      const trace = {
        type, mode: 'lines', name: label, x, y: cum.map(scale),
        fill: i === 0 ? 'tozeroy' : 'tonexty',
        line: { color, width: 1 }, fillcolor: `${color}B3`,
        customdata: vals.map((v) => fmtBytes(v)),
        hovertemplate: `%{customdata}<extra>${label}</extra>`,
      };
      traces.push(gl ? dropFlatRuns(trace) : trace);
    });
  }
  const line = (key, name, color, dash) => {
    const trace = {
      type, mode: markers ? 'lines+markers' : 'lines', name,
      x: steps.map((s) => s.step), y: steps.map((s) => scale(s[key])),
      customdata: steps.map((s) => fmtBytes(s[key])),
      hovertemplate: `%{customdata}<extra>${name}</extra>`,
      line: { color, width: 2, dash: dash || 'solid' }, marker: { size: 5 },
    };
    return gl ? dropFlatRuns(trace) : trace;
  };
  if (!withBreakdown.length) traces.push(line('allocated_bytes', 'allocated (end of forward)', OKABE_ITO.blue));
  traces.push(line('peak_allocated_bytes', 'peak allocated', OKABE_ITO.black, withBreakdown.length ? 'dot' : 'solid'));
  if (steps.some((s) => s.reserved_bytes !== null && s.reserved_bytes !== undefined)) {
    traces.push(line('reserved_bytes', 'reserved (CUDA cache)', OKABE_ITO.purple, 'dash'));
  }
  const layout = baseLayout({
    hovermode: 'x unified',
    xaxis: { ...baseLayout().xaxis, ...stepAxis(lastStep(steps.filter((s) => s.peak_allocated_bytes != null)), spec && spec.steps, finished) },
    yaxis: { ...baseLayout().yaxis, title: { text: `memory (${unit})` } },
    shapes: warmupShape(spec),
    annotations: emptyNote(steps, finished),
  });
  return { data: traces, layout };
}

/** A step's pass: its record's `extra.pass`; a step streamed live (no extra yet) is timed
 * when it carries no memory reading (the timed steps on CPU, and paired ones, have none). */
function passOf(s) {
  if (s.extra && s.extra.pass) return s.extra.pass;
  return s.peak_allocated_bytes === null || s.peak_allocated_bytes === undefined ? 'timed' : 'memory';
}

/** One panel's traces: forward/backward/optimizer stacked (bars; filled areas above
 * GL_THRESHOLD, WebGL having no stacked bars) and the whole step as a line, on axes `ax`. */
function timeTraces(steps, gl, ax, legend) {
  const x = steps.map((s) => s.step);
  const on = { xaxis: ax.x, yaxis: ax.y, showlegend: legend };
  const phases = [['forward_ms', 'forward', OKABE_ITO.sky], ['backward_ms', 'backward', OKABE_ITO.orange], ['optimizer_ms', 'optimizer', OKABE_ITO.green]];
  const cum = new Array(steps.length).fill(0);
  const traces = phases.map(([key, name, color], i) => {
    if (!gl) return { ...on, type: 'bar', name, legendgroup: name, x, y: steps.map((s) => s[key]), marker: { color }, hovertemplate: `%{y:.2f} ms<extra>${name}</extra>` };
    const vals = steps.map((s) => Number(s[key]) || 0);
    vals.forEach((v, j) => { cum[j] += v; });
    return dropFlatRuns({
      ...on, type: 'scattergl', mode: 'lines', name, legendgroup: name, x, y: cum.slice(), fill: i === 0 ? 'tozeroy' : 'tonexty',
      line: { color, width: 1 }, customdata: vals, hovertemplate: `%{customdata:.2f} ms<extra>${name}</extra>`,
    });
  });
  const stepLine = {
    ...on, type: gl ? 'scattergl' : 'scatter', mode: steps.length <= 60 ? 'lines+markers' : 'lines', name: 'step', legendgroup: 'step',
    x, y: steps.map((s) => s.step_ms), line: { color: OKABE_ITO.black, width: 2 }, marker: { size: 5 }, hovertemplate: '%{y:.2f} ms<extra>step</extra>',
  };
  return [...traces, gl ? dropFlatRuns(stepLine) : stepLine];
}

/**
 * Time per step, by phase. A run with a timing pass gets two panels, each on its own scale:
 * the memory pass (left; its steps run under the memory tracker, several times slower on
 * CPU) and the timed pass (right; its median is the summary's step time), so neither's
 * scale hides the other's.
 */
export function timeFigure(spec, steps, finished) {
  const gl = steps.length > GL_THRESHOLD;
  const timed = steps.filter((s) => passOf(s) === 'timed');
  const memory = steps.filter((s) => passOf(s) !== 'timed');
  const split = Boolean(timed.length || (spec && spec.timed_steps > 0));
  const memDone = finished || timed.length > 0; // the memory pass is over: its axis ends at its last step
  const memAxis = stepAxis(lastStep(memory), spec && spec.steps, memDone);
  const base = baseLayout();
  const layout = baseLayout({
    barmode: 'stack',
    hovermode: 'x unified',
    xaxis: { ...base.xaxis, ...memAxis, title: { text: split ? 'step · memory pass' : 'step' } },
    yaxis: { ...base.yaxis, title: { text: 'time (ms)' } },
    shapes: warmupShape(spec),
    annotations: emptyNote(steps, finished),
  });
  const data = timeTraces(memory, gl, { x: 'x', y: 'y' }, true);
  if (split) {
    const first = memAxis.range[1] + 0.5;
    const last = finished ? Math.max(lastStep(timed), first) : first - 1 + Math.max((spec && spec.timed_steps) || 0, timed.length);
    const share = Math.min(0.5, Math.max(0.25, (first - 1) / (last + 1)));
    layout.xaxis.domain = [0, share];
    layout.xaxis2 = { ...base.xaxis, ...stepAxis(last, 0, true), range: [first - 0.5, last + 0.5], domain: [share + 0.1, 1], anchor: 'y2', title: { text: 'step · timed pass' } };
    layout.yaxis2 = { ...base.yaxis, anchor: 'x2' };
    data.push(...timeTraces(timed, gl, { x: 'x2', y: 'y2' }, false));
  }
  layout.legend.traceorder = 'normal';
  return { data, layout };
}

// ------------------------------------------------------------------ sweep figures

const SERVER_COLORS = { seagreen: OKABE_ITO.green, crimson: OKABE_ITO.vermillion, grey: OKABE_ITO.grey, gray: OKABE_ITO.grey };

function titleText(t) {
  return (t && (typeof t === 'string' ? t : t.text)) || '';
}

/** Scales an axis given in bytes to the binary unit that suits it (MiB, GiB, ...).
 * `key` is a layout axis ("yaxis", "yaxis2"); its traces are those anchored on it. */
function scaleByteAxis(data, layout, key) {
  const axis = key[0];
  const ref = key.replace('axis', '');
  const title = titleText(layout[key] && layout[key].title);
  if (!/bytes/i.test(title)) return;
  const mine = data.filter((t) => (t[`${axis}axis`] || axis) === ref);
  const vals = mine.flatMap((t) => (t[axis] || []).filter((v) => typeof v === 'number'));
  if (!vals.length) return;
  const [div, unit] = byteUnit(Math.max(...vals.map(Math.abs)));
  for (const t of mine) {
    if (!t[axis]) continue;
    t[axis] = t[axis].map((v) => (typeof v === 'number' ? v / div : v));
    const fmt = `%{${axis}:.3~f} ${unit}`;
    if (t.hovertemplate) t.hovertemplate = t.hovertemplate.replace(new RegExp(`%\\{${axis}:[^}]*\\}B`, 'g'), fmt);
    else t.hovertemplate = `${fmt}<extra>%{fullData.name}</extra>`;
  }
  layout[key] = { ...layout[key], title: { text: title.replace(/\(bytes\)/i, `(${unit})`).replace(/^bytes$/i, `memory (${unit})`) } };
}

/**
 * A figure of GET /api/sweeps/{id}/charts/{name}, restyled: Okabe-Ito colours (one colour
 * per legend group, so "activation X" and "peak X" match), byte axes in binary units,
 * WebGL traces above GL_THRESHOLD points. Trace names are kept as the API gives them.
 */
export function sweepFigure(name, fig) {
  const data = JSON.parse(JSON.stringify(fig.data || []));
  const server = fig.layout || {};
  const groups = [];
  for (const t of data) {
    if (t.legendgroup && !groups.includes(t.legendgroup)) groups.push(t.legendgroup);
  }
  let next = 0;
  for (const t of data) {
    const fixed = t.line && t.line.color;
    if (fixed && SERVER_COLORS[fixed]) {
      t.line = { ...t.line, color: SERVER_COLORS[fixed] };
      continue;
    }
    if (t.marker && Array.isArray(t.marker.color)) {
      t.marker = { ...t.marker, color: t.marker.color.map((c) => SERVER_COLORS[c] || c) };
      continue;
    }
    if (fixed) continue;
    const color = t.legendgroup ? COLORWAY[groups.indexOf(t.legendgroup) % COLORWAY.length] : COLORWAY[next++ % COLORWAY.length];
    if (t.type === 'bar') t.marker = { ...(t.marker || {}), color };
    else {
      t.line = { ...(t.line || {}), color };
      t.marker = { ...(t.marker || {}), color };
    }
  }
  if (name === 'pareto') {
    for (const t of data) {
      if (t.name === 'pareto frontier') {
        t.line = { ...(t.line || {}), color: OKABE_ITO.black, width: 1.5, dash: 'dot' };
        t.marker = { ...(t.marker || {}), color: OKABE_ITO.yellow, line: { color: OKABE_ITO.black, width: 1 } };
      } else {
        t.marker = { ...(t.marker || {}), size: 10, symbol: t.name === 'baseline' ? 'square' : 'circle' };
      }
    }
  }
  if (name === 'correctness') {
    // Each bar's verdict beside it, drawn past the plot's edge into a margin that holds it.
    for (const t of data) if (t.type === 'bar') Object.assign(t, { textposition: 'outside', cliponaxis: false });
  }
  const layout = baseLayout({
    title: { text: titleText(server.title), x: 0, xanchor: 'left', font: { size: 14, color: '#1f2328' } },
    margin: { l: 64, r: 18, t: 40, b: 64 },
    hovermode: server.hovermode || 'closest',
    legend: { orientation: 'h', x: 0, y: -0.3, yanchor: 'top', font: { size: 11.5 } },
  });
  // Every axis of the server's figure (subplots have xaxis2 / yaxis2 with their domains).
  const axisKeys = Object.keys(server).filter((k) => /^[xy]axis\d*$/.test(k));
  for (const k of new Set(['xaxis', 'yaxis', ...axisKeys])) {
    const s0 = server[k] || {};
    layout[k] = { ...baseLayout()[k[0] + 'axis'], ...['domain', 'anchor', 'matches', 'showticklabels'].reduce((o, a) => (a in s0 ? { ...o, [a]: s0[a] } : o), {}), title: s0.title };
  }
  layout.xaxis.title = { ...(layout.xaxis.title || {}), standoff: 4 };
  const xKeys = Object.keys(layout).filter((k) => /^xaxis\d*$/.test(k));
  if (name === 'memory_vs_segments' || name === 'time_vs_segments') {
    // Segment counts are few integers, often powers of two: tick exactly at them.
    const xs = [...new Set(data.flatMap((t) => t.x || []).filter((v) => typeof v === 'number' && v > 0))].sort((a, b) => a - b);
    const runXs = [...new Set(data.filter((t) => !/law/.test(t.name || '')).flatMap((t) => t.x || []))].sort((a, b) => a - b);
    for (const k of xKeys) {
      layout[k].type = xs.length > 1 && xs[xs.length - 1] / xs[0] >= 8 ? 'log' : 'linear';
      layout[k].tickmode = 'array';
      layout[k].tickvals = runXs.length ? [...new Set([...(xs.length <= 12 ? xs : []), ...runXs])].sort((a, b) => a - b) : xs;
    }
    const bottom = xKeys.length > 1 ? xKeys[xKeys.length - 1] : 'xaxis';
    for (const k of xKeys) layout[k].title = { text: k === bottom ? 'segments' : '' };
  }
  if (name === 'pareto') layout.xaxis.ticksuffix = '%'; // paired overhead against the baseline
  if (name === 'time_vs_segments') {
    layout.yaxis.rangemode = 'normal';
    layout.yaxis.zeroline = true;
    layout.yaxis.zerolinecolor = '#9aa0a6';
    layout.yaxis.ticksuffix = '%';
  }
  if (name === 'correctness') {
    const runs = Math.max(0, ...data.map((t) => (t.x || []).length));
    if (runs > HORIZONTAL_ABOVE) {
      // Past a few runs their labels would stand on end under the bars and take most of the
      // height: one row per run instead, labels read across.
      for (const t of data) {
        if (t.type !== 'bar') continue;
        [t.x, t.y] = [t.y, t.x];
        t.orientation = 'h';
        t.hovertemplate = '%{y}: %{x:.3g}<extra>%{text}</extra>';
      }
      layout.height = Math.max(380, 120 + 24 * runs);
      const longest = Math.max(0, ...data.flatMap((t) => (t.text || []).map((x) => String(x).length)));
      layout.margin = { ...layout.margin, r: 18 + 7 * longest };
      layout.xaxis = { ...layout.xaxis, exponentformat: 'e', rangemode: 'tozero', title: { text: 'max |Δgrad| vs no checkpointing' } };
      layout.yaxis = { ...layout.yaxis, type: 'category', autorange: 'reversed', rangemode: undefined, title: { text: '' } };
    } else {
      layout.yaxis.exponentformat = 'e';
      const top = Math.max(0, ...data.flatMap((t) => (t.type === 'bar' ? t.y || [] : [])).filter(Number.isFinite));
      if (top > 0) layout.yaxis.range = [0, top * 1.25]; // room above the tallest bar for its verdict
      layout.yaxis.title = { text: 'max |Δgrad|' };
      layout.xaxis.title = { text: '' };
    }
    layout.xaxis.automargin = true;
  }
  for (const k of Object.keys(layout).filter((k) => /^[xy]axis\d*$/.test(k))) scaleByteAxis(data, layout, k);
  if (!data.length || nPoints(data) === 0) {
    layout.annotations = [{
      xref: 'paper', yref: 'paper', x: 0.5, y: 0.5, showarrow: false,
      text: 'appears as runs succeed', font: { size: 13, color: '#6b7280' },
    }];
    layout.xaxis.showticklabels = false;
    layout.yaxis.showticklabels = false;
  }
  return { data: glify(data), layout };
}

// ------------------------------------------------------------------ long runs

/** The per-step metrics a long run is drawn from (GET /api/experiments/{id}/series). */
export const SERIES_METRICS = ['peak_allocated_bytes', 'allocated_bytes', 'reserved_bytes', 'forward_ms', 'backward_ms', 'optimizer_ms', 'step_ms'];

/**
 * Memory and time figures of a long run from downsampled series ({metric: {x, y, total}},
 * of the whole run or of a zoomed step range):
 * lines (each series keeps its own spikes, so they cannot be stacked), WebGL above
 * GL_THRESHOLD points.
 */
export function seriesFigures(spec, series) {
  const sx = (m) => (series[m] && series[m].x) || [];
  const last = Math.max(0, ...SERIES_METRICS.map((m) => sx(m)[sx(m).length - 1] || 0));
  const maxBytes = Math.max(1, ...['peak_allocated_bytes', 'reserved_bytes'].flatMap((m) => (series[m] && series[m].y) || []));
  const [div, unit] = byteUnit(maxBytes);
  const line = (metric, name, color, { bytes = false, dash = 'solid' } = {}) => {
    const s = series[metric];
    if (!s || !s.x.length) return null;
    return {
      type: 'scatter', mode: 'lines', name, x: s.x, y: bytes ? s.y.map((v) => v / div) : s.y,
      line: { color, width: 1.5, dash },
      customdata: bytes ? s.y.map((v) => fmtBytes(v)) : undefined,
      hovertemplate: bytes ? `%{customdata}<extra>${name}</extra>` : `%{y:.2f} ms<extra>${name}</extra>`,
    };
  };
  const n = (v) => v.toLocaleString('en-US');
  const note = (metric) => {
    const s = series[metric];
    if (!s) return '';
    if (s.downsampled) return `${n(s.x.length)} of ${n(s.total)} steps shown (MinMaxLTTB: spikes kept)`;
    return s.step_min != null && s.x.length ? `every step of ${n(s.x[0])}–${n(s.x[s.x.length - 1])} shown` : '';
  };
  const axis = (title) => ({ ...baseLayout().yaxis, title: { text: title } });
  const xaxis = { ...baseLayout().xaxis, ...stepAxis(last, 0, true) };
  const annotation = (text) => (text ? [{
    xref: 'paper', yref: 'paper', x: 1, y: 0.99, xanchor: 'right', yanchor: 'top', showarrow: false, text,
    bgcolor: 'rgba(255,255,255,0.8)', font: { size: 11, color: '#5f6670' },
  }] : []);
  const memory = {
    data: glify([
      line('peak_allocated_bytes', 'peak allocated', OKABE_ITO.black, { bytes: true }),
      line('allocated_bytes', 'allocated (end of forward)', OKABE_ITO.blue, { bytes: true }),
      line('reserved_bytes', 'reserved (CUDA cache)', OKABE_ITO.purple, { bytes: true, dash: 'dash' }),
    ].filter(Boolean)),
    layout: baseLayout({ hovermode: 'x unified', xaxis, yaxis: axis(`memory (${unit})`), shapes: warmupShape(spec), annotations: annotation(note('peak_allocated_bytes')) }),
  };
  const time = {
    data: glify([
      line('forward_ms', 'forward', OKABE_ITO.sky),
      line('backward_ms', 'backward', OKABE_ITO.orange),
      line('optimizer_ms', 'optimizer', OKABE_ITO.green),
      line('step_ms', 'step', OKABE_ITO.black),
    ].filter(Boolean)),
    layout: baseLayout({ hovermode: 'x unified', xaxis, yaxis: axis('time (ms)'), shapes: warmupShape(spec), annotations: annotation(note('step_ms')) }),
  };
  memory.layout.legend.traceorder = 'normal';
  time.layout.legend.traceorder = 'normal';
  return { memory, time };
}
