"""Chat traffic with production's shape: sessions, what each turn asks, and when it arrives.

A load test with 200-token prompts says nothing about a product whose prompts are 10k tokens long.
Production chat prompts are a long system prompt every user shares, retrieved document chunks
(drawn from a shared pool with skewed popularity, so popular chunks repeat across users), the
session's earlier turns (the prompt grows turn by turn), and a short question; `bench.chat_prompts`
turns a planned turn into those messages. Everything here is pure: the plan of a run is a function
of the shape and the seed, and the runner (`bench.chat_load`) only adds what the engine answered.

Arrivals are Poisson at a request rate, or a trace's timestamps. Each arrival goes to a session that
is ready for its next turn (its think time since the previous turn has passed), else starts a new
session, so the request process keeps its rate while sessions interleave as real users do.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from scheduler.records import percentile

SIZE_FIELDS = (
    "system_prompt_tokens",
    "chunk_tokens",
    "question_tokens_min",
    "question_tokens_max",
    "output_tokens_median",
    "max_tokens",
)
"""Token sizes that `ChatShape.scaled` multiplies."""


class ShapeError(ValueError):
    """A chat shape that cannot be planned; the message names the setting and the fix."""


@dataclass(frozen=True)
class ChatShape:
    """What one chat turn looks like, in tokens, at production scale unless `scaled`."""

    system_prompt_tokens: int = 6000
    """Shared system prompt, identical for every session (--system-prompt-tokens)."""
    retrieved_chunks: int = 4
    """Retrieved chunks per turn (--retrieved-chunks)."""
    chunk_tokens: int = 500
    """Size of one retrieved chunk (--chunk-tokens)."""
    documents: int = 200
    """Documents in the retrieval pool; chunks are drawn from these."""
    chunks_per_document: int = 16
    """Chunks each pool document splits into."""
    document_skew: float = 1.1
    """Zipf exponent of document popularity: higher means more chunks repeat across users."""
    question_tokens_min: int = 12
    """Shortest user question."""
    question_tokens_max: int = 120
    """Longest user question."""
    output_tokens_median: int = 200
    """Median answer length; answers are log-normal around it."""
    output_tokens_sigma: float = 0.7
    """Spread (log-space standard deviation) of answer lengths."""
    max_tokens: int = 1024
    """Longest answer; also caps a trace's GeneratedTokens (--max-tokens)."""
    turns: float = 4.0
    """Mean turns per session, geometric (--turns)."""
    fixed_turns: bool = False
    """Give every session exactly `turns` turns instead of a geometric number."""
    think_time_s: float = 20.0
    """Mean time between a session's turns, counted from the previous turn's arrival (--think-time)."""
    history_keeps_context: bool = False
    """Re-send earlier turns' retrieved chunks with their questions, not just the questions."""

    def __post_init__(self) -> None:
        for name in (*SIZE_FIELDS, "documents", "chunks_per_document"):
            if getattr(self, name) < 1:
                raise ShapeError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.retrieved_chunks < 0:
            raise ShapeError(f"retrieved_chunks must be 0 or more, got {self.retrieved_chunks}")
        if self.retrieved_chunks > self.documents * self.chunks_per_document:
            raise ShapeError(
                f"retrieved_chunks ({self.retrieved_chunks}) exceeds the pool's "
                f"{self.documents * self.chunks_per_document} chunks; lower it"
            )
        if self.question_tokens_max < self.question_tokens_min:
            raise ShapeError("question_tokens_max is below question_tokens_min; swap them")
        if self.turns < 1 or self.think_time_s < 0 or self.output_tokens_sigma < 0:
            raise ShapeError("turns must be >= 1, think_time_s and output_tokens_sigma >= 0")

    def scaled(self, factor: float) -> ChatShape:
        """The same shape with every token size multiplied by `factor` (at least 1 token), so a
        production shape can be shrunk to what a CPU engine runs in reasonable time."""
        if not factor > 0:
            raise ShapeError(f"scale must be positive, got {factor}")
        return replace(self, **{f: max(1, round(getattr(self, f) * factor)) for f in SIZE_FIELDS})

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Arrival:
    """When a request comes, and the sizes a trace prescribes for it (None: draw from the shape)."""

    t_s: float
    prompt_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True)
