"""One recorded step as the timeline recorder left it (:class:`RecordedStep`), and its
columns: the arrays :class:`ckptlab.analysis.timeline.StepTimeline` stores, made only for
the steps kept (issue 34). Split from :mod:`ckptlab.worker.measure.timeline`, whose
:class:`~ckptlab.worker.measure.timeline.TimelineRecorder` fills it."""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from ckptlab.worker.measure.memory import CATEGORIES

__all__ = ["RecordedStep"]

_CATEGORY_CODES = {c: i for i, c in enumerate(CATEGORIES)}
_first, _second, _category = itemgetter(0), itemgetter(1), attrgetter("category")


def _op_name(op: Any) -> str:
    """An op's name as stored: ``aten.mm.default``; a call outside the dispatcher as given;
    ``(none)`` for a block alive before the step."""
    return "(none)" if op is None else str(op)


#: id of an op -> (it, its name): an ``OpOverload``'s ``str`` (and hash) is Python, and a
#: kept step's columns are made inside the memory pass; holding the op keeps its id its own
_OP_NAMES: dict[int, tuple[Any, str]] = {}


def _op_names(ops: Iterable[Any]) -> list[str]:
    """:func:`_op_name` of each of ``ops``, each op's made once per process."""
    if len(_OP_NAMES) > 4096:  # (calls named by strings made at run time: bounded anyway)
        _OP_NAMES.clear()
    out = []
    for op in ops:
        hit = _OP_NAMES.get(id(op))
        if hit is None:
            hit = _OP_NAMES[id(op)] = (op, _op_name(op))
        out.append(hit[1])
    return out


