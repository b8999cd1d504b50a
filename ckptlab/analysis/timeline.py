"""The memory timeline of one training step (issue 34), defined once: what the worker records
(:class:`StepTimeline`), how it is stored (:func:`encode` / :func:`decode`: columnar numpy
arrays and an orjson header, zlib-compressed, one blob per step) and what is read from it:
the live bytes after each event, the peak, and the live blocks at the peak grouped by
module, category and saved-or-temporary (:func:`peak_holders`), summing to the peak exactly.

An *event* is one allocation or free the exact live-tensor tracker counted, in order (its
index is ``t_index``); a *block* is one storage from its allocation to its free. The events
column holds a block's id at its allocation and ``~id`` (negative) at its free; each block
carries its bytes, category, module, op, checkpoint region and flags, so an event's
``(bytes_delta, category, module, op, saved_for_backward, checkpoint_region)`` are its
block's, its phase and recomputation the spans it falls in. Blocks ``0 .. n_resident - 1``
were alive when the step began (parameters, optimizer state): no event allocates them.

numpy and orjson only: the backend reads it without torch.
"""

from __future__ import annotations

import functools
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from ckptlab.domain import Unattributed

__all__ = [
    "FORMAT",
    "UNKNOWN",
    "SAVED",
    "RECOMPUTED",
    "RESIDENT",
    "StepTimeline",
    "TimelineFormatError",
    "encode",
    "decode",
    "Holder",
    "PeakHolders",
    "peak_holders",
]

#: The blob's format version (its first byte after the magic).
FORMAT = 1
_MAGIC = b"CKTL"
#: The module of a block nothing named.
UNKNOWN = Unattributed.UNKNOWN.value
#: Bits of a block's ``flags``: saved for backward, made in a recomputation, alive before the step.
SAVED, RECOMPUTED, RESIDENT = 1, 2, 4
#: The per-block columns and the dtype each is read back as.
_BLOCK_COLUMNS = {
    "nbytes": np.int64,
    "category": np.uint8,
    "module": np.int32,
    "op": np.int32,
    "region": np.int32,
    "flags": np.uint8,
}


class TimelineFormatError(ValueError):
    """A stored timeline that does not read back (not a timeline blob, another format
    version, truncated or corrupt)."""


