/* ckptlab frontend: one page, no build step, no network access beyond this server.
 *
 * Routes (URL hash, so a view can be shared as a link):
 *   #/                  the "New experiment" form and the experiments list
 *   #/experiments/<id>  one experiment: status, spec, summary and per-step charts
 *
 * Every view polls the API once a second; the experiment view stops when the experiment
 * has finished (status "succeeded" or "failed").
 */
(function () {
  'use strict';

  const POLL_MS = 1000;
  const LIST_LIMIT = 100;
  const TERMINAL = new Set(['succeeded', 'failed']);
  const MIB = 1024 * 1024;

  // Okabe-Ito: distinguishable with the common forms of colour blindness.
  const COLORS = {
    orange: '#E69F00',
    sky: '#56B4E9',
    green: '#009E73',
    yellow: '#F0E442',
    blue: '#0072B2',
    vermillion: '#D55E00',
    purple: '#CC79A7',
    black: '#000000',
  };

  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------------ formatting

  /** 123456789 -> "117.7 MiB" (binary units, as PyTorch's memory tools use). */
  function fmtBytes(n) {
    if (n === null || n === undefined || !Number.isFinite(Number(n))) return '—';
    n = Number(n);
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    let v = Math.abs(n);
    while (v >= 1024 && i < units.length - 1) {
      v /= 1024;
      i += 1;
    }
    const sign = n < 0 ? '-' : '';
    if (i === 0) return `${sign}${v} B`;
    return `${sign}${v.toFixed(v < 10 ? 2 : 1)} ${units[i]}`;
  }

  /** milliseconds -> "0.42 ms", "12.3 ms", "1,234 ms" */
  function fmtMs(ms) {
    if (ms === null || ms === undefined || !Number.isFinite(Number(ms))) return '—';
    ms = Number(ms);
    if (Math.abs(ms) < 10) return `${ms.toFixed(2)} ms`;
    if (Math.abs(ms) < 1000) return `${ms.toFixed(1)} ms`;
    return `${Math.round(ms).toLocaleString('en-US')} ms`;
  }

  function fmtInt(n) {
    if (n === null || n === undefined) return '—';
    return Number(n).toLocaleString('en-US');
  }

  /** ISO timestamp -> Date; one without a zone is UTC (the server stores UTC). */
  function parseDate(iso) {
    const s = String(iso);
    return new Date(/(Z|[+-]\d\d:?\d\d)$/i.test(s) ? s : `${s}Z`);
  }

  function fmtDate(iso) {
    if (!iso) return '—';
    const d = parseDate(iso);
    return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
  }

  function fmtDuration(startIso, endIso) {
    if (!startIso || !endIso) return null;
    const s = (parseDate(endIso) - parseDate(startIso)) / 1000;
    if (!Number.isFinite(s) || s < 0) return null;
    if (s < 60) return `${s.toFixed(1)} s`;
    return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  }

  /** "mlp 32x1024" (depth x width). The form only makes MLPs; experiments made through the
   * API or the CLI can use the other model kinds. */
  function modelLabel(spec) {
    const m = (spec && spec.model) || {};
    switch (m.kind) {
      case 'mlp': return `mlp ${m.depth}x${m.width}`;
      case 'transformer': return `transformer ${m.depth}x${m.d_model}`;
      case 'resnet': return `resnet ${m.depth}x${m.channels}ch`;
      case 'densenet': return `densenet ${m.depth}x${m.growth_rate}k`;
      case 'custom': return `custom ${m.name} ${m.depth}`;
      default: return `${m.kind || '?'} ${m.depth ?? ''}`.trim();
    }
  }

  /** "sequential (4)": the strategy and its parameter. */
  function strategyLabel(spec) {
    const c = (spec && spec.checkpoint) || {};
    switch (c.strategy) {
      case 'sequential': return `sequential (${c.segments})`;
      case 'per_block': return `per_block (every ${c.every})`;
      case 'selective': return `selective (${c.policy}, every ${c.every})`;
      default: return String(c.strategy || 'none');
    }
  }

  /** Strategies that recompute through torch.utils.checkpoint (where the flags matter). */
  const RECOMPUTING = new Set(['sequential', 'per_block', 'selective']);

  /** yes/no for a checkpoint flag; a dash when nothing is recomputed (the flag is unused). */
  function flagLabel(spec, key) {
    const c = (spec && spec.checkpoint) || {};
    if (!RECOMPUTING.has(c.strategy)) return '—';
    return c[key] ? 'yes' : 'no';
  }

  /** Element builder: el('td', {class: 'num'}, 'text', childNode). Text is never parsed as HTML. */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') node.className = v;
      else if (k === 'dataset') Object.assign(node.dataset, v);
      else node.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function statusBadge(status) {
    return el('span', { class: `badge status-${status}` }, status);
  }

  // ------------------------------------------------------------------ API

  /** fetch + JSON; returns {ok, status, body}. Network errors show the connection banner. */
  async function api(path, options) {
    let resp;
    try {
      resp = await fetch(path, Object.assign({ headers: { Accept: 'application/json' } }, options));
    } catch (err) {
      setConnection(false);
      throw err;
    }
    setConnection(true);
    const text = await resp.text();
    let body = null;
    if (text) {
      try {
        body = JSON.parse(text);
      } catch (_) {
        body = text;
      }
    }
    return { ok: resp.ok, status: resp.status, body };
  }

  function setConnection(ok) {
    const banner = $('connection');
    if (ok) {
      banner.hidden = true;
    } else {
      banner.textContent = 'Cannot reach the ckptlab server; retrying…';
      banner.hidden = false;
    }
  }

  function detailText(body) {
    if (body && typeof body === 'object' && 'detail' in body) {
      return typeof body.detail === 'string' ? body.detail : JSON.stringify(body.detail);
    }
    return typeof body === 'string' ? body : JSON.stringify(body);
  }

  // ------------------------------------------------------------------ polling

  let activePoll = null;

  /** Runs `tick` now and then POLL_MS after each run finishes, until it returns false or
   * stopPolling() is called. `tick` gets a handle whose `stopped` flag tells it to drop a
   * response that arrived after the user left the view. */
  function startPolling(tick) {
    stopPolling();
    const handle = { stopped: false, timer: null };
    activePoll = handle;
    const run = async () => {
      if (handle.stopped) return;
      let again = true;
      try {
        again = await tick(handle);
      } catch (err) {
        console.error(err);
      }
      if (!handle.stopped && again !== false) handle.timer = setTimeout(run, POLL_MS);
    };
    run();
    return handle;
  }

  function stopPolling() {
    if (activePoll) {
      activePoll.stopped = true;
      clearTimeout(activePoll.timer);
      activePoll = null;
    }
  }

  // ------------------------------------------------------------------ form

  const form = $('experiment-form');

  function numberValue(name) {
    const raw = form.elements.namedItem(name).value.trim();
    if (raw === '') return null; // the server answers with a 422 naming the field
    const n = Number(raw);
    return Number.isFinite(n) ? n : raw;
  }

  function value(name) {
    return form.elements.namedItem(name).value;
  }

  function checked(name) {
    return form.elements.namedItem(name).checked;
  }

  /** The ExperimentSpec JSON the API expects. */
  function readSpec() {
    return {
      model: {
        kind: 'mlp',
        depth: numberValue('model.depth'),
        width: numberValue('model.width'),
        dropout: numberValue('model.dropout'),
      },
      batch_size: numberValue('batch_size'),
      steps: numberValue('steps'),
      warmup_steps: numberValue('warmup_steps'),
      checkpoint: {
        strategy: value('checkpoint.strategy'),
        segments: numberValue('checkpoint.segments'),
        use_reentrant: checked('checkpoint.use_reentrant'),
        preserve_rng_state: checked('checkpoint.preserve_rng_state'),
      },
      amp: value('amp'),
      optimizer: value('optimizer'),
      device: value('device'),
      seed: numberValue('seed'),
    };
  }

  /** Whether the form can show this spec (it makes MLPs with the strategies it lists). */
  function formCanHold(spec) {
    const m = (spec && spec.model) || {};
    const c = (spec && spec.checkpoint) || {};
    const strategies = Array.from(form.elements.namedItem('checkpoint.strategy').options, (o) => o.value);
    return m.kind === 'mlp' && m.stem !== false && strategies.includes(c.strategy);
  }

  /** Fills the form from a spec (the "Copy spec to form" button). */
  function fillForm(spec) {
    const set = (name, v) => {
      const input = form.elements.namedItem(name);
      if (!input || v === undefined || v === null) return;
      if (input.type === 'checkbox') input.checked = Boolean(v);
      else input.value = String(v);
    };
    const m = spec.model || {};
    const c = spec.checkpoint || {};
    set('model.depth', m.depth);
    set('model.width', m.width);
    set('model.dropout', m.dropout);
    set('batch_size', spec.batch_size);
    set('steps', spec.steps);
    set('warmup_steps', spec.warmup_steps);
    set('checkpoint.strategy', c.strategy);
    set('checkpoint.segments', c.segments);
    set('checkpoint.use_reentrant', c.use_reentrant);
    set('checkpoint.preserve_rng_state', c.preserve_rng_state);
    set('amp', spec.amp);
    set('optimizer', spec.optimizer);
    set('device', spec.device);
    set('seed', spec.seed);
    clearErrors();
  }

  function clearFieldError(input) {
    const field = input.closest('.field');
    if (field) field.querySelectorAll('.field-error').forEach((n) => n.remove());
    input.removeAttribute('aria-invalid');
    input.removeAttribute('aria-describedby');
  }

  function clearErrors() {
    form.querySelectorAll('.field-error').forEach((n) => n.remove());
    form.querySelectorAll('[aria-invalid]').forEach((n) => {
      n.removeAttribute('aria-invalid');
      n.removeAttribute('aria-describedby');
    });
    const box = $('form-error');
    box.replaceChildren();
    box.hidden = true;
  }

  function showFormError(...lines) {
    const box = $('form-error');
    if (lines.length === 1) {
      box.append(el('p', null, lines[0]));
    } else {
      box.append(el('ul', null, ...lines.map((l) => el('li', null, l))));
    }
    box.hidden = false;
  }

  function inputNamed(path) {
    return path ? form.querySelector(`[name="${CSS.escape(path)}"]`) : null;
  }

  /** The input an error location points at, or null. `model` is a tagged union on `kind`,
   * so pydantic puts the tag in the location: ["model", "mlp", "width"] is "model.width". */
  function inputForLoc(loc, spec) {
    const direct = inputNamed(loc.join('.'));
    if (direct) return direct;
    let obj = spec;
    for (let i = 0; i < loc.length - 1; i += 1) {
      if (i > 0 && obj && typeof obj === 'object' && obj.kind === loc[i]) {
        return inputNamed(loc.slice(0, i).concat(loc.slice(i + 1)).join('.'));
      }
      obj = obj && typeof obj === 'object' ? obj[loc[i]] : undefined;
    }
    return null;
  }

  /** FastAPI 422 detail -> a message next to each named input, the rest in #form-error. */
  function showValidationErrors(detail, spec) {
    const general = [];
    let first = null;
    for (const item of detail) {
      const loc = Array.isArray(item.loc) ? item.loc.slice() : [];
      if (loc[0] === 'body') loc.shift();
      const path = loc.join('.');
      const msg = item.msg || JSON.stringify(item);
      const input = inputForLoc(loc, spec);
      if (!input) {
        general.push(path ? `${path}: ${msg}` : msg);
        continue;
      }
      const field = input.closest('.field') || input.parentElement;
      const errId = `${input.id}-error-${field.querySelectorAll('.field-error').length}`;
      field.append(el('p', { class: 'field-error', id: errId }, msg));
      input.setAttribute('aria-invalid', 'true');
      const described = input.getAttribute('aria-describedby');
      input.setAttribute('aria-describedby', described ? `${described} ${errId}` : errId);
      if (!first) first = input;
    }
    if (general.length) showFormError(...general);
    if (first) first.focus();
  }

  async function onSubmit(event) {
    event.preventDefault();
    clearErrors();
    const button = $('submit');
    button.disabled = true;
    button.textContent = 'Submitting…';
    const spec = readSpec();
    try {
      const r = await api('/api/experiments', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
        body: JSON.stringify(spec),
      });
      if (r.ok && r.body && r.body.id !== undefined) {
        location.hash = `#/experiments/${r.body.id}`;
      } else if (r.status === 422 && r.body && Array.isArray(r.body.detail)) {
        showValidationErrors(r.body.detail, spec);
      } else {
        showFormError(`The server refused the experiment (HTTP ${r.status}): ${detailText(r.body)}`);
      }
    } catch (err) {
      showFormError(`Cannot reach the server: ${err.message}`);
    } finally {
      button.disabled = false;
      button.textContent = 'Run experiment';
    }
  }

  form.addEventListener('submit', onSubmit);
  form.addEventListener('reset', clearErrors);
  form.addEventListener('input', (e) => {
    if (e.target.getAttribute('aria-invalid') === 'true') clearFieldError(e.target);
  });

  // ------------------------------------------------------------------ home view

  let lastListKey = null;

  function renderList(page) {
    const key = JSON.stringify(page);
    if (key === lastListKey) return;
    lastListKey = key;

    const rows = (page.data || []).map((exp) => {
      const s = exp.summary || {};
      const href = `#/experiments/${exp.id}`;
      const tr = el(
        'tr',
        { dataset: { id: exp.id }, class: 'clickable', title: `Open experiment ${exp.id}` },
        el('td', null, el('a', { href }, String(exp.id))),
        el('td', null, modelLabel(exp.spec)),
        el('td', null, strategyLabel(exp.spec)),
        el('td', null, flagLabel(exp.spec, 'use_reentrant')),
        el('td', null, flagLabel(exp.spec, 'preserve_rng_state')),
        el('td', null, (exp.spec && exp.spec.amp) || '—'),
        el('td', { class: 'status' }, statusBadge(exp.status)),
        el('td', { class: 'num', title: s.activation_bytes != null ? `${fmtInt(s.activation_bytes)} bytes` : null },
          fmtBytes(s.activation_bytes)),
        el('td', { class: 'num', title: s.peak_allocated_bytes != null ? `${fmtInt(s.peak_allocated_bytes)} bytes` : null },
          fmtBytes(s.peak_allocated_bytes)),
        el('td', { class: 'num' }, fmtMs(s.step_time_ms)),
      );
      tr.addEventListener('click', (e) => {
        if (e.target.closest('a')) return; // the link navigates by itself
        location.hash = href;
      });
      return tr;
    });
    $('experiments').tBodies[0].replaceChildren(...rows);
    $('experiments-empty').hidden = rows.length > 0;
    const count = page.count ?? rows.length;
    $('experiments-count').textContent =
      count > rows.length ? `newest ${rows.length} of ${count}` : `${count} total`;
  }

  function showHome() {
    showView('view-home');
    document.title = 'ckptlab';
    startPolling(async (handle) => {
      const r = await api(`/api/experiments?limit=${LIST_LIMIT}`);
      if (handle.stopped) return false;
      if (r.ok && r.body) renderList(r.body);
      return true;
    });
  }

  // ------------------------------------------------------------------ experiment view

  let current = null; // {id, spec, chartKey}

  function kv(dl, entries) {
    const nodes = [];
    for (const [label, val, opts] of entries) {
      nodes.push(el('dt', null, label));
      nodes.push(el('dd', opts || null, val));
    }
    dl.replaceChildren(...nodes);
  }

  function renderSpec(spec) {
    const m = spec.model || {};
    const c = spec.checkpoint || {};
    const modelParts = Object.entries(m)
      .filter(([k]) => k !== 'kind')
      .map(([k, v]) => `${k} ${typeof v === 'object' && v !== null ? JSON.stringify(v) : v}`);
    const entries = [
      ['Model', [m.kind, ...modelParts].join(' · ')],
      ['Batch size', fmtInt(spec.batch_size)],
      ['Steps', `${spec.steps} (${spec.warmup_steps} warm-up)`],
      ['Checkpointing', c.strategy === 'sequential' ? `sequential, ${c.segments} segments` : strategyLabel(spec)],
    ];
    if (RECOMPUTING.has(c.strategy)) {
      entries.push(['use_reentrant', String(c.use_reentrant)]);
      entries.push(['preserve_rng_state', String(c.preserve_rng_state)]);
    }
    entries.push(['AMP', spec.amp], ['Optimizer', spec.optimizer], ['Device', spec.device], ['Seed', String(spec.seed)]);
    kv($('exp-spec'), entries);
    $('exp-spec-json').textContent = JSON.stringify(spec, null, 2);
  }

  function renderSummary(exp) {
    const s = exp.summary;
    $('summary-pending').hidden = Boolean(s);
    $('summary-pending').textContent =
      exp.status === 'failed' ? 'The run failed before producing a summary.' : 'No results yet.';
    if (!s) {
      $('exp-summary').replaceChildren();
      $('exp-warnings-box').hidden = true;
    } else {
      const device = s.device_name && s.device_name !== s.device ? `${s.device} (${s.device_name})` : s.device;
      kv($('exp-summary'), [
        ['Activation memory', fmtBytes(s.activation_bytes), { title: `${fmtInt(s.activation_bytes)} bytes` }],
        ['Peak allocated', fmtBytes(s.peak_allocated_bytes), { title: `${fmtInt(s.peak_allocated_bytes)} bytes` }],
        ...(s.recompute_peak_bytes !== undefined && s.recompute_peak_bytes !== null
          ? [['Recomputation peak', fmtBytes(s.recompute_peak_bytes), { title: `${fmtInt(s.recompute_peak_bytes)} bytes` }]]
          : []),
        ['Step time (median)', fmtMs(s.step_time_ms)],
        ['Forward / backward / optimizer', `${fmtMs(s.forward_ms)} / ${fmtMs(s.backward_ms)} / ${fmtMs(s.optimizer_ms)}`],
        ['Parameters', fmtInt(s.param_count)],
        ['Params without grad', fmtInt(s.params_without_grad), s.params_without_grad > 0 ? { class: 'bad' } : null],
        ['Final loss', s.final_loss === null || s.final_loss === undefined ? '—' : Number(s.final_loss).toPrecision(5)],
        ['Device', device || '—'],
        ['PyTorch', s.torch_version || '—'],
      ]);
      const warnings = s.warnings || [];
      $('exp-warnings').replaceChildren(...warnings.map((w) => el('li', null, w)));
      $('exp-warnings-box').hidden = warnings.length === 0;
    }

    const errBox = $('exp-error');
    if (exp.error) {
      errBox.replaceChildren(el('strong', null, 'Error'), el('pre', null, exp.error));
      errBox.hidden = false;
    } else {
      errBox.hidden = true;
    }

    const parts = [`created ${fmtDate(exp.created_at)}`];
    if (exp.started_at) parts.push(`started ${fmtDate(exp.started_at)}`);
    if (exp.finished_at) {
      const took = fmtDuration(exp.started_at, exp.finished_at);
      parts.push(`finished ${fmtDate(exp.finished_at)}${took ? ` (took ${took})` : ''}`);
    }
    if (exp.worker_id) parts.push(`worker ${exp.worker_id}`);
    if (exp.attempt > 1) parts.push(`attempt ${exp.attempt}`);
    $('exp-timing').textContent = parts.join(' · ');
  }

  function setStatus(status) {
    const node = $('exp-status');
    node.textContent = status;
    node.className = `status badge status-${status}`;
  }

  // ---- charts

  const PLOT_CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ['select2d', 'lasso2d'] };

  function baseLayout(spec, steps, yTitle, finished) {
    const n = steps.length ? steps[steps.length - 1].step : (spec && spec.steps) || 1;
    const layout = {
      margin: { l: 64, r: 16, t: 8, b: 48 },
      font: { family: 'system-ui, -apple-system, "Segoe UI", Roboto, sans-serif', size: 13, color: '#222' },
      paper_bgcolor: 'rgba(0,0,0,0)',
      plot_bgcolor: '#fff',
      legend: { orientation: 'h', x: 0, y: 1.02, yanchor: 'bottom' },
      hovermode: 'x unified',
      xaxis: {
        title: { text: 'step' },
        tickformat: 'd',
        dtick: Math.max(n, (spec && spec.steps) || 1) <= 15 ? 1 : undefined,
        range: [0.5, Math.max(n, (spec && spec.steps) || 1) + 0.5],
        gridcolor: '#eee',
        zeroline: false,
      },
      yaxis: { title: { text: yTitle }, rangemode: 'tozero', gridcolor: '#eee', zeroline: false },
      shapes: [],
      annotations: [],
    };
    const warm = (spec && spec.warmup_steps) || 0;
    if (warm > 0) {
      // Shade the warm-up steps: they are left out of the summary's medians.
      layout.shapes.push({
        type: 'rect', xref: 'x', yref: 'paper', x0: 0.5, x1: warm + 0.5, y0: 0, y1: 1,
        fillcolor: '#999', opacity: 0.12, line: { width: 0 }, layer: 'below',
      });
    }
    if (!steps.length) {
      layout.annotations.push({
        xref: 'paper', yref: 'paper', x: 0.5, y: 0.5, showarrow: false,
        text: finished ? 'no steps were recorded' : 'waiting for the first step…',
        font: { size: 14, color: '#777' },
      });
    }
    return layout;
  }

  function memoryTraces(steps) {
    const x = steps.map((s) => s.step);
    const line = (key, name, color, dash) => ({
      type: 'scatter',
      mode: 'lines+markers',
      name,
      x,
      y: steps.map((s) => (s[key] === null || s[key] === undefined ? null : s[key] / MIB)),
      customdata: steps.map((s) => fmtBytes(s[key])),
      hovertemplate: `%{customdata}<extra>${name}</extra>`,
      line: { color, width: 2, dash: dash || 'solid' },
      marker: { size: 6 },
    });
    const traces = [
      line('allocated_bytes', 'allocated', COLORS.blue),
      line('peak_allocated_bytes', 'peak allocated', COLORS.vermillion),
    ];
    if (steps.some((s) => s.reserved_bytes !== null && s.reserved_bytes !== undefined)) {
      traces.push(line('reserved_bytes', 'reserved', COLORS.sky, 'dot'));
    }
    return traces;
  }

  function timeTraces(steps) {
    const x = steps.map((s) => s.step);
    const bar = (key, name, color) => ({
      type: 'bar',
      name,
      x,
      y: steps.map((s) => s[key]),
      marker: { color },
      hovertemplate: `%{y:.2f} ms<extra>${name}</extra>`,
    });
    return [
      bar('forward_ms', 'forward', COLORS.sky),
      bar('backward_ms', 'backward', COLORS.orange),
      bar('optimizer_ms', 'optimizer', COLORS.green),
      {
        type: 'scatter',
        mode: 'lines+markers',
        name: 'step',
        x,
        y: steps.map((s) => s.step_ms),
        line: { color: COLORS.black, width: 2 },
        marker: { size: 6 },
        hovertemplate: `%{y:.2f} ms<extra>step</extra>`,
      },
    ];
  }

  async function renderCharts(spec, steps, finished) {
    if (!window.Plotly) {
      for (const id of ['chart-memory', 'chart-time']) {
        $(id).textContent = 'Charts unavailable: /static/plotly.min.js did not load.';
      }
      return;
    }
    const memLayout = baseLayout(spec, steps, 'memory (MiB)', finished);
    const timeLayout = baseLayout(spec, steps, 'time (ms)', finished);
    timeLayout.barmode = 'stack';
    timeLayout.legend.traceorder = 'normal'; // forward, backward, optimizer, step (not reversed)
    await Promise.all([
      Plotly.react('chart-memory', memoryTraces(steps), memLayout, PLOT_CONFIG),
      Plotly.react('chart-time', timeTraces(steps), timeLayout, PLOT_CONFIG),
    ]);
  }

  function resetExperimentView(id) {
    current = { id, spec: null, chartKey: null };
    $('exp-title').textContent = `Experiment #${id}`;
    $('exp-status').textContent = '';
    $('exp-status').className = 'status';
    $('exp-timing').textContent = '';
    $('exp-notfound').hidden = true;
    $('exp-error').hidden = true;
    $('exp-summary').replaceChildren();
    $('exp-spec').replaceChildren();
    $('exp-spec-json').textContent = '';
    $('exp-warnings-box').hidden = true;
    $('summary-pending').hidden = false;
    $('summary-pending').textContent = 'Loading…';
    if (window.Plotly) {
      Plotly.purge('chart-memory');
      Plotly.purge('chart-time');
    }
  }

  function showExperiment(id) {
    showView('view-experiment');
    resetExperimentView(id);
    startPolling(async (handle) => {
      // The experiment first, then its steps: once the experiment reads as finished,
      // the steps fetched after it are complete.
      const r = await api(`/api/experiments/${id}`);
      if (handle.stopped) return false;
      if (r.status === 404) {
        const nf = $('exp-notfound');
        nf.textContent = `There is no experiment ${id}.`;
        nf.hidden = false;
        $('summary-pending').textContent = '';
        return false;
      }
      if (!r.ok || !r.body) return true; // transient error: try again
      const exp = r.body;

      const sr = await api(`/api/experiments/${id}/steps`);
      if (handle.stopped) return false;
      const steps = sr.ok && sr.body && Array.isArray(sr.body.data) ? sr.body.data : [];

      current.spec = exp.spec;
      $('exp-copy').hidden = !formCanHold(exp.spec);
      $('exp-title').textContent = `Experiment #${exp.id} · ${modelLabel(exp.spec)} · ${strategyLabel(exp.spec)}`;
      renderSpec(exp.spec);
      renderSummary(exp);

      const finished = TERMINAL.has(exp.status);
      const chartKey = JSON.stringify([finished, steps.length, steps.length ? steps[steps.length - 1] : null]);
      if (chartKey !== current.chartKey) {
        await renderCharts(exp.spec, steps, finished);
        if (handle.stopped) return false;
        current.chartKey = chartKey;
      }
      // The status last, so that "succeeded" on screen means the charts are complete.
      setStatus(exp.status);
      document.title = `ckptlab · #${exp.id} ${exp.status}`;
      return !finished;
    });
  }

  $('exp-copy').addEventListener('click', () => {
    if (!current || !current.spec) return;
    fillForm(current.spec);
    location.hash = '#/';
    requestAnimationFrame(() => $('form-title').scrollIntoView({ behavior: 'smooth' }));
  });

  // ------------------------------------------------------------------ router

  function showView(id) {
    for (const v of document.querySelectorAll('.view')) v.hidden = v.id !== id;
  }

  function route() {
    stopPolling();
    const m = /^#\/experiments\/(\d+)\/?$/.exec(location.hash);
    if (m) showExperiment(Number(m[1]));
    else showHome();
  }

  window.addEventListener('hashchange', route);
  route();
})();
