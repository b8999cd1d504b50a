"""The stored memory timeline (issue 34): live bytes, the peak and who holds it computed
exactly from the events, the blob read back as written, and a blob that is not one refused
with a reason (never a crash further down)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from ckptlab.analysis.timeline import (
    RECOMPUTED,
    RESIDENT,
    SAVED,
    StepTimeline,
    TimelineFormatError,
    decode,
    encode,
    peak_holders,
)
from ckptlab.domain import MemoryCategory

CATS = [c.value for c in MemoryCategory]
PARAMS, ACT, OTHER = CATS.index("parameters"), CATS.index("activations"), CATS.index("other")


def small() -> StepTimeline:
    """Two resident blocks (100 B, 50 B), then: +30 (b2), +90 (b3), -30, +10 (b4), -90.
    Live: 180, 270, 240, 250, 160; the peak is 270 after event 1."""
    return StepTimeline(
        step=3,
        events=np.array([2, 3, ~2, 4, ~3], dtype=np.int32),
        nbytes=np.array([100, 50, 30, 90, 10], dtype=np.int64),
        category=np.array([PARAMS, PARAMS, ACT, ACT, OTHER], dtype=np.uint8),
        module=np.array([0, 1, 0, 0, 2], dtype=np.int32),
        op=np.array([0, 0, 1, 2, 1], dtype=np.int32),
        region=np.array([-1, -1, 0, 0, -1], dtype=np.int32),
        flags=np.array([RESIDENT, RESIDENT, SAVED, SAVED | RECOMPUTED, 0], dtype=np.uint8),
        categories=CATS,
        modules=["fc", "unknown", "<loss>"],
        ops=["(none)", "aten.mm.default", "aten.relu.default"],
        regions=["blocks.0"],
        phases=[(0, "forward"), (3, "backward")],
        recompute_spans=[(1, 2)],
        n_resident=2,
    )


def test_live_bytes_peak_and_who_holds_it_are_exact():
    tl = small()
    assert tl.baseline_bytes == 150
    assert tl.bytes_delta.tolist() == [30, 90, -30, 10, -90]
    assert tl.live_bytes.tolist() == [180, 270, 240, 250, 160]
    assert tl.peak() == (270, 1)
    assert tl.alive_at(-1).tolist() == [0, 1] and tl.alive_at(1).tolist() == [0, 1, 2, 3]
    assert tl.alive_at(4).tolist() == [0, 1, 4]
    assert tl.phase_at(1) == "forward" and tl.phase_at(3) == "backward"
    assert tl.phase_spans() == [("forward", 0, 3), ("backward", 3, 5)]

    holders = peak_holders(tl)
    assert (holders.peak_bytes, holders.peak_index, holders.phase) == (270, 1, "forward")
    assert sum(h.bytes for h in holders.holders) == 270
    top = holders.holders[0]
    assert (top.module, top.category, top.saved, top.bytes, top.blocks) == ("fc", "activations", True, 120, 2)
    assert top.recomputed_bytes == 90 and top.ops == ("aten.relu.default", "aten.mm.default")
    assert holders.named_bytes == 220  # the resident block of "unknown" is not named
    assert holders.by_category == {"activations": 120, "parameters": 150}


def test_levels_by_category_sum_to_the_live_bytes():
    tl = small()
    idx = np.array([0, 1, 3, 4])
    levels = tl.levels_by_category(idx)
    assert levels.sum(axis=0).tolist() == tl.live_bytes[idx].tolist()
    assert levels[PARAMS].tolist() == [150] * 4 and levels[OTHER].tolist() == [0, 0, 10, 10]
    with pytest.raises(ValueError):
        tl.levels_by_category(np.array([3, 1]))


def test_a_step_that_only_frees_peaks_at_its_start():
    tl = small()
    everything = {"events": np.array([~0], dtype=np.int32), "phases": [(0, "optimizer")], "n_resident": 5}
    tl = StepTimeline(**{**tl.__dict__, **everything})
    assert tl.peak() == (280, -1) and tl.live_bytes.tolist() == [180]
    assert sum(h.bytes for h in peak_holders(tl).holders) == 280


def test_the_blob_reads_back_as_written():
    tl = small()
    tl.nbytes[0] = 3 * 2**40  # past 32 bits
    back = decode(encode(tl))
    for name in ("events", "nbytes", "category", "module", "op", "region", "flags"):
        assert np.array_equal(getattr(back, name), getattr(tl, name)), name
    for name in ("step", "categories", "modules", "ops", "regions", "phases", "recompute_spans", "n_resident"):
        assert getattr(back, name) == getattr(tl, name), name
    assert back.peak() == tl.peak() and back.nbytes.dtype == np.int64


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"not a timeline",
        b"CKTL\x09" + zlib.compress(b"x"),
        b"CKTL\x01" + b"garbage",
        b"CKTL\x01" + zlib.compress(b"\xff\xff\x00\x00{}"),
    ],
)
def test_a_blob_that_is_not_a_timeline_is_refused_with_a_reason(blob):
    with pytest.raises(TimelineFormatError):
        decode(blob)


def test_columns_that_do_not_fit_together_are_refused():
    tl = small()
    bad = StepTimeline(**{**tl.__dict__, "events": np.array([2, 3, ~9, 4, ~3], dtype=np.int32)})
    with pytest.raises(TimelineFormatError, match="blocks it does not have"):
        decode(encode(bad))
    bad = StepTimeline(**{**tl.__dict__, "events": np.array([3, 2, ~2, 4, ~3], dtype=np.int32)})
    with pytest.raises(TimelineFormatError, match="in the order they are allocated"):
        encode(bad)
    bad = StepTimeline(**{**tl.__dict__, "events": np.array([2, 3, ~2], dtype=np.int32)})
    with pytest.raises(TimelineFormatError, match="allocate each block once"):
        encode(bad)
    bad = StepTimeline(**{**tl.__dict__, "modules": ["fc"]})
    with pytest.raises(TimelineFormatError, match="module names"):
        decode(encode(bad))
    truncated = encode(tl)
    with pytest.raises(TimelineFormatError):
        decode(truncated[:-7])