@dataclass(eq=False)
class StepTimeline:
    """Every allocation and free of one step, as the worker's recorder saw them.

    Attributes:
        step: the step number (1-based, as the run's step records).
        events: int32, one per event in order: the block id at its allocation, ``~id`` at its free.
        nbytes: int64 per block: its bytes as counted.
        category: uint8 per block: index into ``categories`` (its category at its free or
            at the step's end: a gradient retagged once accumulated is a gradient throughout).
        module: int32 per block: index into ``modules`` (fully-qualified names; ``<batch>``,
            ``<loss>``, ``<optimizer>`` outside every module; :data:`UNKNOWN`).
        op: int32 per block: index into ``ops`` (``aten.mm.default``, ``torch.get_rng_state``).
        region: int32 per block: index into ``regions`` (checkpoint regions), -1 for none.
        flags: uint8 per block: :data:`SAVED`, :data:`RECOMPUTED`, :data:`RESIDENT` bits.
        categories, modules, ops, regions: the names the indices point into.
        phases: ``(first event index, phase)`` where each phase (forward, backward,
            optimizer) starts, in order.
        recompute_spans: ``(first, end)`` event indices of each recomputation (end exclusive).
        n_resident: blocks alive when the step began (ids ``0 .. n_resident - 1``).
        region_keeps: per checkpointed region, what its checkpoint meant to keep and what it
            kept at the end of the first forward, bytes (``region``, ``inputs_bytes``,
            ``rng_state_bytes``, ``policy_bytes``, ``intended_bytes``, ``kept_bytes``,
            ``excess_bytes`` and ``excess``: the largest blocks kept beyond intent, as
            ``module``, ``op``, ``bytes``; ``ckptlab.worker.measure.timeline``).
    """

    step: int
    events: np.ndarray
    nbytes: np.ndarray
    category: np.ndarray
    module: np.ndarray
    op: np.ndarray
    region: np.ndarray
    flags: np.ndarray
    categories: list[str]
    modules: list[str]
    ops: list[str]
    regions: list[str] = field(default_factory=list)
    phases: list[tuple[int, str]] = field(default_factory=list)
    recompute_spans: list[tuple[int, int]] = field(default_factory=list)
    n_resident: int = 0
    region_keeps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def n_events(self) -> int:
        """Events in the step."""
        return len(self.events)

    @property
    def baseline_bytes(self) -> int:
        """Bytes alive when the step began (its resident blocks)."""
        return int(self.nbytes[: self.n_resident].sum())

    @functools.cached_property
    def freed(self) -> np.ndarray:
        """bool per event: a free (else an allocation)."""
        return self.events < 0

    @functools.cached_property
    def _sign(self) -> np.ndarray:
        """int64 per event: -1 at a free, 0 at an allocation (the id's sign bit)."""
        return -(self.events < 0).astype(np.int64)

    @functools.cached_property
    def block_of_event(self) -> np.ndarray:
        """int64 id of the block each event allocates or frees."""
        return self.events.astype(np.int64) ^ self._sign  # ~id at a free: x ^ -1 == ~x

    @functools.cached_property
    def bytes_delta(self) -> np.ndarray:
        """int64 bytes of each event: + at an allocation, - at a free."""
        size = self.nbytes[self.block_of_event]
        return (size ^ self._sign) - self._sign  # -size at a free: (x ^ -1) + 1 == -x

    @functools.cached_property
    def live_bytes(self) -> np.ndarray:
        """int64 live bytes after each event (the baseline plus every delta so far)."""
        return np.cumsum(self.bytes_delta) + self.baseline_bytes

    def peak(self) -> tuple[int, int]:
        """``(bytes, event index)`` of the step's highest live bytes (the first event that
        reaches it; index -1 when nothing in the step rose above its start)."""
        if not self.n_events:
            return self.baseline_bytes, -1
        live = self.live_bytes
        i = int(np.argmax(live))
        return (int(live[i]), i) if live[i] > self.baseline_bytes else (self.baseline_bytes, -1)

    def levels_by_category(self, indices: np.ndarray) -> np.ndarray:
        """int64 ``(len(categories), len(indices))``: live bytes of each category just after
        each of the (ascending) event ``indices``; each column sums to :attr:`live_bytes` there.

        Raises:
            ValueError: ``indices`` are not ascending event indices.
        """
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices[0] < 0 or indices[-1] >= self.n_events or np.any(np.diff(indices) < 0)):
            raise ValueError("indices must be ascending event indices")
        ncat = len(self.categories)
        # each event counts from the first index at or after it on: per segment, then cumulated
        counts = np.diff(np.concatenate(([-1], indices, [self.n_events - 1])))
        segment = np.repeat(np.arange(len(indices) + 1, dtype=np.int64), counts)
        cat = self.category[self.block_of_event].astype(np.int64)
        # float64 sums are exact below 2**53 bytes (8 PiB) per segment
        sums = np.bincount(segment * ncat + cat, weights=self.bytes_delta, minlength=(len(indices) + 1) * ncat)
        per = np.rint(sums).astype(np.int64).reshape(len(indices) + 1, ncat)[: len(indices)]
        resident = np.bincount(
            self.category[: self.n_resident].astype(np.int64),
            weights=self.nbytes[: self.n_resident],
            minlength=ncat,
        )
        return (np.cumsum(per, axis=0) + np.rint(resident).astype(np.int64)).T

    def alive_at(self, index: int) -> np.ndarray:
        """Ids of the blocks alive just after event ``index`` (-1: as the step began)."""
        freed = self.freed
        made = np.full(len(self.nbytes), -1, dtype=np.int64)
        made[self.n_resident :] = np.flatnonzero(~freed)  # blocks are numbered as they are allocated
        gone = np.full(len(self.nbytes), np.iinfo(np.int64).max, dtype=np.int64)
        gone[~self.events[freed]] = np.flatnonzero(freed)
        return np.flatnonzero((made <= index) & (gone > index))

    def phase_at(self, index: int) -> str | None:
        """The phase event ``index`` is in (None before the first)."""
        current = None
        for start, phase in self.phases:
            if start > index:
                break
            current = phase
        return current

    def phase_spans(self) -> list[tuple[str, int, int]]:
        """``(phase, first, end)`` event indices of each phase span (end exclusive)."""
        starts = [s for s, _ in self.phases] + [self.n_events]
        return [(p, s, e) for (s, p), e in zip(self.phases, starts[1:], strict=False) if e > s]


def _narrow(values: np.ndarray) -> np.ndarray:
    """``values`` (integers) in the smallest signed dtype that holds them."""
    if not len(values):
        return values.astype(np.int8)
    lo, hi = int(values.min()), int(values.max())
    for dtype in (np.int8, np.int16, np.int32, np.int64):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return values.astype(dtype)
    return values


