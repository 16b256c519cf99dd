"""Cutting a document into sections and grouping section summaries for the reduce step. Pure.

Sections are cut one at a time, each as large as the Gate's *current* `chunk_tokens` allows when it
is admitted, so a document that starts while chat is quiet gets big sections and one that runs into
the evening peak gets small ones. Consecutive sections overlap a little so that a sentence cut at a
boundary is seen whole by one of them.
"""

from __future__ import annotations


def next_section(n_tokens: int, start: int, chunk_tokens: int, overlap: int) -> tuple[int, int]:
    """The section `[start, end)` of at most `chunk_tokens` tokens, and where the next one starts.

    The next start steps back by `overlap` tokens, but always moves forward by at least half the
    section so that a tiny chunk cap cannot make the walk stall."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    end = min(n_tokens, start + chunk_tokens)
    if end >= n_tokens:
        return end, n_tokens
    step_back = min(overlap, (end - start) // 2)
    return end, end - step_back


def sections(n_tokens: int, chunk_tokens: int, overlap: int) -> list[tuple[int, int]]:
    """All sections of a document at a fixed chunk size (the planning view of `next_section`)."""
    out, start = [], 0
    while start < n_tokens:
        end, nxt = next_section(n_tokens, start, chunk_tokens, overlap)
        out.append((start, end))
        start = nxt
    return out


def reduce_groups(sizes: list[int], budget: int, fixed: int, per_item: int) -> list[list[int]]:
    """Indices of summaries grouped so that each group's reduce prompt fits `budget` tokens.

    `fixed` is the prompt's own overhead and `per_item` the separator cost per summary. A group is
    closed only once it holds two summaries, so every round shrinks the list even when single
    summaries are large; a trailing group of one is carried to the next round as it is. The caller
    repeats rounds until one summary is left."""
    groups: list[list[int]] = []
    current: list[int] = []
    used = fixed
    for i, size in enumerate(sizes):
        cost = size + per_item
        if current and used + cost > budget and len(current) >= 2:
            groups.append(current)
            current, used = [], fixed
        current.append(i)
        used += cost
    if current:
        groups.append(current)
    return groups
