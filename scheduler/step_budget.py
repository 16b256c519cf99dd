"""How many prefill tokens each batch request gets in one engine step: the plug-in's one decision.

Every decoding chat user waits for every engine step, so the step, not the request, is what a
batch prefill must fit. The step is composed in two parts. The fixed part is everything that is not
a batch prefill: every decode (chat and batch: one token each, never cut) and chat's own prefill
chunks (never cut). Each batch prefill then gets, in turn, the largest chunk that keeps the step's
predicted time within the batch step target and its tokens within the step's room. A chunk's cost
depends on where it sits in its prompt (attention over the prefix before it), so the same target
gives a short chunk deep in an 80k-token document and a long one at its start.

A step that carries a chat prompt's prefill carries no batch prefill (`batch_room`): chat's
first token then waits for at most one step the target bounds, as each of its later tokens does.
Under a mean target (an E2E SLO bounds the sum of an answer's steps) a step's target is the mean
plus what earlier steps left unused below it, never past the target (`StepCredit`).

Invariants of every grant:
- it never exceeds the request's remaining prompt nor the step's remaining token room;
- it is a multiple of the KV block size, or exactly the remaining prompt (the chunk that ends a
  prefill), so a prompt of any length finishes and KV blocks fill whole in between;
- with the grant added, the predicted step time is within the target; when the fixed part alone
  is over the target every grant is 0 (batch waits, chat does not);
- a grant smaller than `min_chunk_tokens` is 0 unless it ends the prefill: a tiny chunk deep in a
  prompt pays for re-reading the whole prefix and moves the prompt almost nowhere.

`target_bound` says whether the target cut any grant of the step short of what the prompt, the
room and the engine's caps allowed: whether the step ran *at* the target. A controller learns what
a target does to chat only from windows in which it bound (`BudgetController`).

The engine plug-in (`serving/engine_site/`), the simulator's engine and the planner all call
`StepBudget.grant`, so the simulator models the plug-in exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.step import PrefillChunk, StepBatch, StepTimeModel

CHAT_PRIORITY = 0
"""vLLM's `priority` of chat requests; anything above it is batch (lower values run first)."""


@dataclass(frozen=True, slots=True)
class BatchStepTarget:
    """What the controller sets for one replica's engine: the step time batch chunks fit."""

    target_s: float
    model: StepTimeModel
    min_chunk_tokens: int = 0
    paused: bool = False
    idle_target_s: float | None = None
    """The step time batch chunks fit while no chat request is in the engine (None: `target_s`
    always); see `step_target_s`."""
    tail_scale: bool = True
    """Whether the plug-in sizes to the model scaled by the tail of its own error
    (`scheduler/step_scale.py`), so a fixed target holds at the 99th percentile; False where the
    sender corrects the model itself from measured steps (a controller), one correction not two."""
    mean_target_s: float | None = None
    """The mean step time batch chunks keep to while chat is in the engine (None: every step is
    held to `target_s`): a step may run past it, up to `target_s`, on the time steps before it
    left unused below it (`StepCredit`)."""

    def step_target_s(self, chat_in_engine: bool) -> float:
        """The target of one step. With chat in the engine (decoding, prefilling or waiting) it
        is `target_s`, which bounds chat's gaps. With none there is no gap to protect, only the
        wait of a chat that arrives during the step: the step may run to `idle_target_s`, and the
        arriving prompt is reserved whole in the next step."""
        if chat_in_engine or self.idle_target_s is None:
            return self.target_s
        return max(self.target_s, self.idle_target_s)

    def applied_scale(self, engine_scale: float) -> float:
        """What the model's prediction is scaled by when chunks are sized: the engine's tail
        scale under `tail_scale`, else 1 (the sender corrects the model itself)."""
        return engine_scale if self.tail_scale else 1.0


