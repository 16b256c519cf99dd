"""Chat prompts of a planned size: shared system prompt, retrieved chunks, history, question.

Sizes are planned in the served model's tokens without encoding any prompt: the source text is
tokenized once and kept as one string per token, so a slice of n pieces re-encodes to n tokens
(exactly, for both local models' tokenizers, measured over 500 random slices each; a tokenizer
that merges across the slice edges would be off by a token or so per piece), and the chat
template's overhead is measured once with the same tokenizer. The engine's reported `prompt_tokens`
then matches the plan (the chat load reports the ratio), which is what lets a trace replay hit each
row's ContextTokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.chat_sessions import ChatShape, ShapeError, TurnPlan


@dataclass(frozen=True)
class TemplateCost:
    """Tokens the chat template adds around message contents, so prompt sizes can be planned."""

    fixed: int = 5
    """Begin-of-text plus the assistant header that asks for the answer."""
    system: int = 5
    """Header and end marker of a system message."""
    user: int = 5
    """Header and end marker of a user message."""
    assistant: int = 5
    """Header and end marker of an assistant message."""
    separator: int = 1
    """The blank line between retrieved chunks and the question."""

    @classmethod
    def llama3(cls, tokenizer) -> TemplateCost:
        """Measured with the served tokenizer on the Llama-3 template the production model and the
        local models share."""

        def n(text: str) -> int:
            return len(tokenizer.encode(text))

        def header(role: str) -> int:
            return n(f"<|start_header_id|>{role}<|end_header_id|>\n\n") + n("<|eot_id|>")

        return cls(
            fixed=n("<|begin_of_text|>") + header("assistant") - n("<|eot_id|>"),
            system=header("system"),
            user=header("user"),
            assistant=header("assistant"),
            separator=n("\n\n"),
        )


@dataclass(frozen=True)
class TextPool:
    """Source text as one string per token, so a slice of n tokens is n tokens again (slices wrap
    around, so a small text file still yields long prompts)."""

    pieces: tuple[str, ...]

    @classmethod
    def from_text(cls, text: str, tokenizer) -> TextPool:
        ids = tokenizer.encode(text)
        if not ids:
            raise ShapeError("the source text is empty; point at a non-empty text file")
        piece = {i: tokenizer.decode([i]) for i in set(ids)}
        return cls(tuple(piece[i] for i in ids))

    def text(self, offset: int, tokens: int) -> str:
        n = len(self.pieces)
        start = offset % n
        whole, rest = divmod(start + tokens, n)
        if whole == 0:
            return "".join(self.pieces[start : start + tokens])
        parts = [*self.pieces[start:], *self.pieces * (whole - 1), *self.pieces[:rest]]
        return "".join(parts)


@dataclass(frozen=True)
class HistoryTurn:
    """An earlier turn of a session as it is re-sent: the user's message and the answer."""

    user: str
    user_tokens: int
    answer: str
    answer_tokens: int


@dataclass(frozen=True)
class Prompt:
    """The messages of one request and what went into them."""

    messages: list[dict[str, str]]
    tokens: int
    """Planned prompt size, template included."""
    history_turns: int
    """Earlier turns re-sent (the oldest drop out when the context limit is reached)."""
    chunks: int
    """Retrieved chunks included."""
    question: str
    question_tokens: int
    context: str
    """The retrieved chunks as they appear before the question."""
    context_tokens: int

    def history_turn(self, answer: str, answer_tokens: int, keep_context: bool) -> HistoryTurn:
        """This turn as later turns of its session re-send it."""
        if keep_context and self.context:
            user = self.messages[-1]["content"]
            return HistoryTurn(
                user, self.context_tokens + self.question_tokens, answer, answer_tokens
            )
        return HistoryTurn(self.question, self.question_tokens, answer, answer_tokens)


