/* A sharded run on the experiment page (summary.ranks, spec.distributed): the "Memory per
 * rank" card: one stacked bar per rank (what that rank held at its own peak, by category;
 * the rank whose figures the page reports outlined and labelled), the world size and global
 * batch, each rank's peak in a table, and the check of the sharded gradients against one
 * process on the same global batch. Hidden for a run of one process. */

import { $, OKABE_ITO, byteUnit, el, fmtBytes, fmtDiff, fmtInt, loadPlotly } from './util.js';
import { CATEGORIES, PLOT_CONFIG, baseLayout } from './charts.js';
import { fitText } from './chart_fit.js';

let ticket = 0; // the latest render: an earlier one still loading Plotly does not draw

/** The ranks of a summary in rank order, or null for a run of one process. */
function ranksOf(s) {
  return s && Array.isArray(s.ranks) && s.ranks.length ? [...s.ranks].sort((a, b) => a.rank - b.rank) : null;
}

/** The rank the run reports: the summary's, else the one with the highest peak. */
function worstRank(s, ranks) {
  if (Number.isInteger(s.worst_rank)) return s.worst_rank;
  return ranks.reduce((w, r) => ((r.peak_allocated_bytes || 0) > (w.peak_allocated_bytes || 0) ? r : w)).rank;
}

const total = (m) => Object.values(m || {}).reduce((a, v) => a + (Number(v) || 0), 0);

/**
 * One stacked bar per rank: its memory at its own peak by category (the server's categories,
 * in their order and colours, then any it names beside them); the peak allocated alone when
 * no rank has a breakdown. The reported rank is outlined and labelled above its bar.
 */
export function ranksFigure(s) {
  const ranks = ranksOf(s);
  const worst = worstRank(s, ranks);
  const x = ranks.map((r) => `rank ${r.rank}`);
  const height = ranks.map((r) => Math.max(r.peak_allocated_bytes || 0, total(r.memory_at_peak)));
  const [div, unit] = byteUnit(Math.max(1, ...height));
  const outline = { color: OKABE_ITO.black, width: ranks.map((r) => (r.rank === worst ? 2 : 0)) };
  const known = new Set(CATEGORIES.map(([key]) => key));
  const extra = [...new Set(ranks.flatMap((r) => Object.keys(r.memory_at_peak || {})))].filter((k) => !known.has(k));
  const series = [...CATEGORIES, ...extra.map((k) => [k, k.replace(/_/g, ' '), OKABE_ITO.grey])];
  const bar = (name, color, vals) => ({
    type: 'bar', name, x, y: vals.map((v) => v / div),
    marker: { color, line: outline },
    customdata: vals.map((v) => fmtBytes(v)),
    hovertemplate: `%{customdata}<extra>${name}</extra>`,
  });
  let data = series
    .map(([key, label, color]) => [label, color, ranks.map((r) => Number((r.memory_at_peak || {})[key]) || 0)])
    .filter(([, , vals]) => vals.some((v) => v > 0))
    .map(([label, color, vals]) => bar(label, color, vals));
  if (!data.length) data = [bar('peak allocated', OKABE_ITO.blue, ranks.map((r) => r.peak_allocated_bytes || 0))];
  const at = ranks.findIndex((r) => r.rank === worst);
  const layout = baseLayout({
    barmode: 'stack',
    bargap: ranks.length <= 4 ? 0.45 : 0.2,
    hovermode: 'x unified',
    xaxis: { ...baseLayout().xaxis, type: 'category' },
    yaxis: { ...baseLayout().yaxis, title: { text: `memory at the rank's peak (${unit})` } },
    annotations: at < 0 ? [] : [{
      x: x[at], y: height[at] / div, yanchor: 'bottom', showarrow: false, yshift: 2,
      text: 'reported (highest peak)', font: { size: 11.5, color: OKABE_ITO.black },
    }],
  });
  layout.yaxis.range = [0, (1.12 * Math.max(1, ...height)) / div];
  layout.legend.traceorder = 'normal';
  return { data, layout };
}