class StepCredit:
    """Step time earlier steps left unused below a mean target, which a later step may spend.

    Chat's ITL SLO bounds each gap; its E2E SLO bounds the sum of an answer's gaps, a mean. Held
    to the mean at every step, a document deep in its prefill, where one KV block costs more than
    a step beside chat's decodes leaves, is granted nothing until a step without chat: it stalls.
    With a credit the shortfall of short steps carries over, so the document moves in a step
    that runs longer, still within `target_s`.

    Invariants, over the steps with chat in the engine: the credit is in [0, target_s - mean];
    each step's target is mean + credit, so batch takes no step past `target_s`, and over any
    run of steps batch's chunks take them past the mean by at most target_s - mean in all (an
    answer of n tokens is slowed by at most that over n steps at the mean). A step longer than
    mean + credit by chat's own work alone clips the credit at 0: batch is not charged for it.
    Steps with no chat in the engine neither earn nor spend (no gap to protect)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._open: tuple[float, float] | None = None  # (mean, room) of the step to settle

    @property
    def settling(self) -> bool:
        """Whether the step last given a target earns or spends (`ran` settles it)."""
        return self._open is not None

    def step_target_s(self, target: BatchStepTarget, chat_in_engine: bool) -> float:
        """The target of this step: `target.step_target_s` without a mean or without chat, else
        the mean plus the credit. The step is then settled by `ran`."""
        mean = target.mean_target_s
        if not chat_in_engine or mean is None:
            self._open = None
            return target.step_target_s(chat_in_engine)
        self._open = (mean, max(0.0, target.target_s - mean))
        return min(target.target_s, mean + self.seconds)

    def ran(self, step_s: float) -> None:
        """Settle the step last given a target, whose predicted time, in the target's units, was
        `step_s` (nothing to settle: no change)."""
        if self._open is None:
            return
        (mean, room), self._open = self._open, None
        self.seconds = min(room, max(0.0, self.seconds + mean - step_s))


def is_batch(priority: int) -> bool:
    """Whether a request of this vLLM priority is batch work (chat sends 0, batch more)."""
    return priority > CHAT_PRIORITY


@dataclass(frozen=True, slots=True)
class BatchPrefill:
    """A batch request that still has prompt to prefill."""

    prefix_tokens: int
    """Tokens of its prompt already in KV (computed or cached): where its next chunk starts."""
    remaining_tokens: int
    """Prompt tokens still to prefill."""


class StepBudget:
    """One step being composed: the fixed part, then batch grants added one at a time."""

    def __init__(
        self,
        model: StepTimeModel,
        target_s: float,
        token_room: int,
        fixed: StepBatch,
        block_size: int = 16,
        min_chunk_tokens: int = 0,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.model = model
        self.target_s = target_s
        self.room = max(0, token_room)
        self.block_size = block_size
        self.min_chunk_tokens = min_chunk_tokens
        self._prefills = list(fixed.prefills)
        self._decode_seqs = fixed.decode_seqs
        self._decode_context = fixed.decode_context_tokens
        self.granted_tokens = 0
        self.target_bound = False
        """Whether the target (or `min_chunk_tokens` under it) held a grant below its cap."""

    def batch(self) -> StepBatch:
        """The step as composed so far."""
        return StepBatch(tuple(self._prefills), self._decode_seqs, self._decode_context)

    def seconds(self) -> float:
        """Predicted time of the step as composed so far."""
        return self.model.step_seconds(self.batch())

    def grant(self, prefill: BatchPrefill, limit: int | None = None) -> int:
        """Prefill tokens `prefill` gets this step (invariants in the module docstring), at most
        `limit` (what the engine's other caps allow); the grant becomes part of the step, so later
        grants see it."""
        untargeted = self._untargeted(prefill, limit)
        tokens = self._largest_fitting(prefill, untargeted)
        if tokens < self.min_chunk_tokens and tokens < prefill.remaining_tokens:
            tokens = 0
        self.target_bound |= tokens < untargeted
        if tokens:
            self._prefills.append(PrefillChunk(tokens, prefill.prefix_tokens))
            self.room -= tokens
            self.granted_tokens += tokens
        return tokens

    def _untargeted(self, prefill: BatchPrefill, limit: int | None) -> int:
        """The grant the target aside: the prompt's rest if it fits the room and the engine's
        caps, else the most whole blocks that do."""
        remaining = prefill.remaining_tokens
        cap = max(0, min(remaining, self.room, remaining if limit is None else limit))
        return cap if cap == remaining else cap - cap % self.block_size

    def _largest_fitting(self, prefill: BatchPrefill, untargeted: int) -> int:
        remaining = prefill.remaining_tokens
        if untargeted <= 0:
            return 0
        if untargeted == remaining and self._fits(remaining, prefill.prefix_tokens):
            return remaining
        # Step time never falls as a chunk grows (non-negative coefficients), so the fitting
        # block multiples are a prefix of 1..untargeted//block: binary search for the last one.
        lo, hi = 0, untargeted // self.block_size
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._fits(mid * self.block_size, prefill.prefix_tokens):
                lo = mid
            else:
                hi = mid - 1
        return lo * self.block_size

    def _fits(self, tokens: int, prefix_tokens: int) -> bool:
        chunk = PrefillChunk(tokens, prefix_tokens)
        step = StepBatch((*self._prefills, chunk), self._decode_seqs, self._decode_context)
        return self.model.step_seconds(step) <= self.target_s


@dataclass(frozen=True, slots=True)
class InEngine:
    """What the sizing needs to know of one request in the engine."""

    left_tokens: int
    """Tokens it still has to compute: its prompt's rest while prefilling, 1 when decoding."""
    computed_tokens: int
    """Tokens already in KV: a prefill chunk's position, a decode's context."""
    batch: bool


def any_chat(requests: Iterable[InEngine]) -> bool:
    """Whether any of `requests` is chat."""
    return any(not r.batch for r in requests)


def chat_reservation(
    running: Iterable[InEngine],
    waiting: Iterable[InEngine],
    step_tokens: int,
    chunk_tokens: int,
    free_seats: int,
) -> tuple[StepBatch, int]:
    """The part of the next step that is never cut, and its tokens: every decode, the running
    chat prefills, then the waiting chat prompts in queue order (priority order puts every chat
    before every batch request) while tokens and seats last. `chunk_tokens` is the engine's cap
    on one prefill chunk (vLLM's `long-prefill-token-threshold`, or the whole step).

    A caller passes no waiting requests for the step after one whose reserved chat prompts the
    engine could not start (no KV for them): reserved again, they would leave batch no room, and
    the batch prefills holding that KV would never move to free it (the engine preempts batch
    for a running request's blocks, never for a waiting one's)."""
    chunks: list[PrefillChunk] = []
    decodes = context = reserved = 0
    for r in running:
        if r.left_tokens <= 1:
            decodes, context, reserved = decodes + 1, context + r.computed_tokens, reserved + 1
        elif not r.batch and reserved < step_tokens:
            n = min(r.left_tokens, chunk_tokens, step_tokens - reserved)
            chunks.append(PrefillChunk(n, r.computed_tokens))
            reserved += n
    for r in waiting:
        if r.batch or free_seats <= 0 or reserved >= step_tokens:
            break
        n = min(r.left_tokens, chunk_tokens, step_tokens - reserved)
        chunks.append(PrefillChunk(n, r.computed_tokens))
        reserved, free_seats = reserved + n, free_seats - 1
    return StepBatch(tuple(chunks), decodes, context), min(reserved, step_tokens)


def batch_room(step_tokens: int, reserved: int, fixed: StepBatch, paused: bool = False) -> int:
    """Tokens batch prefill may take in a step whose never-cut part is `fixed` (`reserved` of the
    engine's `step_tokens`): none while paused, and none in a step that carries a chat prompt's
    prefill. A chat token waits for the step it arrived during and then its own; for a later token
    that is one step the target bounds, and this keeps it so for the first: a chat prompt arriving
    while batch fills a step to the target is not slowed by batch a second time in its own step."""
    if paused or fixed.prefills:
        return 0
    return max(0, step_tokens - reserved)


def size_batch_prefills(
    model: StepTimeModel,
    target_s: float,
    token_room: int,
    fixed: StepBatch,
    prefills: list[BatchPrefill],
    block_size: int = 16,
    min_chunk_tokens: int = 0,
) -> list[int]:
    """Prefill tokens for each of `prefills`, in order (the engine's order: running first, then
    waiting by priority), beside the step's `fixed` part; see the module docstring."""
    budget = StepBudget(model, target_s, token_room, fixed, block_size, min_chunk_tokens)
    return [budget.grant(p) for p in prefills]
