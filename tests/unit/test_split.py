from hypothesis import given
from hypothesis import strategies as st

from pipelines.split import next_section, reduce_groups, sections


def test_sections_overlap_and_cover() -> None:
    assert sections(1000, 300, 50) == [(0, 300), (250, 550), (500, 800), (750, 1000)]
    assert sections(200, 300, 50) == [(0, 200)]


@given(n=st.integers(1, 5000), size=st.integers(1, 800), overlap=st.integers(0, 900))
def test_sections_always_cover_and_progress(n: int, size: int, overlap: int) -> None:
    parts = sections(n, size, overlap)
    assert parts[0][0] == 0 and parts[-1][1] == n
    for (s0, e0), (s1, _e1) in zip(parts, parts[1:], strict=False):
        assert s1 > s0 and s1 <= e0  # moves forward, never leaves a hole
    assert all(e - s <= size for s, e in parts)


@given(n=st.integers(1, 100_000), size=st.integers(65, 9000))
def test_every_section_but_the_last_is_exactly_the_section_size(n: int, size: int) -> None:
    parts = sections(n, size, 64)
    assert all(e - s == size for s, e in parts[:-1])
    assert 0 < parts[-1][1] - parts[-1][0] <= size
    assert sections(n, size, 64) == parts  # the same document always cuts the same way


def test_an_80k_document_in_default_sections() -> None:
    parts = sections(80_000, 8192, 64)
    assert len(parts) == 10 and parts[1] == (8128, 16320)


def test_next_section_rejects_an_empty_section() -> None:
    import pytest

    with pytest.raises(ValueError, match="section_tokens"):
        next_section(10, 0, 0, 0)


@given(sizes=st.lists(st.integers(1, 400), min_size=2, max_size=40), budget=st.integers(50, 2000))
def test_reduce_groups_shrink_every_round(sizes: list[int], budget: int) -> None:
    groups = reduce_groups(sizes, budget, fixed=30, per_item=3)
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    assert len(groups) < len(sizes)
    for g in groups:
        if len(g) > 2:  # groups beyond a forced pair fit the budget
            assert 30 + sum(sizes[i] + 3 for i in g) <= budget


@given(sizes=st.lists(st.integers(1, 200), min_size=2, max_size=60), budget=st.integers(450, 4000))
def test_reduce_groups_of_summaries_that_pair_within_the_budget_all_fit(
    sizes: list[int], budget: int
) -> None:
    # any two summaries fit (as section summaries do in a real context): then every group fits
    groups = reduce_groups(sizes, budget, fixed=30, per_item=3)
    assert all(30 + sum(sizes[i] + 3 for i in g) <= budget for g in groups)
    assert [i for g in groups for i in g] == list(range(len(sizes)))  # in document order
