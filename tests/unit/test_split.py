from hypothesis import given
from hypothesis import strategies as st

from pipelines.split import next_section, reduce_groups, sections


def test_sections_overlap_and_cover() -> None:
    assert sections(1000, 300, 50) == [(0, 300), (250, 550), (500, 800), (750, 1000)]
    assert sections(200, 300, 50) == [(0, 200)]


@given(n=st.integers(1, 5000), chunk=st.integers(1, 800), overlap=st.integers(0, 900))
def test_sections_always_cover_and_progress(n: int, chunk: int, overlap: int) -> None:
    parts = sections(n, chunk, overlap)
    assert parts[0][0] == 0 and parts[-1][1] == n
    for (s0, e0), (s1, _e1) in zip(parts, parts[1:], strict=False):
        assert s1 > s0 and s1 <= e0  # moves forward, never leaves a hole
    assert all(e - s <= chunk for s, e in parts)


def test_next_section_rejects_zero_chunk() -> None:
    import pytest

    with pytest.raises(ValueError, match="chunk_tokens"):
        next_section(10, 0, 0, 0)


@given(sizes=st.lists(st.integers(1, 400), min_size=2, max_size=40), budget=st.integers(50, 2000))
def test_reduce_groups_shrink_every_round(sizes: list[int], budget: int) -> None:
    groups = reduce_groups(sizes, budget, fixed=30, per_item=3)
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    assert len(groups) < len(sizes)
    for g in groups:
        if len(g) > 2:  # groups beyond a forced pair fit the budget
            assert 30 + sum(sizes[i] + 3 for i in g) <= budget