def encode(tl: StepTimeline, level: int = 1) -> bytes:
    """The blob a timeline is stored as: ``CKTL``, the format byte, then zlib-compressed at
    ``level`` (1: fastest): a 4-byte header length, the orjson header (names, spans, each
    column's dtype and length), then the columns' bytes, each in the smallest integer dtype
    that holds it. The events are stored as a bit per event (a free or not) and the ids of
    the freed blocks (an allocation's is implicit: blocks are numbered as they are
    allocated), about 2 bytes per event before compression.

    Raises:
        TimelineFormatError: the columns do not fit together (see :func:`decode`).
    """
    _check(tl)
    freed = tl.events < 0
    columns = {"free_bits": np.packbits(freed), "freed_blocks": _narrow(~tl.events[freed].astype(np.int64))}
    columns.update({name: _narrow(np.asarray(getattr(tl, name))) for name in _BLOCK_COLUMNS})
    header = orjson.dumps(
        {
            "step": tl.step,
            "n_events": tl.n_events,
            "n_resident": tl.n_resident,
            "categories": tl.categories,
            "modules": tl.modules,
            "ops": tl.ops,
            "regions": tl.regions,
            "phases": tl.phases,
            "recompute_spans": tl.recompute_spans,
            "region_keeps": tl.region_keeps,
            "columns": [[name, a.dtype.str, len(a)] for name, a in columns.items()],
        }
    )
    body = b"".join(np.ascontiguousarray(a).tobytes() for a in columns.values())
    return _MAGIC + bytes([FORMAT]) + zlib.compress(struct.pack("<I", len(header)) + header + body, level)


