/* The form's model fields, from the model-kind table of GET /api/meta (model_kind_table): the
 * kind choices (option text: each kind's summary), and one field group per kind drawn from its
 * fields (type, title, bounds, default, description; option_text for choices) holding its
 * example as starting values, so the browser spells no kind, field or bound of its own.
 * A kind with renderer "hf_config" (Hugging Face configs) also shows the chosen architecture's
 * config fields from hf_architectures: choosing an architecture fills in its small example,
 * and an emptied field is left out of the spec and takes the config class's default. */

import { $, DEFAULT_KIND, META, MODEL_KIND, MODEL_KINDS, el } from './util.js';
import { setControl } from './form_read.js';

const ARCHS = META.hf_architectures || {};

/** hf config field type -> the form's data-type (form_read.js); empty means "the default". */
const CONFIG_TYPES = { int: 'optnum', float: 'optnum', bool: 'optbool', choice: 'optstr', int_list: 'optlist', float_list: 'optlist' };

function shown(value) {
  if (value === null || value === undefined) return '';
  return Array.isArray(value) ? value.join(', ') : String(value);
}

/** "1–1024", "0–<1", "≥ 1": a field's bounds as the hint says them ('' without bounds). */
function range(f) {
  const lo = f.minimum ?? (f.exclusive_minimum !== undefined ? `>${f.exclusive_minimum}` : undefined);
  const hi = f.maximum ?? (f.exclusive_maximum !== undefined ? `<${f.exclusive_maximum}` : undefined);
  if (lo !== undefined && hi !== undefined) return `${lo}–${hi}`;
  if (lo !== undefined) return `≥ ${lo}`;
  return hi !== undefined ? `≤ ${hi}` : '';
}

/** A field's title with a line break allowed after each underscore (num_key_<wbr>value_<wbr>heads):
 * long config names wrap inside their field instead of running into the next one. */
function breakable(title) {
  return String(title).split(/(?<=_)/).flatMap((part, i) => (i ? [el('wbr'), part] : [part]));
}

function hint(f) {
  return el('small', { class: 'hint' }, [f.description, range(f)].filter(Boolean).join(', '));
}

/** What form.reset() restores: the value the control was drawn with. */
function keepAsDefault(control) {
  if (control.type === 'checkbox') control.defaultChecked = control.checked;
  else if (control.tagName === 'SELECT') for (const o of control.options) o.defaultSelected = o.value === control.value;
  else control.defaultValue = control.value;
}

/**
 * One declared field of a kind (model_kind_table fields) as a control named model.<name>
 * with id f-<kind>-<name>, holding `value` (the kind's example, else the field's default).
 */
function fieldControl(kind, name, f, value) {
  const id = `f-${kind.name}-${name}`;
  const attrs = { id, name: `model.${name}` };
  let control;
  if (f.type === 'bool') {
    control = el('input', { ...attrs, type: 'checkbox', 'data-type': 'bool' });
    control.checked = Boolean(value);
    keepAsDefault(control);
    return el('div', { class: 'field check' }, control, el('label', { for: id }, breakable(f.title)), hint(f));
  }
  if (f.type === 'choice') {
    const texts = (kind.option_text || {})[name] || {};
    control = el('select', { ...attrs, 'data-type': f.nullable ? 'optstr' : 'str' },
      f.nullable ? el('option', { value: '' }, 'default') : null,
      ...f.enum.map((v) => el('option', { value: v }, texts[v] || v)));
  } else if (f.type === 'int' || f.type === 'float') {
    const type = f.nullable ? 'optnum' : f.type;
    control = el('input', { ...attrs, type: 'number', min: f.minimum, max: f.maximum, step: f.type === 'int' ? 1 : 'any', 'data-type': type });
  } else if (f.type === 'json') {
    control = el('input', { ...attrs, type: 'text', 'data-type': 'json' });
    value = JSON.stringify(value ?? {});
  } else {
    const placeholder = f.examples ? f.examples[0] : null;
    control = el('input', { ...attrs, type: 'text', maxlength: f.max_length, placeholder, 'data-type': f.nullable ? 'optstr' : 'str' });
  }
  control.value = value === undefined || value === null ? '' : String(value);
  keepAsDefault(control);
  const title = f.type === 'json' ? `${f.title} (JSON)` : f.title;
  return el('div', { class: f.type === 'json' ? 'field wide' : 'field' }, el('label', { for: id }, breakable(title)), control, hint(f));
}

/** The kind's declared fields with `values`, each in its own control. */
function declaredFields(kind, values, names = Object.keys(kind.fields)) {
  return names.map((name) => fieldControl(kind, name, kind.fields[name], values[name] ?? kind.fields[name].default));
}

// ------------------------------------------------------------------ renderer hf_config