/** "2 ranks (fsdp2) · global batch 16 (8 per rank × 2) · this page reports rank 1's figures …" */
function noteParts(exp, ranks, worst) {
  const s = exp.summary;
  const d = exp.spec.distributed || {};
  const ws = s.world_size ?? ranks.length;
  const global = s.global_batch_size ?? (exp.spec.batch_size * ws);
  return [
    el('strong', null, `${fmtInt(ws)} ranks`), d.kind ? ` (${d.kind})` : '',
    ' · global batch ', el('strong', null, fmtInt(global)), ` (${fmtInt(exp.spec.batch_size)} per rank × ${fmtInt(ws)})`,
    ' · this page reports ', el('strong', null, `rank ${worst}`), "'s figures, the highest peak of the ranks",
  ];
}

/** The sharded gradients against one process on the same global batch. */
function gradParts(exp) {
  const g = exp.summary.sharded_gradients;
  if (!g) {
    return [el('span', { class: 'badge neutral' }, 'not verified'), exp.spec.verify_gradients === false
      ? ' verify_gradients is off: the sharded gradients were not compared with one process'
      : ' no comparison with one process was recorded'];
  }
  const n = `${fmtInt(g.params_compared)} parameter${g.params_compared === 1 ? '' : 's'}`;
  const loss = typeof g.loss_diff === 'number' ? `; loss ${g.loss_diff === 0 ? 'identical' : `differs by ${fmtDiff(g.loss_diff)}`}` : '';
  const err = fmtDiff(g.worst_rel_error);
  if (g.match) {
    return [el('span', { class: 'badge ok' }, '✓ match'),
      ` gradients match one process on the same global batch (worst relative error ${err} ≤ tolerance ${fmtDiff(g.tolerance)}, ${n})${loss}`];
  }
  return [el('span', { class: 'badge bad' }, '✗ differ'),
    ` gradients differ from one process on the same global batch: worst relative error ${err} > tolerance ${fmtDiff(g.tolerance)}`,
    g.worst_param ? [' in ', el('code', null, g.worst_param)] : '', ` (${n} compared)${loss}`];
}

/** Each rank's peak, where it was reached, its activations (and reserved, on CUDA). */
function rankTable(ranks, worst) {
  const reserved = ranks.some((r) => r.reserved_bytes !== null && r.reserved_bytes !== undefined);
  const num = (v) => el('td', { class: 'num', title: v === null || v === undefined ? null : `${fmtInt(v)} bytes` }, fmtBytes(v));
  return el('table', { class: 'data compact ranks-table' },
    el('thead', null, el('tr', null, el('th', null, 'rank'), el('th', { class: 'num' }, 'peak allocated'), el('th', null, 'peak in'),
      el('th', { class: 'num' }, 'activation memory'), reserved ? el('th', { class: 'num' }, 'reserved') : null)),
    el('tbody', null, ranks.map((r) => el('tr', { class: r.rank === worst ? 'reported' : null, dataset: { rank: r.rank } },
      el('td', null, String(r.rank), r.rank === worst ? el('span', { class: 'tag tag-rec' }, 'reported') : null),
      num(r.peak_allocated_bytes), el('td', null, r.peak_phase || '—'), num(r.activation_bytes),
      reserved ? num(r.reserved_bytes) : null))));
}

/** Hides the card (a new experiment page); a render still loading Plotly is dropped. */
export function resetRanks() {
  ticket += 1;
  $('exp-ranks').hidden = true;
  if (window.Plotly) window.Plotly.purge('ranks-chart');
}

/** The card for `exp`: shown when its summary has ranks, hidden otherwise. */
export async function renderRanks(exp) {
  const mine = ++ticket;
  const s = exp.summary;
  const ranks = ranksOf(s);
  const card = $('exp-ranks');
  if (!ranks) {
    card.hidden = true;
    return;
  }
  const worst = worstRank(s, ranks);
  card.hidden = false;
  $('ranks-note').replaceChildren(...noteParts(exp, ranks, worst));
  const grads = $('sharded-grads');
  grads.replaceChildren(...gradParts(exp).flat());
  grads.classList.toggle('bad', Boolean(s.sharded_gradients && !s.sharded_gradients.match));
  $('ranks-table').replaceChildren(rankTable(ranks, worst));
  let Plotly;
  try {
    Plotly = await loadPlotly();
  } catch (err) {
    $('ranks-chart').textContent = `Chart unavailable: ${err.message}.`;
    return;
  }
  if (mine !== ticket) return;
  const fig = ranksFigure(s);
  await Plotly.react('ranks-chart', fig.data, fig.layout, PLOT_CONFIG);
  if (mine === ticket) await fitText($('ranks-chart'));
}
