/* Reading the spec form: each enabled control whose name is a spec path becomes that path's
 * value by its data-type; inputs that cannot become JSON at all are client-side errors (the
 * server validates everything else and answers 422 naming the field). */

import { parseBytes, parseList } from './budget.js';

/** Enabled controls whose name is a spec path (not the mode, the sweep name, an axis or the plan's budget). */
function specControls(form) {
  return Array.from(form.querySelectorAll('[name]')).filter(
    (c) => c.name !== 'mode' && c.name !== 'name' && !/^(axes|plan)\./.test(c.name) && !c.matches(':disabled'),
  );
}

function setPath(obj, path, value) {
  const parts = path.split('.');
  let node = obj;
  for (const p of parts.slice(0, -1)) node = node[p] = node[p] || {};
  node[parts[parts.length - 1]] = value;
}

const SKIP = Symbol('skip');

/** A control's text that cannot become JSON, and what to type instead. */
class Invalid {
  constructor(msg) {
    this.msg = msg;
  }
}

/**
 * The value of one control by its data-type. Types starting with "opt" are left out of the
 * spec when empty (the server's default applies): optfloat and optnum (numbers), optbool
 * ("true"/"false"), optstr, optlist ("3, 4, 6, 3" -> [3, 4, 6, 3]); so is an empty bytes.
 * @returns {*} the value, SKIP, or an Invalid for an input that is not JSON
 */
function controlValue(c) {
  const raw = c.type === 'checkbox' ? null : c.value.trim();
  const type = c.dataset.type || 'str';
  if ((type.startsWith('opt') || type === 'bytes') && raw === '') return SKIP;
  switch (type) {
    case 'bool':
      return c.checked;
    case 'int':
    case 'float':
      return raw === '' ? new Invalid('required: type a number') : Number(raw);
    case 'optfloat':
    case 'optnum':
      return Number(raw);
    case 'optbool':
      return raw === 'true';
    case 'optlist': {
      const items = raw.split(/[\s,]+/).filter(Boolean).map(Number);
      return items.some(Number.isNaN) ? new Invalid('a list of numbers, e.g. 3, 4, 6, 3') : items;
    }
    case 'bytes': {
      const v = parseBytes(raw);
      return v === null ? new Invalid('not a size: use bytes or units such as 512 MiB, 24 GiB') : v;
    }
    case 'json':
      try {
        return JSON.parse(raw || '{}');
      } catch (_) {
        return new Invalid('not valid JSON, e.g. {"hidden": 512}');
      }
    default:
      return raw === null ? c.value : raw;
  }
}

/**
 * The spec the form describes, and client-side errors for inputs that cannot be turned
 * into JSON at all.
 * @param {HTMLFormElement} form
 * @returns {{spec: object, errors: {input: Element, msg: string}[]}}
 */
export function readSpec(form) {
  const spec = {};
  const errors = [];
  for (const c of specControls(form)) {
    const v = controlValue(c);
    if (v === SKIP) continue;
    if (v instanceof Invalid) {
      errors.push({ input: c, msg: v.msg });
      continue;
    }
    setPath(spec, c.name, v);
  }
  return { spec, errors };
}

/**
 * The sweep axes ticked in the form, and errors for lists that do not parse.
 * @param {HTMLFormElement} form
 * @returns {{axes: Object<string, Array>, errors: {input: Element, msg: string}[]}}
 */
export function readAxes(form) {
  const axes = {};
  const errors = [];
  for (const toggle of form.querySelectorAll('[data-axis]')) {
    if (!toggle.checked) continue;
    const path = toggle.dataset.axis;
    const box = toggle.closest('.axis');
    const list = box.querySelector('[data-list]');
    if (list) {
      const { values, error } = parseList(list.value, list.dataset.list);
      if (error) errors.push({ input: list, msg: error });
      else axes[path] = values;
    } else {
      const values = Array.from(box.querySelectorAll('[data-axis-value]:checked'), (c) =>
        c.value === 'true' ? true : c.value === 'false' ? false : c.value,
      );
      if (!values.length) errors.push({ input: box, msg: 'tick at least one value' });
      else axes[path] = values;
    }
  }
  return { axes, errors };
}

/**
 * Sets a control to a spec value by its data-type (presets, "Copy to form"): a checkbox's
 * state, JSON text for a json field, '' for null; undefined leaves it as it is.
 * @param {HTMLInputElement|HTMLSelectElement} c
 * @param {*} v
 */
export function setControl(c, v) {
  if (v === undefined) return;
  if (c.type === 'checkbox') c.checked = Boolean(v);
  else if (c.dataset.type === 'json') c.value = JSON.stringify(v ?? {});
  else c.value = v === null ? '' : String(v);
}
