import pytest

from tests.segment_law import last_segment_length, optimal_segments, retained_bytes


def test_last_segment_matches_checkpoint_sequential_split():
    # checkpoint_sequential: segment size n // N, the remainder goes to the last segment
    assert last_segment_length(8, 1) == 8
    assert last_segment_length(8, 4) == 2
    assert last_segment_length(10, 4) == 4  # 3 segments of 2, last of 4
    assert last_segment_length(72, 36) == 2


def test_retained_bytes_formula():
    assert retained_bytes(8, 1, a=10, b=3) == 80
    assert retained_bytes(8, 4, a=10, b=3) == 3 * 3 + 2 * 10


def test_optimum_near_sqrt_n():
    assert optimal_segments(64, a=1, b=1) in (7, 8, 9)
    n = 72
    best = optimal_segments(n, a=1, b=1)
    assert all(retained_bytes(n, best, 1, 1) <= retained_bytes(n, s, 1, 1) for s in range(1, n + 1))


def test_segments_out_of_range():
    with pytest.raises(ValueError):
        last_segment_length(4, 5)


def test_retained_bytes_follow_checkpoint_sequential_split():
    # depth 8: segment length 8 // N, the last segment takes the rest and is not checkpointed.
    got = [retained_bytes(8, n, a=10, b=1) for n in (1, 2, 3, 4, 8)]
    assert got == [80, 1 + 40, 2 + 40, 3 + 20, 7 + 10]
    with pytest.raises(ValueError):
        retained_bytes(8, 9, a=1, b=1)