class RecordedStep:
    """One recorded step as the recorder left it
    (:meth:`ckptlab.worker.measure.timeline.TimelineRecorder.stop`; ``recorder``: it): per block
    its tracker entry, bytes, module, region, op and whether a recomputation made it; the
    events, the blocks autograd packed, the phases and recomputation spans. Its categories
    are read from the tracker's entries when :meth:`columns` is called (a block's category
    at its free, or now: retags happen as the engine learns what a tensor is, within its
    step)."""

    def __init__(self, recorder: Any, policy_ops: dict[int, frozenset[str]]):
        r = recorder
        self.blocks = r.blocks
        self.renamed, self.events, self.saved = r._renamed, r.events, r._saved
        self.outputs, self.phases, self.recompute_spans = r._outputs, r._phases, r._recompute_spans
        self.resident, self.policy_ops = r._resident, policy_ops
        self.region_roots = set(r.region_roots.values())

    def columns(self) -> dict[str, Any]:
        """The step's columns (those of :class:`ckptlab.analysis.timeline.StepTimeline` but
        ``step`` and ``regions``): ``events`` (int32: a block's id at its allocation, ``~id``
        at its free; blocks are numbered as they are allocated, after the resident ones), per
        block ``nbytes`` (int64, bytes), ``category`` (uint8, index into ``categories``),
        ``module`` / ``op`` / ``region`` (int32 indices into ``modules`` / ``ops`` / the
        engine's regions; -1: none), ``saved`` and ``recomputed`` (bool); ``phases`` ((first
        event index, phase) where each phase starts), ``recompute_spans`` ((first, end) event
        indices), ``n_resident`` (blocks ``0 .. n_resident - 1`` were alive as the step began)
        and ``region_keeps`` (:meth:`region_keeps`)."""
        b = self.blocks  # (flat: five items a block)
        infos, nbytes, owners, ops, recomputed = b[0::5], b[1::5], b[2::5], b[3::5], b[4::5]
        # (map over C callables, not comprehensions: a kept step's columns are made inside the
        # memory pass, and small models' steps make few milliseconds of work)
        names = list(map(_first, owners))
        modules = {name: i for i, name in enumerate(dict.fromkeys(names))}
        n = len(infos)
        module_code = np.fromiter(map(modules.__getitem__, names), np.int32, n)
        region_of = list(map(_second, owners))
        for block, name in self.renamed.items():
            module_code[block] = modules.setdefault(name, len(modules))
        module_names = list(modules)
        if self.renamed:  # a module only renamed blocks had is left out
            used = np.zeros(len(modules), dtype=bool)
            used[module_code] = True
            module_code = (np.cumsum(used, dtype=np.int32) - 1)[module_code]
            module_names = [m for m, keep in zip(module_names, used.tolist(), strict=True) if keep]
        # ops by identity: an ``OpOverload``'s own hash is Python's
        ids = list(map(id, ops))
        by_id = dict(zip(ids, ops, strict=True))
        codes = {key: i for i, key in enumerate(by_id)}
        op_code = np.fromiter(map(codes.__getitem__, ids), np.int32, n)
        op_names = _op_names(by_id.values())
        events = np.fromiter(self.events, np.int32, len(self.events))
        region = np.fromiter(region_of, np.int32, n)
        sizes = np.fromiter(nbytes, np.int64, n)
        saved = np.zeros(n, dtype=bool)
        saved[np.fromiter(self.saved, np.int64, len(self.saved))] = True
        kept = self._kept_by_regions(region_of)
        saved[kept] = True
        return {
            "events": events,
            "nbytes": sizes,
            "category": np.fromiter(map(_CATEGORY_CODES.__getitem__, map(_category, infos)), np.uint8, n),
            "module": module_code,
            "op": op_code,
            "region": region,
            "saved": saved,
            "recomputed": np.fromiter(recomputed, np.bool_, n),  # (recomputations running: 0, 1, ...)
            "categories": list(CATEGORIES),
            "modules": module_names,
            "ops": op_names,
            "phases": list(self.phases),
            "recompute_spans": [tuple(s) for s in self.recompute_spans],
            "n_resident": self.resident,
            "region_keeps": self.region_keeps(
                kept, sizes, region, [module_names[module_code[b]] for b in kept], [op_names[op_code[b]] for b in kept]
            ),
        }

    def region_keeps(
        self, kept: np.ndarray, sizes: np.ndarray, region: np.ndarray, modules: list[str], ops: list[str]
    ) -> list[dict[str, Any]]:
        """Per checkpointed region (issue 34, item 3): what its checkpoint meant to keep from
        forward to backward against what it kept, in bytes. Meant: its inputs (what its
        checkpoint saved that was made before it), its RNG state and its selective policy's
        saved outputs. Kept: those, and every other block it made in the first forward and
        still held at its end, but its output (passed on: the next region's input). The
        difference, ``excess_bytes``, is what a region kept beyond its inputs (a block
        returning an intermediate the model keeps), with its largest blocks (``excess``:
        module, op, bytes). ``kept``: the blocks regions made and held (ids), ``modules`` /
        ``ops``: their names."""
        roots = set(self.region_roots)
        figures = {
            r: dict.fromkeys(("inputs_bytes", "rng_state_bytes", "policy_bytes", "excess_bytes"), 0) for r in roots
        }
        excess: dict[int, list[tuple[int, str, str]]] = {r: [] for r in roots}
        for block, by in self.saved.items():
            if by in figures and region[block] != by:
                figures[by]["inputs_bytes"] += int(sizes[block])
        for block, mod, op in zip(kept.tolist(), modules, ops, strict=True):
            r = int(region[block])
            if r not in figures or self.outputs.get(block) == r:
                continue
            key = (
                "rng_state_bytes"
                if op == "torch.get_rng_state"
                else "policy_bytes"
                if op in self.policy_ops.get(r, ())
                else None
            )
            if key is None:
                excess[r].append((int(sizes[block]), mod, op))
                key = "excess_bytes"
            figures[r][key] += int(sizes[block])
        out = []
        for r in sorted(figures):
            f = figures[r]
            intended = f["inputs_bytes"] + f["rng_state_bytes"] + f["policy_bytes"]
            top = sorted(excess[r], key=lambda e: -e[0])[:3]
            out.append(
                {"region": r, **f, "intended_bytes": intended, "kept_bytes": intended + f["excess_bytes"]}
                | {"excess": [{"module": m, "op": o, "bytes": b} for b, m, o in top]}
            )
        return out

    def _kept_by_regions(self, regions: tuple[int, ...]) -> np.ndarray:
        """Blocks a checkpoint region made in the first forward and still held at its end (ids;
        ``regions``: each block's region, -1 for none)."""
        n = len(self.events)
        start = next((i for i, p in self.phases if p == "forward"), n)
        end = next((i for i, p in self.phases if i > start and p != "forward"), n)
        first = self.events[:end]  # (Python: faster than numpy's setdiff1d on a step's few events)
        freed = {~e for e in first if e < 0}
        return np.array(sorted([e for e in first if e >= 0 and regions[e] >= 0 and e not in freed]), dtype=np.int64)
