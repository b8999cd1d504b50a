/* The sweep page's header: name, axes, progress bar and counts per status, invalid
 * combinations. */

import { $, STATUS, STATUSES, api, el, fmtDate, modelLabel, shortName, valueText } from './util.js';

export { shortName, valueText };

export function num(v) {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

// ------------------------------------------------------------------ header and progress

export function renderProgress(p, cancelled) {
  if (!p) return;
  $('sweep-progress-text').textContent = `${p.finished} of ${p.total}`;
  $('sweep-eta').textContent = p.eta_text ? ` · ${p.eta_text}` : '';
  const bar = $('sweep-progress-bar');
  bar.setAttribute('aria-valuemax', String(p.total));
  bar.setAttribute('aria-valuenow', String(p.finished));
  const c = p.counts || {};
  const parts = [];
  const frac = (k) => (p.total ? (100 * (c[k] || 0)) / p.total : 0);
  bar.replaceChildren(
    el('span', { class: 'seg ok', style: `width:${frac(STATUS.SUCCEEDED)}%` }),
    el('span', { class: 'seg bad', style: `width:${frac(STATUS.FAILED) + frac(STATUS.OOM) + frac(STATUS.TIMED_OUT)}%` }),
    el('span', { class: 'seg cancelled', style: `width:${frac(STATUS.CANCELLED)}%` }),
    el('span', { class: 'seg running', style: `width:${frac(STATUS.RUNNING)}%` }),
  );
  for (const k of [STATUS.SUCCEEDED, STATUS.RUNNING, ...STATUSES.filter((s) => s !== STATUS.SUCCEEDED && s !== STATUS.RUNNING)]) {
    if (c[k]) parts.push(`${c[k]} ${k.replace('_', ' ')}`);
  }
  $('sweep-counts').textContent = parts.join(' · ');
  const done = p.finished >= p.total;
  $('sweep-cancel').hidden = done || cancelled;
}

export function renderHeader(sw) {
  $('sweep-title').textContent = `Sweep #${sw.id} · ${sw.name}`;
  document.title = `ckptlab · sweep #${sw.id}`;
  const axes = Object.entries(sw.axes || {}).map(([p, vs]) => `${shortName(p)} ${vs.map(valueText).join(', ')}`).join(' × ');
  const base = sw.base || {};
  const baseText = [modelLabel(base), base.batch_size ? `batch ${base.batch_size}` : null, base.steps ? `${base.steps} steps` : null,
    base.device || null, base.optimizer || null, base.amp && base.amp !== 'off' ? `amp ${base.amp}` : null].filter(Boolean).join(' · ');
  const ck = base.checkpoint || {};
  const strategy = ck.strategy && !(sw.axes || {})['checkpoint.strategy'] ? ` · ${ck.strategy}` : '';
  $('sweep-desc').replaceChildren(...[
    el('span', null, 'Axes: ', el('strong', null, axes || '—')), ' · ',
    el('span', null, 'base: ', baseText, strategy), ' · ',
    el('span', null, `created ${fmtDate(sw.created_at)}`),
    sw.cancelled ? el('span', { class: 'badge status-cancelled' }, STATUS.CANCELLED) : null,
  ].filter(Boolean));
  const id = sw.id;
  $('sweep-downloads').replaceChildren(
    el('a', { href: `/api/sweeps/${id}/results?format=csv`, download: `sweep-${id}-results.csv`, class: 'button secondary small' }, 'Results CSV'),
    el('a', { href: `/api/sweeps/${id}/results`, download: `sweep-${id}-results.json`, class: 'button secondary small' }, 'Results JSON'),
    el('a', { href: `/api/experiments/export?format=csv&sweep_id=${id}`, download: `sweep-${id}-experiments.csv`, class: 'button secondary small' }, 'Experiments CSV'),
    el('a', { href: `#/timeline?sweep=${id}`, id: 'sweep-overlay', class: 'button secondary small', title: 'memory timelines of its runs on one axis' }, 'Overlay timelines'),
  );
  renderProgress(sw.progress, sw.cancelled);
  const invalid = sw.invalid || [];
  $('sweep-invalid').hidden = invalid.length === 0;
  $('sweep-invalid-list').replaceChildren(...invalid.map((inv) => el('li', null,
    el('code', null, Object.entries(inv.values).map(([p, v]) => `${shortName(p)}=${valueText(v)}`).join(' ')),
    inv.baseline ? ' (baseline)' : '', ': ', inv.errors.map((e) => e.msg).join('; '))));
}
