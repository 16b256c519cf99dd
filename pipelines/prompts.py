"""Prompts for map, reduce and whole-document summaries, built in token ids.

Every prompt is one request laid out as instruction, then a short head naming what follows, then
the text (a section, the whole document, or section summaries), then a tail. The instruction
comes first and is the same ids in every prompt of every document (whole, section and reduce
alike), so the engine's prefix cache computes it once per replica (the KV blocks it fills) and
each request after that prefills only its own text. Prompts are assembled from ids, not from
re-tokenized text: tokenizing the joined text could merge the instruction's last characters with
what follows and change the prefix from one document to the next, and a section must be exactly
the tokens the splitter cut.
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.tokenizer import Tokenizer

INSTRUCTION = (
    "You summarize long documents for analysts who read the summaries the next morning. "
    "A good summary is faithful and plain: it names the parties, dates, amounts, obligations, "
    "risks and decisions, in the order the document gives them, and invents nothing. "
    "Keep numbers exact. Prefer short sentences.\n\n"
)


@dataclass(frozen=True)
class PromptKit:
    """The fixed pieces of every prompt, tokenized once per worker."""

    instruction: tuple[int, ...]
    section_head: tuple[int, ...]
    section_tail: tuple[int, ...]
    whole_head: tuple[int, ...]
    whole_tail: tuple[int, ...]
    reduce_head: tuple[int, ...]
    reduce_tail: tuple[int, ...]
    separator: tuple[int, ...]

    @classmethod
    def build(cls, tok: Tokenizer) -> PromptKit:
        def ids(text: str) -> tuple[int, ...]:
            return tuple(tok.encode(text))

        return cls(
            instruction=ids(INSTRUCTION),
            section_head=ids("Here is one section of a longer document.\n\nSECTION:\n"),
            section_tail=ids("\n\nSummary of this section:"),
            whole_head=ids("DOCUMENT:\n"),
            whole_tail=ids("\n\nSummary of the document:"),
            reduce_head=ids("Below are summaries of consecutive sections of one document.\n\n"),
            reduce_tail=ids("\n\nOne summary of the whole document:"),
            separator=ids("\n---\n"),
        )

    @property
    def section_overhead(self) -> int:
        """Prompt tokens a section request adds around its section."""
        return len(self.instruction) + len(self.section_head) + len(self.section_tail)

    @property
    def whole_overhead(self) -> int:
        """Prompt tokens a whole-document request adds around the document."""
        return len(self.instruction) + len(self.whole_head) + len(self.whole_tail)

    def section(self, ids: list[int]) -> list[int]:
        return [*self.instruction, *self.section_head, *ids, *self.section_tail]

    def whole(self, ids: list[int]) -> list[int]:
        return [*self.instruction, *self.whole_head, *ids, *self.whole_tail]

    def reduce(self, summaries: list[list[int]]) -> list[int]:
        body: list[int] = []
        for i, s in enumerate(summaries):
            if i:
                body.extend(self.separator)
            body.extend(s)
        return [*self.instruction, *self.reduce_head, *body, *self.reduce_tail]

    def reduce_size(self, summaries: list[list[int]]) -> int:
        return (
            len(self.instruction)
            + len(self.reduce_head)
            + len(self.reduce_tail)
            + sum(len(s) for s in summaries)
            + len(self.separator) * max(0, len(summaries) - 1)
        )
