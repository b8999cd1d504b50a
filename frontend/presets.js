/* Presets of the form (#/new?preset=...) and the names of the sweep axes. */

/** Presets from the seed documents (../shared/docs/domain.md) plus a quick CPU check. */
export const PRESETS = {
  mlp72: {
    spec: {
      model: { kind: 'mlp', depth: 72, width: 1000, dropout: 0, stem: true },
      batch_size: 256, steps: 5, warmup_steps: 1, grad_accum_steps: 1,
      checkpoint: { strategy: 'sequential', segments: 4, use_reentrant: false, preserve_rng_state: true },
      amp: 'off', optimizer: 'adam', device: 'auto', seed: 0,
    },
    axes: { 'checkpoint.segments': '1,2,4,8,16,36' },
  },
  resnet: {
    spec: {
      model: { kind: 'resnet', depth: 9, channels: 16, image_size: 64, dropout: 0 },
      batch_size: 8, steps: 5, warmup_steps: 1, grad_accum_steps: 1,
      checkpoint: { strategy: 'sequential', segments: 3, use_reentrant: false, preserve_rng_state: true },
      amp: 'off', optimizer: 'adam', device: 'auto', seed: 0,
    },
    axes: { 'checkpoint.segments': '1,3,9' },
  },
  gpt: {
    spec: {
      model: { kind: 'transformer', depth: 6, d_model: 256, heads: 4, seq_len: 256, vocab_size: 1000, dropout: 0 },
      batch_size: 8, steps: 5, warmup_steps: 1, grad_accum_steps: 1,
      checkpoint: { strategy: 'per_block', every: 1, policy: 'save_matmuls', use_reentrant: false, preserve_rng_state: true },
      amp: 'off', optimizer: 'adamw', device: 'auto', seed: 0,
    },
    axes: { 'checkpoint.segments': '1,2,3,6', 'checkpoint.every': '1,2,3' },
  },
  tiny: {
    spec: {
      model: { kind: 'mlp', depth: 8, width: 64, dropout: 0, stem: true },
      batch_size: 16, steps: 3, warmup_steps: 1, grad_accum_steps: 1,
      checkpoint: { strategy: 'sequential', segments: 2, use_reentrant: false, preserve_rng_state: true },
      amp: 'off', optimizer: 'adam', device: 'cpu', seed: 0,
    },
    axes: { 'checkpoint.segments': '2,4' },
  },
};

export const AXIS_NAMES = {
  'checkpoint.strategy': ['strategy', 'strategies'],
  'checkpoint.segments': ['segment count', 'segment counts'],
  'checkpoint.every': ['group size', 'group sizes'],
  'checkpoint.preserve_rng_state': ['RNG setting', 'RNG settings'],
  'checkpoint.use_reentrant': ['reentrant setting', 'reentrant settings'],
  amp: ['AMP mode', 'AMP modes'],
  batch_size: ['batch size', 'batch sizes'],
};
