/* A queued or running experiment's progress on its page: place in the queue, or its pass
 * and step and about how long is left (the server's words: GET /api/experiments/{id}
 * `progress`, the same arithmetic as `ckptlab run`'s bar: ckptlab/analysis/progress.py),
 * and a bar of the steps done of the run's fixed total (the sweep page's bar styles). */

import { $, STATUS, TERMINAL, api } from './util.js';
import { renderSummary } from './experiment_summary.js';

/** The progress is re-read this often while the run is queued or running. */
const PROGRESS_REFRESH_MS = 2000;

/** The header's "· position 2 in the queue" / "· timed step 7 of 20, about 11 s left" and
 * the bar, both hidden once the run has finished. */
export function renderProgress(exp) {
  const p = $('exp-progress');
  const progress = !TERMINAL.has(exp.status) && exp.progress ? exp.progress : null;
  const text = progress ? progress.text : '';
  p.textContent = text ? `· ${text}` : '';
  p.hidden = !text;
  renderBar(progress);
}

/** The bar: `done_steps` of `total_steps` (steps + timed_steps, fixed from the start: memory
 * steps an early stop skipped count as done), while the run runs. */
function renderBar(progress) {
  const row = $('exp-progress-row');
  const total = progress && progress.queue_position == null ? progress.total_steps : 0;
  row.hidden = !total;
  if (!total) return;
  const done = Math.min(progress.done_steps || 0, total);
  const bar = $('exp-progress-bar');
  bar.setAttribute('aria-valuemax', String(total));
  bar.setAttribute('aria-valuenow', String(done));
  bar.firstElementChild.style.width = `${(100 * done) / total}%`;
  $('exp-progress-count').textContent = `${done} of ${total}`;
}

/** Re-reads `c.exp.progress` every PROGRESS_REFRESH_MS while `current()` holds and the run
 * has not finished (its finish is the stream's, or the poller's, to handle); returns the
 * interval id. */
export function watchProgress(c, current) {
  return setInterval(async () => {
    if (!current() || c.finished) return;
    try {
      const r = await api(`/api/experiments/${c.id}`);
      if (!current() || c.finished || !r.ok || !r.body || TERMINAL.has(r.body.status)) return;
      c.exp = { ...c.exp, progress: r.body.progress };
      renderProgress(c.exp);
      if (r.body.status === STATUS.QUEUED) renderSummary(c.exp, null);
    } catch (_) { /* server unreachable: the banner says so; try again next tick */ }
  }, PROGRESS_REFRESH_MS);
}