class TurnPlan:
    """One planned request: which session and turn it is, and what it asks."""

    index: int
    """Position in arrival order, unique within a run."""
    t_s: float
    """Planned submission, seconds after the start of the run."""
    session: int
    turn: int
    """0 for a session's first request."""
    chunks: tuple[int, ...]
    """Retrieved chunk ids, from the shared pool."""
    question_offset: int
    question_tokens: int
    output_tokens: int
    """max_tokens of the request; with ignore_eos the answer is exactly this long."""
    answer_offset: int
    """Where a stand-in answer comes from when the real one failed."""
    prompt_tokens: int | None = None
    """Total prompt size to hit (trace replay); None lets history grow freely."""


def poisson_arrivals(rate: float, duration_s: float, seed: int) -> list[Arrival]:
    """Arrival times of a Poisson process of `rate` per second over `duration_s` seconds."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ShapeError(f"rate must be positive requests/s, got {rate}")
    rng = random.Random(f"{seed}:arrivals")
    out: list[Arrival] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        out.append(Arrival(t))
        t += rng.expovariate(rate)
    return out


def plan_turns(arrivals: Sequence[Arrival], shape: ChatShape, seed: int) -> list[TurnPlan]:
    """Give each arrival to the session that has waited longest for its next turn, or to a new
    session when none is ready, and draw what the turn asks."""
    rng = random.Random(f"{seed}:sessions")
    draw = _ContentDraw(shape, seed)
    ready: list[tuple[float, int]] = []  # (ready at, session), a heap
    done: dict[int, int] = {}
    total: dict[int, int] = {}
    new_ids = itertools.count()
    plans = []
    for index, arrival in enumerate(arrivals):
        if ready and ready[0][0] <= arrival.t_s:
            session = heapq.heappop(ready)[1]
        else:
            session = next(new_ids)
            done[session], total[session] = 0, _turn_count(shape, rng)
        turn = done[session]
        done[session] += 1
        if done[session] < total[session]:
            heapq.heappush(ready, (arrival.t_s + _think(shape, rng), session))
        plans.append(draw.turn(index, arrival, session, turn))
    return plans


def _turn_count(shape: ChatShape, rng: random.Random) -> int:
    if shape.fixed_turns or shape.turns <= 1:
        return max(1, round(shape.turns))
    stop = 1.0 / shape.turns  # geometric on 1, 2, ...: mean 1/stop
    return 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - stop))


def _think(shape: ChatShape, rng: random.Random) -> float:
    return rng.expovariate(1.0 / shape.think_time_s) if shape.think_time_s > 0 else 0.0


class _ContentDraw:
    """Draws a turn's chunks, question and answer length from its own seeded stream, so one turn's
    content does not change when another's does."""

    def __init__(self, shape: ChatShape, seed: int) -> None:
        self.shape, self.seed = shape, seed
        weights = [1.0 / (d + 1) ** shape.document_skew for d in range(shape.documents)]
        self.cum = list(itertools.accumulate(weights))

    def turn(self, index: int, arrival: Arrival, session: int, turn: int) -> TurnPlan:
        s, rng = self.shape, random.Random(f"{self.seed}:turn:{index}")
        chunks: list[int] = []
        while len(chunks) < s.retrieved_chunks:
            doc = rng.choices(range(s.documents), cum_weights=self.cum)[0]
            chunk = doc * s.chunks_per_document + rng.randrange(s.chunks_per_document)
            if chunk not in chunks:
                chunks.append(chunk)
        output = arrival.output_tokens
        if output is None:
            output = round(
                rng.lognormvariate(math.log(s.output_tokens_median), s.output_tokens_sigma)
            )
        return TurnPlan(
            index=index,
            t_s=arrival.t_s,
            session=session,
            turn=turn,
            chunks=tuple(chunks),
            question_offset=rng.randrange(1 << 30),
            question_tokens=rng.randint(s.question_tokens_min, s.question_tokens_max),
            output_tokens=min(max(1, output), s.max_tokens),
            answer_offset=rng.randrange(1 << 30),
            prompt_tokens=arrival.prompt_tokens,
        )


def plan_stats(plans: Sequence[TurnPlan]) -> dict:
    """Figures of a plan, to print before a run: sessions, turns, answer lengths."""
    sessions = {p.session for p in plans}
    outputs = sorted(p.output_tokens for p in plans)
    return {
        "requests": len(plans),
        "sessions": len(sessions),
        "turns_per_session": len(plans) / len(sessions) if sessions else 0.0,
        "output_tokens_p50": percentile(outputs, 50) if outputs else 0.0,
    }
