/* The form's fields for model kinds "hf" and "torchvision": the architectures and their config fields come
 * from GET /api/meta (hf_architectures: type, default, bounds, a small example), so the
 * browser spells none of them. Choosing an architecture fills in its small example; an
 * emptied field is left out of the spec and takes the config class's default. */

import { $, META, el } from './util.js';

const ARCHS = META.hf_architectures || {};

const DATA_TYPES = { int: 'optnum', float: 'optnum', bool: 'optbool', choice: 'optstr', int_list: 'optlist', float_list: 'optlist' };

function shown(value) {
  if (value === null || value === undefined) return '';
  return Array.isArray(value) ? value.join(', ') : String(value);
}

/** One config field as a control named model.<name>, holding `value` ('' = the default). */
function fieldControl(name, f, value) {
  const id = `f-hf-${name}`;
  const type = DATA_TYPES[f.type];
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
  if (control.tagName === 'INPUT') control.defaultValue = control.value; // what the form's reset restores
  else for (const o of control.options) o.defaultSelected = o.value === control.value;
  const range = f.minimum !== undefined ? `, ${f.minimum}–${f.maximum}` : '';
  return el('div', { class: 'field' }, el('label', { for: id }, name), control,
    el('small', { class: 'hint' }, `${f.description}${range}`));
}

/** The input-size field of the family: tokens per sample or image pixels. */
function inputControl(arch, value) {
  const causal = arch.family === 'causal_lm';
  const name = causal ? 'seq_len' : 'image_size';
  return fieldControl(name, {
    type: 'int', default: causal ? 128 : 64, minimum: causal ? 2 : 16, maximum: causal ? 32768 : 1024,
    description: causal ? 'tokens per sample' : 'image height and width, pixels',
  }, value);
}

/** Renders the fields of `name` with `values` (a spec's model, or the architecture's example). */
function render(name, values) {
  const arch = ARCHS[name];
  if (!arch) return;
  $('f-hf-architecture').value = name;
  $('f-hf-blocks').textContent = `blocks: ${arch.blocks}`;
  const attention = $('f-hf-attn');
  attention.closest('.field').hidden = !arch.attention;
  attention.disabled = !arch.attention;
  if (values.attn_implementation) attention.value = values.attn_implementation;
  $('f-hf-fields').replaceChildren(
    inputControl(arch, values.seq_len ?? values.image_size),
    ...Object.entries(arch.fields).map(([field, f]) => fieldControl(field, f, values[field])),
  );
}

/** Fills the architecture choices and renders the first one's example; re-renders on change.
 * Also lists the torchvision architectures (kind torchvision). */
export function initHfFields() {
  $('f-tv-architecture').replaceChildren(...Object.entries(META.torchvision_architectures || {}).map(([name, depth]) =>
    el('option', { value: name }, `${name} — ${depth} blocks`)));
  const select = $('f-hf-architecture');
  select.replaceChildren(...Object.entries(ARCHS).map(([name, a]) =>
    el('option', { value: name }, `${name} — ${a.family === 'causal_lm' ? 'causal LM' : 'image classifier'}`)));
  select.addEventListener('change', () => render(select.value, ARCHS[select.value].example));
  const first = Object.keys(ARCHS)[0];
  if (first) render(first, ARCHS[first].example);
}

/** After the form's reset: the chosen architecture's example again. */
export function resetHf() {
  const select = $('f-hf-architecture');
  if (ARCHS[select.value]) render(select.value, ARCHS[select.value].example);
}

/** Fills the hf fields from a spec's model (presets, "Copy to form"). */
export function fillHf(model) {
  render(model.architecture, model);
}