def decode(blob: bytes) -> StepTimeline:
    """The timeline stored as ``blob`` (:func:`encode`).

    Raises:
        TimelineFormatError: not a timeline of :data:`FORMAT`, truncated or corrupt.
    """
    if not isinstance(blob, bytes | bytearray | memoryview) or bytes(blob[:4]) != _MAGIC:
        raise TimelineFormatError("not a stored memory timeline")
    if blob[4] != FORMAT:
        raise TimelineFormatError(f"a memory timeline of format {blob[4]}, this version reads {FORMAT}")
    try:
        raw = zlib.decompress(blob[5:])
        (size,) = struct.unpack_from("<I", raw)
        header = orjson.loads(raw[4 : 4 + size])
        offset, arrays = 4 + size, {}
        for name, dtype, length in header["columns"]:
            a = np.frombuffer(raw, dtype=np.dtype(dtype), count=length, offset=offset)
            offset += a.nbytes
            arrays[name] = a
        n_events, n_resident = int(header["n_events"]), int(header["n_resident"])
        freed = np.unpackbits(arrays.pop("free_bits"), count=n_events).view(bool)
        freed_blocks = arrays.pop("freed_blocks")
        if len(freed_blocks) and not 0 <= int(freed_blocks.min()) <= int(freed_blocks.max()) < len(arrays["nbytes"]):
            raise TimelineFormatError("a stored memory timeline whose events name blocks it does not have")
        events = np.empty(n_events, dtype=np.int32)
        events[freed] = ~freed_blocks.astype(np.int32)
        events[~freed] = np.arange(n_resident, n_resident + n_events - int(freed.sum()), dtype=np.int32)
        tl = StepTimeline(
            step=int(header["step"]),
            events=events,
            **{name: arrays[name].astype(dtype, copy=False) for name, dtype in _BLOCK_COLUMNS.items()},
            categories=list(header["categories"]),
            modules=list(header["modules"]),
            ops=list(header["ops"]),
            regions=list(header["regions"]),
            phases=[(int(i), str(p)) for i, p in header["phases"]],
            recompute_spans=[(int(a), int(b)) for a, b in header["recompute_spans"]],
            n_resident=n_resident,
            region_keeps=list(header.get("region_keeps", [])),
        )
        tl.__dict__["freed"] = freed  # (its cached property)
    except TimelineFormatError:
        raise
    except (zlib.error, struct.error, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise TimelineFormatError(f"a stored memory timeline that does not read back: {exc}") from None
    _check(tl, events=False)  # its events are whole by construction: allocations in order
    return tl


def _check(tl: StepTimeline, *, events: bool = True) -> None:
    """Raise :class:`TimelineFormatError` when the columns do not fit together: block columns
    of one length, names for every index, one allocation per block after the resident ones
    (``events``: also that the events name blocks it has, allocated in the order they are
    numbered; :func:`decode` builds them so)."""
    n = len(tl.nbytes)
    if any(len(getattr(tl, c)) != n for c in _BLOCK_COLUMNS) or not 0 <= tl.n_resident <= n:
        raise TimelineFormatError("a stored memory timeline whose block columns differ in length")
    ev = tl.events
    allocations = tl.n_events - int(np.count_nonzero(ev < 0))
    if allocations != n - tl.n_resident:
        raise TimelineFormatError("a stored memory timeline whose events do not allocate each block once")
    if events and len(ev) and int((~ev[ev < 0]).max(initial=0)) >= n:
        raise TimelineFormatError("a stored memory timeline whose events name blocks it does not have")
    if events and not np.array_equal(ev[ev >= 0], np.arange(tl.n_resident, n)):
        raise TimelineFormatError("a memory timeline whose blocks are not numbered in the order they are allocated")
    for col, names in (("category", tl.categories), ("module", tl.modules), ("op", tl.ops)):
        values = getattr(tl, col)
        if n and (int(values.max()) >= len(names) or int(values.min()) < 0):
            raise TimelineFormatError(f"a stored memory timeline whose {col} names are missing")
    if n and (int(tl.region.max()) >= len(tl.regions) or int(tl.region.min()) < -1):
        raise TimelineFormatError("a stored memory timeline whose region names are missing")


@dataclass(frozen=True)
class Holder:
    """One group of the blocks alive at the peak: bytes in ``module`` of ``category``, saved
    for backward or temporary.

    Attributes:
        module: fully-qualified module name (or ``<batch>``, ``<loss>``, ``<optimizer>``, ``unknown``).
        category: a memory category (:class:`ckptlab.domain.MemoryCategory` value).
        saved: saved for backward (True) or temporary.
        bytes: the group's bytes.
        blocks: how many blocks (storages) it holds.
        recomputed_bytes: of ``bytes``, those made by a recomputation.
        ops: the ops that made its largest blocks (up to 3, largest first).
    """

    module: str
    category: str
    saved: bool
    bytes: int
    blocks: int
    recomputed_bytes: int
    ops: tuple[str, ...]


@dataclass(frozen=True)
class PeakHolders:
    """Who holds the peak of one step (:func:`peak_holders`).

    Attributes:
        step: the step.
        peak_bytes: live bytes at the peak; the holders' bytes and ``others_bytes`` sum to it.
        peak_index: the event that reached it (-1: the step's start).
        phase: the phase of that event (None at the start).
        holders: the largest groups, largest first (every group, or the ``top`` asked for).
        groups: how many groups there are.
        others_bytes: bytes of the groups not in ``holders``.
        others_groups: how many groups those are.
        named_bytes: bytes of the blocks whose module is not ``unknown``.
        by_category: bytes per category at the peak (categories with bytes only).
    """

    step: int
    peak_bytes: int
    peak_index: int
    phase: str | None
    holders: list[Holder]
    groups: int
    others_bytes: int
    others_groups: int
    named_bytes: int
    by_category: dict[str, int]


def peak_holders(tl: StepTimeline, top: int | None = None) -> PeakHolders:
    """The blocks alive at ``tl``'s peak grouped by (module, category, saved vs temporary),
    largest group first: the ``top`` largest (None: all) as :class:`Holder` rows, the rest
    summed; integer sums, so the rows and the rest add up to the peak exactly."""
    peak_bytes, index = tl.peak()
    alive = tl.alive_at(index)
    nbytes = tl.nbytes[alive]
    ncat = len(tl.categories)
    saved = (tl.flags[alive] & SAVED) > 0
    key = (tl.module[alive].astype(np.int64) * ncat + tl.category[alive]) * 2 + saved
    order = np.lexsort((-nbytes, key))  # each group's members together, largest block first
    key, nbytes, alive = key[order], nbytes[order], alive[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], len(key)].astype(np.int64)
    totals = np.add.reduceat(nbytes, starts) if len(key) else np.zeros(0, np.int64)
    redone = np.where((tl.flags[alive] & RECOMPUTED) > 0, nbytes, 0)
    again = np.add.reduceat(redone, starts) if len(key) else totals
    ranked = np.argsort(-totals, kind="stable")
    shown, rest = (ranked, ranked[:0]) if top is None else (ranked[:top], ranked[top:])
    holders = []
    for g in shown:
        first, k = int(starts[g]), int(key[starts[g]])
        ops = tuple(dict.fromkeys(tl.ops[i] for i in tl.op[alive[first : min(first + 16, int(ends[g]))]]))[:3]
        holders.append(
            Holder(
                module=tl.modules[k // 2 // ncat],
                category=tl.categories[k // 2 % ncat],
                saved=bool(k % 2),
                bytes=int(totals[g]),
                blocks=int(ends[g] - first),
                recomputed_bytes=int(again[g]),
                ops=ops,
            )
        )
    per_category = np.zeros(ncat, dtype=np.int64)
    np.add.at(per_category, tl.category[alive].astype(np.int64), nbytes)
    unknown = tl.modules.index(UNKNOWN) if UNKNOWN in tl.modules else -1
    return PeakHolders(
        step=tl.step,
        peak_bytes=peak_bytes,
        peak_index=index,
        phase=tl.phase_at(index) if index >= 0 else None,
        holders=holders,
        groups=len(totals),
        others_bytes=int(totals[rest].sum()),
        others_groups=len(rest),
        named_bytes=int(nbytes[tl.module[alive] != unknown].sum()),
        by_category={c: int(b) for c, b in zip(tl.categories, per_category, strict=True) if b},
    )
