"""Cutting a document into sections and grouping section summaries for the reduce step. Pure.

A document's sections are all of one fixed size, `PipelineConfig.section_tokens` (the last one
shorter), so where a document is cut depends only on the job and the document, never on the load
when it runs: the engine's scheduler sizes each step's batch prefill chunk, so the pipeline has
no reason to cut smaller sections while chat is busy. Consecutive sections overlap a little so that
a sentence cut at a boundary is seen whole by one of them. Summaries are grouped for the reduce so
that each reduce prompt, with its output, fits the model's context.
"""

from __future__ import annotations


def next_section(n_tokens: int, start: int, section_tokens: int, overlap: int) -> tuple[int, int]:
    """The section `[start, end)` of at most `section_tokens` tokens, and where the next one starts.

    The next start steps back by `overlap` tokens, but always moves forward by at least half the
    section so that an overlap as large as the section cannot make the walk stall."""
    if section_tokens < 1:
        raise ValueError(f"section_tokens must be at least 1, got {section_tokens}")
    end = min(n_tokens, start + section_tokens)
    if end >= n_tokens:
        return end, n_tokens
    step_back = min(overlap, (end - start) // 2)
    return end, end - step_back


def sections(n_tokens: int, section_tokens: int, overlap: int) -> list[tuple[int, int]]:
    """All `[start, end)` sections of a document of `n_tokens` tokens, in order."""
    out, start = [], 0
    while start < n_tokens:
        end, nxt = next_section(n_tokens, start, section_tokens, overlap)
        out.append((start, end))
        start = nxt
    return out


def reduce_groups(sizes: list[int], budget: int, fixed: int, per_item: int) -> list[list[int]]:
    """Indices of summaries grouped so that each group's reduce prompt fits `budget` tokens (the
    context less the reduce's output: a job setting, like the sections).

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
