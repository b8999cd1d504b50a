"""The segment law for checkpointing a uniform chain (no torch; shared by worker and API).

Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost" (arXiv 1604.06174):
for ``n`` identical blocks that each retain ``a`` bytes for backward, split into ``N``
segments whose inputs are ``b`` bytes, checkpointing all but the last segment (as
``torch.utils.checkpoint.checkpoint_sequential`` does) retains about
``(N - 1) * b + last * a`` bytes, ``last = n - (N - 1) * (n // N)`` being the length of the
un-checkpointed last segment. It is smallest near ``N = sqrt(n * a / b)``.
"""

from __future__ import annotations

import math

__all__ = ["last_segment_length", "retained_bytes", "optimal_segments"]


def last_segment_length(n: int, segments: int) -> int:
    """Blocks in the last (never checkpointed) segment: ``n - (segments - 1) * (n // segments)``.

    Raises:
        ValueError: ``segments`` outside ``1..n``.
    """
    if not 1 <= segments <= n:
        raise ValueError(f"segments must be in 1..{n}, got {segments}")
    return n - (segments - 1) * (n // segments)


def retained_bytes(n: int, segments: int, a: float, b: float) -> float:
    """Bytes retained for backward by the block chain: ``(N - 1) * b + last * a``.

    Args:
        n: blocks in the chain.
        segments: ``N``, as passed to ``checkpoint_sequential``.
        a: bytes one block retains without checkpointing.
        b: bytes of one segment input (kept by each checkpointed segment).
    """
    return (segments - 1) * b + last_segment_length(n, segments) * a


def optimal_segments(n: int, a: float, b: float) -> int:
    """The segment count in ``1..n`` with the fewest retained bytes (near ``sqrt(n a / b)``)."""
    guess = max(1, min(n, round(math.sqrt(n * a / b)))) if b > 0 else n
    candidates = range(max(1, guess - 3), min(n, guess + 3) + 1)
    return min(candidates, key=lambda s: (retained_bytes(n, s, a, b), s))
