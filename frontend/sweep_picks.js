/* The sweep page's picks, told one way (issue 32): beside a recommendation, time is the
 * overhead against the run's own baseline with its 95% CI (paired with an un-checkpointed
 * copy in one process where timed so), never a raw step time of a separate run; and the
 * card, the table's sort and the charts' marks all read the server's one ranking
 * (GET /api/sweeps/{id}/recommendation: `ranking`, `experiment_id`, `smallest_within`). */

import { el, fmtBytes, fmtPct } from './util.js';

/** What a run's own step time is, wherever it is shown beside a comparison. */
export const SEPARATE_RUNS = 'separate runs, not comparable on a busy host';

function ci(low, high) {
  return `95% CI ${fmtPct(low)} to ${fmtPct(high)}`;
}

/**
 * A row's overhead as the table and the card show it: `{main, ci, title}`. `main`: the
 * signed estimate when measurable, "no measurable difference" when not, "—" without one;
 * `ci`: its interval; `title`: the server's words (how it was timed). A baseline: none.
 */
export function overheadParts(row) {
  if (row.role === 'baseline' && row.repeat_of == null) return { main: 'none (the reference)', ci: '', title: 'the baseline: every overhead is against it' };
  const o = row.overhead;
  if (!o) return { main: '—', ci: '', title: row.overhead_text || 'no timed steps' };
  if (row.repeat_of != null) return { main: o.measurable ? `drift ${fmtPct(o.estimate_pct)}` : 'no measurable drift', ci: ci(o.low_pct, o.high_pct), title: row.overhead_text };
  if (o.not_comparable) return { main: 'not comparable', ci: ci(o.low_pct, o.high_pct), title: row.overhead_text };
  const fewRounds = !o.measurable && (o.unmeasured_why || '').startsWith('too few rounds');
  const main = o.measurable ? fmtPct(o.estimate_pct) : fewRounds ? `${fmtPct(o.estimate_pct)}, too few rounds` : 'no measurable difference';
  return { main, ci: ci(o.low_pct, o.high_pct), title: row.overhead_text };
}

/** The card's line for a pick: its label (a link), peak, paired overhead with its CI and
 * activations saved; no raw step time. */
export function pickLine(row, extra) {
  const m = row.metrics;
  const o = overheadParts(row);
  const act = row.role === 'baseline' || m.activation_saving_pct == null ? '' : ` · ${fmtPct(-m.activation_saving_pct)} activations`;
  return [
    el('a', { href: `#/experiments/${row.experiment_id}`, class: 'pick-label' }, row.role === 'baseline' ? 'no checkpointing (baseline)' : row.label),
    el('span', { class: 'pick-stats', title: o.title },
      `peak ${fmtBytes(m.peak_allocated_bytes)} · overhead ${o.main}${o.ci ? ` (${o.ci})` : ''}${act}`,
      extra ? ` · ${extra}` : ''),
  ];
}

/** Rank of each candidate in the server's ranking (1 = fastest), by experiment id. */
export function rankOf(server) {
  return new Map(((server && server.ranking) || []).map((id, i) => [id, i + 1]));
}

const MARKS = {
  recommended: { name: '★ recommended', symbol: 'circle-open', size: 24, color: '#000000' },
  smallest: { name: 'smallest within the overhead', symbol: 'diamond-open', size: 20, color: '#CC79A7' },
};

/**
 * Marks the picks on the drawn charts `divIds`: a ring at each pick's point on every chart
 * whose traces carry experiment ids (Plotly `ids`: the server's pareto and time charts).
 * The marks are traces with `meta.pick` ('recommended' or 'smallest') and the pick's id in
 * `ids`; earlier marks are removed first. `picks`: {recommended, smallest} experiment ids
 * (null for none).
 */
export function markPicks(divIds, picks) {
  const P = window.Plotly;
  if (!P) return;
  for (const id of divIds) {
    const gd = document.getElementById(id);
    if (!gd || !Array.isArray(gd.data)) continue;
    const old = gd.data.map((t, i) => (t.meta && t.meta.pick ? i : -1)).filter((i) => i >= 0);
    if (old.length) P.deleteTraces(gd, old);
    const add = [];
    for (const [kind, pick] of Object.entries(picks)) {
      if (pick == null) continue;
      const key = String(pick);
      const t = gd.data.find((tr) => Array.isArray(tr.ids) && tr.ids.includes(key) && !(tr.meta && tr.meta.pick));
      if (!t) continue;
      const i = t.ids.indexOf(key);
      const mark = MARKS[kind];
      add.push({
        type: 'scatter', mode: 'markers', x: [t.x[i]], y: [t.y[i]], xaxis: t.xaxis, yaxis: t.yaxis, ids: [key],
        name: mark.name, meta: { pick: kind }, showlegend: false, hovertemplate: `${mark.name}<extra></extra>`,
        marker: { symbol: mark.symbol, size: mark.size, color: mark.color, line: { width: 2.5, color: mark.color } },
      });
    }
    if (add.length) P.addTraces(gd, add);
  }
}