/** One architecture config field (hf_architectures fields) as a control named model.<name>. */
function configControl(kind, name, f, value) {
  const id = `f-${kind.name}-${name}`;
  const type = CONFIG_TYPES[f.type];
  let control;
  if (f.type === 'bool' || f.type === 'choice') {
    const choices = f.type === 'bool' ? ['true', 'false'] : f.choices;
    control = el('select', { id, name: `model.${name}`, 'data-type': type },
      el('option', { value: '' }, `default (${shown(f.default)})`),
      ...choices.map((c) => el('option', { value: c }, c)));
  } else {
    const number = !f.type.endsWith('_list');
    control = el('input', {
      id, name: `model.${name}`, 'data-type': type, type: number ? 'number' : 'text',
      placeholder: f.default === null ? 'derived' : shown(f.default),
      ...(number ? { min: f.minimum, max: f.maximum, step: f.type === 'float' ? 'any' : 1 } : {}),
    });
  }
  control.value = shown(value);
  keepAsDefault(control);
  return el('div', { class: 'field' }, el('label', { for: id }, breakable(name)), control, hint(f));
}

/** Draws the chosen architecture's fields with `values` (a spec's model, or its example). */
function renderConfig(kind, arch, values) {
  const a = ARCHS[arch];
  if (!a) return;
  const prefix = `f-${kind.name}`;
  $(`${prefix}-architecture`).value = arch;
  $(`${prefix}-blocks`).textContent = `blocks: ${a.blocks}`;
  const attention = $(`${prefix}-attn_implementation`);
  attention.closest('.field').hidden = !a.attention;
  attention.disabled = !a.attention;
  attention.value = values.attn_implementation || kind.fields.attn_implementation.default;
  const size = a.family === 'causal_lm' ? 'seq_len' : 'image_size'; // the input size the family reads
  $(`${prefix}-fields`).replaceChildren(
    fieldControl(kind, size, { ...kind.fields[size], nullable: true, title: size }, values[size]),
    ...Object.entries(a.fields).map(([name, f]) => configControl(kind, name, f, values[name])),
  );
}

const RENDERERS = {
  hf_config: {
    /** The architecture and attention choices, the blocks hint and the config fields. */
    draw(kind) {
      const [arch, attention] = declaredFields(kind, kind.example, ['architecture', 'attn_implementation']);
      arch.append(el('small', { class: 'hint', id: `f-${kind.name}-blocks` }));
      const select = arch.querySelector('select');
      select.addEventListener('change', () => renderConfig(kind, select.value, ARCHS[select.value].example));
      return [el('div', { class: 'row' }, arch, attention), el('div', { class: 'row', id: `f-${kind.name}-fields` })];
    },
    after: (kind) => renderConfig(kind, kind.example.architecture, kind.example),
    fill: (kind, model) => renderConfig(kind, model.architecture, model),
    reset(kind) {
      const arch = $(`f-${kind.name}-architecture`).value;
      if (ARCHS[arch]) renderConfig(kind, arch, ARCHS[arch].example);
    },
  },
};

// ------------------------------------------------------------------ the groups

/** The kind choices and one field group per kind (hidden but the chosen kind's, by form.js). */
export function buildModelControls() {
  const select = $('model.kind');
  select.replaceChildren(...MODEL_KINDS.map((name) => el('option', { value: name }, `${name} — ${MODEL_KIND.get(name).summary}`)));
  select.value = DEFAULT_KIND;
  keepAsDefault(select);
  $('model-kind-groups').replaceChildren(...MODEL_KINDS.map((name) => {
    const kind = MODEL_KIND.get(name);
    const renderer = RENDERERS[kind.renderer];
    const body = renderer ? renderer.draw(kind) : [el('div', { class: 'row' }, declaredFields(kind, kind.example))];
    return el('fieldset', { class: 'kind-group', 'data-kind': name, hidden: true, disabled: true },
      ...body, kind.note ? el('p', { class: 'muted small' }, kind.note) : null);
  }));
  for (const name of MODEL_KINDS) {
    const renderer = RENDERERS[MODEL_KIND.get(name).renderer];
    if (renderer) renderer.after(MODEL_KIND.get(name));
  }
}

/** Fills the chosen kind's group from a spec's model (presets, "Copy to form"). */
export function fillModel(model) {
  const kind = MODEL_KIND.get(model.kind || DEFAULT_KIND);
  if (!kind) return;
  const renderer = RENDERERS[kind.renderer];
  if (renderer) renderer.fill(kind, model);
  const group = document.querySelector(`.kind-group[data-kind="${CSS.escape(kind.name)}"]`);
  if (!renderer) for (const c of group.querySelectorAll('[name]')) setControl(c, model[c.name.slice('model.'.length)]);
}

/** After the form's reset: each drawn-by-renderer group's example again. */
export function resetModel() {
  for (const name of MODEL_KINDS) {
    const kind = MODEL_KIND.get(name);
    if (RENDERERS[kind.renderer]) RENDERERS[kind.renderer].reset(kind);
  }
}
