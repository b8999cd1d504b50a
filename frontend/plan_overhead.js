/* A plan's time side in words (issue 31 item 1): the step-time overhead the planner predicted
 * for its plan (plan.predicted_overhead: fractions of the un-checkpointed step with a 95%
 * interval, the blocks and the step timed apart from the run) beside the overhead the run
 * measured, paired round by round with an un-checkpointed copy in its own process
 * (summary.paired_overhead, %). The experiment page's summary and the plan page say it in the
 * same words. The plan's recompute_ms (its recomputation in ms) is stored but not shown. */

import { intervalText } from './plan_front.js';

const pct = (f) => (Number.isFinite(f) ? 100 * f : null);

/** What auto's compiled choice (plan.compiled) compiles, in words: "on the whole step
 * (forward and loss)" or "on the blocks"; plans stored before compile_scope existed compiled
 * the blocks. */
export function scopeWords(c) {
  return c && c.compile_scope === 'step' ? 'on the whole step (forward and loss)' : 'on the blocks';
}

/** Why auto's torch.compile search (plan.compiled, checkpoint.search_compile) did not run
 * the compiler: "torch.compile tried (3 compiled builds): none fits the budget"; '' when it ran it
 * or did not search. The experiment and plan pages say it in the same words. */
export function compiledNotRun(c) {
  if (!c || c.chosen) return '';
  const why = c.why_not || (c.activation_memory_budget === null ? 'none fits the budget' : 'not measurably cheaper');
  return `torch.compile tried (${c.probes.length} compiled builds): ${why}`;
}

/** A predicted overhead in % ({estimate_pct, low_pct, high_pct}) from what the planner stores
 * ({estimate, low, high}: fractions) or what GET /api/plans/{id} serves (already in %); null
 * when there is none (a plan made before the blocks were timed apart, or on fake tensors). */
export function predictedPct(o) {
  if (!o) return null;
  if (Number.isFinite(o.estimate_pct)) return o;
  if (!Number.isFinite(o.estimate)) return null;
  return { estimate_pct: pct(o.estimate), low_pct: pct(o.low), high_pct: pct(o.high) };
}

/** The predicted overhead of `plan` against the run's paired one:
 * "predicted +13% (95% CI +10% to +15%) · measured paired +11% (95% CI +8.2% to +12%)" (paired:
 * round by round with an un-checkpointed copy in the run's process). `paired`: {estimate_pct, low_pct, high_pct} or null (the timing pass was not
 * paired: `skipped` says why, or the run has not finished). */
export function overheadWords(plan, paired, skipped = null) {
  const predicted = predictedPct(plan && plan.predicted_overhead);
  const why = plan && plan.timing_error ? ` (its blocks could not be timed apart: ${plan.timing_error})` : '';
  const said = predicted ? `predicted ${intervalText(predicted)}` : `not predicted${why}`;
  const got = paired ? `measured paired ${intervalText(paired)}` : `not measured paired${skipped ? ` (${skipped})` : ''}`;
  return `${said} · ${got}`;
}
