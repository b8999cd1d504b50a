/* A queued or running experiment's progress on its page: place in the queue, or step k of
 * N and about how long is left (the server's words: GET /api/experiments/{id} `progress`,
 * the same arithmetic as `ckptlab run`'s bar: ckptlab/analysis/progress.py). */

import { $, STATUS, TERMINAL, api } from './util.js';
import { renderSummary } from './experiment_summary.js';

/** The progress is re-read this often while the run is queued or running. */
const PROGRESS_REFRESH_MS = 2000;

/** The header's "· position 2 in the queue" / "· step 7 of 25, about 11 s left", hidden once
 * the run has finished. */
export function renderProgress(exp) {
  const p = $('exp-progress');
  const text = !TERMINAL.has(exp.status) && exp.progress ? exp.progress.text : '';
  p.textContent = text ? `· ${text}` : '';
  p.hidden = !text;
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
