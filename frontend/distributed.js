/* spec.distributed (DistributedSpec in ckptlab/spec/experiment.py): the form's "Distributed"
 * fieldset, its choices and bounds read from /api/meta's spec_schema (a field shows for the
 * kinds its data-dist names; "sharded" is every kind but one process), and how a spec's ranks
 * are named on the other pages. A spec of one process sends no `distributed`: the server's
 * default, and what every run had before the block existed. */

import { $, META, fmtInt, syncOptions } from './util.js';
import { setControl } from './form_read.js';

const DEFS = (META.spec_schema && META.spec_schema.$defs) || {};
/** DistributedSpec's JSON schema; null from a server without one (the fieldset hides). */
const SCHEMA = DEFS.DistributedSpec || null;
const MP_SCHEMA = DEFS.MixedPrecisionSpec || null;

function prop(schema, name) {
  return (schema && schema.properties && schema.properties[name]) || {};
}

/** The kind of a run of one process: the schema's default. */
export const ONE_PROCESS = prop(SCHEMA, 'kind').default || 'none';

/** Whether a spec runs on several ranks (DDP or FSDP2). */
export function isSharded(spec) {
  const d = spec && spec.distributed;
  return Boolean(d && d.kind && d.kind !== ONE_PROCESS);
}

/** "fsdp2 × 2" for a sharded spec, '' for one process. */
export function distributedLabel(spec) {
  if (!isSharded(spec)) return '';
  return `${spec.distributed.kind} × ${spec.distributed.world_size ?? '?'}`;
}

/** The Batch row of a spec: "8 per rank (16 over 2 ranks)" when sharded. */
export function batchText(spec) {
  const accum = spec.grad_accum_steps > 1 ? ` × ${spec.grad_accum_steps} accumulated` : '';
  if (!isSharded(spec)) return `${fmtInt(spec.batch_size)}${accum}`;
  const ws = spec.distributed.world_size;
  return `${fmtInt(spec.batch_size)} per rank${accum} (${fmtInt(spec.batch_size * ws)} over ${fmtInt(ws)} ranks)`;
}

/** The spec panel's rows for the distributed block: none for one process. */
export function distributedRows(spec) {
  if (!isSharded(spec)) return [];
  const d = spec.distributed;
  const parts = [d.kind, `${fmtInt(d.world_size)} ranks`];
  if (d.shard_unit && d.kind === 'fsdp2') parts.push(`shard unit ${d.shard_unit}`);
  if (d.find_unused_parameters && d.kind === 'ddp') parts.push('find_unused_parameters');
  if (d.reshard_after_forward !== undefined && d.kind === 'fsdp2') parts.push(`reshard after forward ${d.reshard_after_forward ? 'on' : 'off'}`);
  const mp = d.mixed_precision;
  if (mp) parts.push(`mixed precision: ${mp.param_dtype} params, ${mp.reduce_dtype} reduce`);
  else if (d.kind === 'fsdp2') parts.push('no mixed precision');
  return [['Distributed', parts.join(' · '), { id: 'exp-distributed' }]];
}

// ------------------------------------------------------------------ the form

/** The option of `select` that form.reset() brings back. */
function keepDefault(select, value) {
  if (value === undefined) return;
  for (const o of select.options) o.defaultSelected = o.value === String(value);
  select.value = String(value);
}

/** Choices and bounds from the schema; without DistributedSpec the fieldset hides and sends nothing. */
export function buildDistributedControls() {
  const fieldset = $('distributed-fieldset');
  if (!SCHEMA) {
    fieldset.hidden = true;
    fieldset.disabled = true;
    return;
  }
  const choices = (id, schema, name) => {
    const p = prop(schema, name);
    if (Array.isArray(p.enum)) syncOptions($(id), p.enum);
    keepDefault($(id), p.default);
  };
  choices('distributed.kind', SCHEMA, 'kind');
  choices('distributed.shard_unit', SCHEMA, 'shard_unit');
  choices('distributed.mixed_precision.param_dtype', MP_SCHEMA, 'param_dtype');
  choices('distributed.mixed_precision.reduce_dtype', MP_SCHEMA, 'reduce_dtype');
  const ws = prop(SCHEMA, 'world_size');
  const input = $('distributed.world_size');
  if (ws.minimum !== undefined) input.min = ws.minimum;
  if (ws.maximum !== undefined) input.max = ws.maximum;
  input.nextElementSibling.textContent = `ranks, one process each; ${input.min}–${fmtInt(input.max)}`;
  const reshard = prop(SCHEMA, 'reshard_after_forward');
  if (typeof reshard.default === 'boolean') $('distributed.reshard_after_forward').defaultChecked = reshard.default;
}

/** Shows the fields the chosen kind reads (the others are disabled, so not sent). */
export function syncDistributed() {
  if (!SCHEMA) return;
  const kind = $('distributed.kind').value;
  const mp = $('distributed.mixed_precision').value === 'on';
  for (const node of $('distributed-fieldset').querySelectorAll('[data-dist]')) {
    const want = node.dataset.dist;
    let on = want === 'sharded' ? kind !== ONE_PROCESS : want.split(' ').includes(kind);
    if ('distMp' in node.dataset) on = on && mp;
    node.hidden = !on;
    for (const c of node.querySelectorAll('input, select')) c.disabled = !on;
  }
}

/** Fills the fieldset from a spec's `distributed` (absent: one process). */
export function fillDistributed(d) {
  if (!SCHEMA) return;
  const v = d || {};
  setControl($('distributed.kind'), v.kind ?? ONE_PROCESS);
  const ws = $('distributed.world_size');
  ws.value = isSharded({ distributed: v }) && v.world_size != null ? String(v.world_size) : ws.defaultValue;
  setControl($('distributed.shard_unit'), v.shard_unit ?? prop(SCHEMA, 'shard_unit').default);
  setControl($('distributed.reshard_after_forward'), v.reshard_after_forward ?? prop(SCHEMA, 'reshard_after_forward').default);
  setControl($('distributed.find_unused_parameters'), v.find_unused_parameters ?? false);
  const mp = v.mixed_precision || null;
  $('distributed.mixed_precision').value = mp ? 'on' : 'off';
  for (const key of ['param_dtype', 'reduce_dtype']) {
    setControl($(`distributed.mixed_precision.${key}`), (mp && mp[key]) ?? prop(MP_SCHEMA, key).default);
  }
  syncDistributed();
}

/** readSpec's answer without `distributed` when it names one process (the server's default). */
export function dropOneProcess(read) {
  if (read.spec.distributed && !isSharded(read.spec)) delete read.spec.distributed;
  return read;
}
