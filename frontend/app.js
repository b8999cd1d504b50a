/* ckptlab frontend: no build step, no network access beyond this server.
 *
 * Routes (URL hash, so every view, its filters and its budget can be shared as a link):
 *   #/?status=&model_kind=&strategy=&sort=&offset=   experiments and sweeps, live
 *   #/new?mode=sweep&preset=mlp72                    new experiment or sweep
 *   #/experiments/<id>                               one experiment, live per-step charts
 *   #/sweeps/<id>?budget=2GiB&overhead=20&sort=peak  one sweep: charts, runs, recommendation
 *   #/plans/<id>                                     a plan for a memory budget and its verdict
 *   #/predictions/<id>?run=<id>                      a prediction: fits or not, and beside a real run
 *   #/timeline?ids=1,2,3 (or ?sweep=<id>)            memory timelines of several runs on one axis,
 *     &predictions=7,8                               and predictions' (fake tensors) beside them
 *
 * Modules: util.js (the server's vocabulary, formatting, API), live.js (resumable streams),
 * budget.js (lists, sizes, budgets; no DOM), charts.js (Plotly figures),
 * form.js, sweep_plan.js (the server's dry run), list.js, experiment.js, sweep.js, plan.js,
 * timeline.js (one run's memory timeline), timeline_overlay.js (several runs').
 */

import { $, META, apiToken, parseHash, setApiToken, setAuthHandler, setConnectionHandler } from './util.js';
import { initForm, showNew } from './form.js';
import { hideList, initList, showList } from './list.js';
import { hideExperiment, initExperiment, showExperiment } from './experiment.js';
import { hideSweep, initSweep, showSweep } from './sweep.js';
import { hidePlan, showPlan } from './plan.js';
import { hidePrediction, showPrediction } from './prediction.js';
import { hideOverlay, initOverlay, showOverlay } from './timeline_overlay.js';

let sweepSeed = null; // the POST /api/sweeps answer, shown at once on the new sweep's page

setConnectionHandler((ok) => {
  const banner = $('connection');
  if (ok) {
    banner.hidden = true;
  } else {
    banner.textContent = 'Cannot reach the ckptlab server; retrying…';
    banner.hidden = false;
  }
});

/* The API token: asked for only when the server needs one for writes (GET /api/meta);
 * kept for this tab's session and sent as `Authorization: Bearer` by api(). */
function initToken() {
  const form = $('token-form');
  const input = $('api-token');
  const state = $('token-state');
  const show = () => {
    state.textContent = apiToken() ? 'set for this session' : 'needed to submit or cancel';
  };
  form.hidden = !META.write_token_required;
  input.value = apiToken();
  show();
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    setApiToken(input.value.trim());
    show();
    $('auth-needed').hidden = true;
  });
  setAuthHandler((detail) => {
    form.hidden = false;
    const banner = $('auth-needed');
    banner.textContent = apiToken()
      ? `The server refused the API token (${detail}): enter the right one in “API token” at the top and try again.`
      : `This server needs an API token to submit, plan or cancel (${detail}): enter it in “API token” at the top and try again.`;
    banner.hidden = false;
    input.focus();
  });
}

function showView(id) {
  for (const v of document.querySelectorAll('.view')) v.hidden = v.id !== id;
  for (const a of document.querySelectorAll('[data-nav]')) {
    const on = (id === 'view-new' && a.dataset.nav === 'new') || (id === 'view-list' && a.dataset.nav === 'list');
    if (on) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

function route() {
  const { path, params } = parseHash();
  hideList();
  hideExperiment();
  hideSweep();
  hidePlan();
  hidePrediction();
  hideOverlay();
  let m;
  if ((m = /^\/experiments\/(\d+)\/?$/.exec(path))) {
    showView('view-experiment');
    showExperiment(Number(m[1]));
  } else if ((m = /^\/sweeps\/(\d+)\/?$/.exec(path))) {
    showView('view-sweep');
    const seed = sweepSeed;
    sweepSeed = null;
    showSweep(Number(m[1]), params, seed);
  } else if ((m = /^\/plans\/(\d+)\/?$/.exec(path))) {
    showView('view-plan');
    showPlan(Number(m[1]));
  } else if ((m = /^\/predictions\/(\d+)\/?$/.exec(path))) {
    showView('view-prediction');
    showPrediction(Number(m[1]));
  } else if (path === '/timeline') {
    showView('view-timeline');
    showOverlay(params);
  } else if (path === '/new') {
    showView('view-new');
    showNew(params);
  } else {
    showView('view-list');
    showList();
  }
  window.scrollTo(0, 0);
}

initToken();
initForm({
  navigate: (hash) => { location.hash = hash; },
  onSweepCreated: (body) => { sweepSeed = body; },
});
initList();
initExperiment();
initSweep();
initOverlay();
window.addEventListener('hashchange', route);
route();
