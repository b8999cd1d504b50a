"""Attention as the target runs it: ``torch.nn.functional.scaled_dot_product_attention``
calls routed, under fake tensors, to the ATen op of the backend the target picks, so that
autograd saves what that backend saves for backward.

On CUDA, ``scaled_dot_product_attention`` picks flash, memory-efficient or math attention
(:meth:`ckptlab.prediction.targets.Target.sdpa_backend`) and each keeps different tensors
for backward (PyTorch ``aten/src/ATen/native/transformers/attention.cpp`` and
``derivatives.yaml``):

- flash (``_scaled_dot_product_flash_attention``): q, k, v, the output and a logsumexp of
  ``(B, H, L)`` in fp32, plus its RNG state; grouped-query attention natively;
- memory-efficient (``_scaled_dot_product_efficient_attention``): q, k, v, the bias, the
  output and a logsumexp of ``(B, H, ceil(L / 32) * 32)`` in fp32 (a boolean mask becomes a
  float bias first; the bias is padded to a multiple of 16 keys); no grouped-query
  attention (PyTorch then falls back to math);
- math (``_scaled_dot_product_attention_math``, composite): the attention probabilities
  ``(B, H, L, S)`` and, with dropout, its mask; on CUDA it computes fp16 / bf16 inputs in
  fp32 (``allowFP16BF16ReductionMathSDP`` off by default), which is reproduced here.

The ops' fake (meta) kernels give their CUDA shapes, so the live-tensor tracker counts
their bytes. Under autocast the inputs are cast to the autocast dtype first (the CUDA
autocast list holds ``scaled_dot_product_attention``) and the op runs with autocast off,
as PyTorch runs it below the autocast key.

Example usage (what :mod:`ckptlab.worker.predict.fake` does; models call
``F.scaled_dot_product_attention`` by attribute, which the router replaces while entered)::

    with SdpaRouter(get_target("h100-80gb")) as router:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # flash's saved tensors
    router.backends  # {'flash'}
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from ckptlab.prediction.targets import Target

__all__ = ["SdpaRouter", "dtype_name"]

_aten = torch.ops.aten
_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def dtype_name(dtype: torch.dtype) -> str:
    """``fp32``, ``fp16`` or ``bf16`` (another dtype: its torch name)."""
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


class SdpaRouter:
    """While entered, ``torch.nn.functional.scaled_dot_product_attention`` is this router
    (models look it up at each call; a torch function mode would not see the calls a
    checkpoint's recomputation makes during backward): on a CUDA target it runs the
    target's backend instead (see the module docstring); on ``cpu`` it records the call
    and runs PyTorch's CPU kernel, as a real run does.

    Args:
        target: the predicted device.

    Attributes:
        backends: the backends the calls ran (``flash``, ``efficient``, ``math``, ``cpu``).
        fallbacks: why a call ran another backend than the target's rule gave (words).
        calls: how many calls were seen.
    """

    def __init__(self, target: Target):
        self.target = target
        self.backends: set[str] = set()
        self.fallbacks: set[str] = set()
        self.calls = 0
        self._original: list[Any] = []

    def __enter__(self) -> SdpaRouter:
        self._original.append(F.scaled_dot_product_attention)
        F.scaled_dot_product_attention = self
        return self

    def __exit__(self, *exc: object) -> None:
        F.scaled_dot_product_attention = self._original.pop()

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
        is_causal, scale, enable_gqa)`` as the target runs it."""
        self.calls += 1
        if self.target.device == "cpu":
            self.backends.add("cpu")
            return self._original[-1](*args, **kwargs)
        return self._attend(*args, **kwargs)

    def _attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        dtype = query.dtype
        if torch.is_autocast_enabled("cpu") and query.is_floating_point():
            dtype = torch.get_autocast_dtype("cpu")
        backend = self.target.sdpa_backend(dtype_name(dtype), head_dim=query.shape[-1], has_mask=attn_mask is not None)
        if backend == "efficient" and enable_gqa and key.shape[-3] != query.shape[-3]:
            backend = "math"
            self.fallbacks.add("grouped-query attention runs the math backend where flash cannot (PyTorch's rule)")
        self.backends.add(backend)
        q, k, v = (t.to(dtype) for t in (query, key, value))
        with torch.autocast("cpu", enabled=False):
            if backend == "flash":
                return _aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)[0]
            if backend == "efficient":
                bias = _efficient_bias(attn_mask, q, k)
                grad = any(t.requires_grad for t in (q, k, v))
                out = _aten._scaled_dot_product_efficient_attention(
                    q, k, v, bias, grad, dropout_p, is_causal, scale=scale
                )
                return out[0]
            return _math(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _efficient_bias(mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """The bias memory-efficient attention gets from a mask (``preprocess_mask`` in
    attention.cpp): a boolean mask as a float one (``-inf`` where masked), expanded to
    ``(B, H, L, S)``, its last dimension padded to a multiple of 16."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=mask.device).masked_fill(~mask, float("-inf"))
    mask = mask.expand(q.shape[0], q.shape[-3], q.shape[-2], k.shape[-2])
    keys = k.shape[-2]
    if keys % 16:
        padded = F.pad(mask, (0, 16 - keys % 16))
        mask = padded[..., :keys]
    return mask


def _math(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> Any:
    """The math backend as CUDA runs it: fp16 / bf16 computed in fp32, cast back."""
    dtype = q.dtype
    if dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.float(), k.float(), v.float()
    out = _aten._scaled_dot_product_attention_math(
        q, k, v, mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
    )[0]
    return out.to(dtype)