class PromptBuilder:
    """Turns a plan and the session's history into chat messages of a planned size."""

    def __init__(
        self,
        shape: ChatShape,
        pool: TextPool,
        cost: TemplateCost | None = None,
        context_limit: int | None = None,
    ) -> None:
        self.shape, self.pool = shape, pool
        self.cost = cost or TemplateCost()
        self.context_limit = context_limit
        check_fits(shape, self.cost, context_limit)

    def chunk_text(self, chunk: int) -> str:
        # Chunks start after the system prompt's text so that they do not repeat it.
        offset = self.shape.system_prompt_tokens + chunk * self.shape.chunk_tokens
        return self.pool.text(offset, self.shape.chunk_tokens)

    def stand_in_answer(self, plan: TurnPlan) -> str:
        """Answer text for history when the real answer never came (the user saw an error and
        asked again in the same conversation)."""
        return self.pool.text(plan.answer_offset, plan.output_tokens)

    def build(self, plan: TurnPlan, history: Sequence[HistoryTurn]) -> Prompt:
        """Messages for `plan`. Without a size to hit, all history is re-sent (oldest turns dropped
        past the context limit); with one (trace replay), the prompt is filled to it."""
        cap = None if self.context_limit is None else self.context_limit - plan.output_tokens
        if plan.prompt_tokens is not None:
            target = plan.prompt_tokens if cap is None else min(plan.prompt_tokens, cap)
            return self._fill(plan, history, target)
        system, question = self.shape.system_prompt_tokens, plan.question_tokens
        kept = list(history)
        if cap is not None:
            while kept and self._size(system, plan.chunks, kept, question) > cap:
                kept.pop(0)
            if self._size(system, plan.chunks, kept, question) > cap:
                return self._fill(plan, [], cap)
        return self._assemble(plan, system, plan.chunks, kept, question)

    def _fill(self, plan: TurnPlan, history: Sequence[HistoryTurn], target: int) -> Prompt:
        """System prompt first, then chunks, then the newest history, the question taking the rest:
        the order in which an application with a context budget keeps things."""
        c = self.cost
        budget = target - c.fixed - c.user - 1  # one question token at least
        system = min(self.shape.system_prompt_tokens, max(0, budget - c.system))
        budget -= (c.system + system) if system else 0
        chunks = []
        for chunk in plan.chunks:
            if self.shape.chunk_tokens + c.separator > budget:
                break
            chunks.append(chunk)
            budget -= self.shape.chunk_tokens + c.separator
        kept: list[HistoryTurn] = []
        for h in reversed(history):
            need = c.user + h.user_tokens + c.assistant + h.answer_tokens
            if need > budget:
                break
            kept.insert(0, h)
            budget -= need
        return self._assemble(plan, system, tuple(chunks), kept, 1 + max(0, budget))

    def _size(
        self, system: int, chunks: Sequence[int], history: Sequence[HistoryTurn], question: int
    ) -> int:
        c = self.cost
        size = c.fixed + (c.system + system if system else 0)
        size += sum(c.user + h.user_tokens + c.assistant + h.answer_tokens for h in history)
        return size + c.user + len(chunks) * (self.shape.chunk_tokens + c.separator) + question

    def _assemble(
        self,
        plan: TurnPlan,
        system: int,
        chunks: Sequence[int],
        history: Sequence[HistoryTurn],
        question_tokens: int,
    ) -> Prompt:
        # A shorter system prompt is a prefix of the full one, so it still shares cached blocks.
        messages = [{"role": "system", "content": self.pool.text(0, system)}] if system else []
        for h in history:
            messages += [
                {"role": "user", "content": h.user},
                {"role": "assistant", "content": h.answer},
            ]
        question = self.pool.text(plan.question_offset, question_tokens)
        context = "\n\n".join(self.chunk_text(ch) for ch in chunks)
        messages.append(
            {"role": "user", "content": f"{context}\n\n{question}" if context else question}
        )
        return Prompt(
            messages,
            self._size(system, chunks, history, question_tokens),
            len(history),
            len(chunks),
            question,
            question_tokens,
            context,
            len(chunks) * (self.shape.chunk_tokens + self.cost.separator),
        )


def check_fits(shape: ChatShape, cost: TemplateCost, context_limit: int | None) -> None:
    """Refuse a shape whose first turn cannot fit the engine's context window."""
    if context_limit is None:
        return
    first = (
        cost.fixed
        + cost.system
        + shape.system_prompt_tokens
        + cost.user
        + shape.retrieved_chunks * (shape.chunk_tokens + cost.separator)
        + shape.question_tokens_max
        + shape.max_tokens
    )
    if first > context_limit:
        raise ShapeError(
            f"a first turn needs up to {first} tokens (system prompt {shape.system_prompt_tokens}, "
            f"{shape.retrieved_chunks} x {shape.chunk_tokens} retrieved, answer up to "
            f"{shape.max_tokens}) but the engine's max-model-len is {context_limit}; lower "
            "--scale, --system-prompt-tokens, --retrieved-chunks, --chunk-tokens or --max-tokens"
        )
