"""The feed-forward half of the controller: what the latency model says a batch prompt will cost.

Two costs matter to chat. Every decoding chat user waits for each engine step, so the step a batch
prompt's prefill shares with the chat decodes must fit the ITL budget (`largest_prompt_within`).
And the engine finishes the prefills it has started before it starts a waiting request, whatever
their priorities, so a chat arriving behind batch prefills waits for them: the batch prompt tokens
in flight must drain within a share of the TTFT budget (`prefill_allowance`).

The engine prefills a long prompt at most `step_tokens` per step (vLLM's
`long-prefill-token-threshold`, or `max-num-batched-tokens`), so a prompt longer than one step costs
more steps, not longer ones. Without that number (`step_tokens=None`) a whole prompt is priced as
one step, which is right for the in-engine chunk and pessimistic for a map-reduce section.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from scheduler.admission import Observation
from scheduler.step import PrefillChunk, StepBatch, StepTimeModel


@dataclass(frozen=True, slots=True)
class Load:
    """What a new batch prompt's prefill would share each step with, read off one observation."""

    decode_seqs: int
    """Chat decodes plus batch requests past their prefill: one token each per step."""
    decode_context_tokens: int
    """Context those decodes attend over."""
    prefix_tokens: int
    """Deepest unfinished batch prefill position: where a chunk's attention is dearest."""
    batch_in_flight: int
    """Batch requests admitted and not finished."""
    prefill_pending: int
    """Batch prompt tokens admitted but not yet prefilled: what a new chat would queue behind."""
    chat_queued: int = 0
    """Chat requests in the engine that have not started decoding: waiting, or prefilling."""


def load_of(obs: Observation) -> Load:
    """The load of `obs`: decoding sequences, deepest prefill, batch prefill still to come, and
    chat still on its way to a first token."""
    decoding = [b for b in obs.batch_in_flight if b.prefill_remaining == 0]
    prefilling = [b for b in obs.batch_in_flight if b.prefill_remaining > 0]
    return Load(
        decode_seqs=obs.chat_decoding + len(decoding),
        decode_context_tokens=obs.chat_decode_context_tokens
        + sum(b.prompt_tokens for b in decoding),
        prefix_tokens=max((b.prefilled_tokens for b in prefilling), default=0),
        batch_in_flight=len(obs.batch_in_flight),
        prefill_pending=sum(b.prefill_remaining for b in prefilling),
        chat_queued=chat_queued(obs),
    )


def chat_queued(obs: Observation) -> int:
    """Chat requests in the engine that have no first token yet: every request in the engine less
    the decoding chat and the batch. A sensor that counts prefilling chat as decoding (the Gate's
    vLLM sensor does, having no finer number) leaves only the chat still waiting: an undercount."""
    in_engine = obs.running + obs.waiting
    return max(0, in_engine - obs.chat_decoding - len(obs.batch_in_flight))


def step_seconds(
    model: StepTimeModel, load: Load, prompt_tokens: int, step_tokens: int | None
) -> float:
    """The slowest step a batch prompt of `prompt_tokens` puts beside `load`: its last
    `step_tokens` (or all of it) prefilled at the deepest position it reaches."""
    per_step = min(prompt_tokens, step_tokens or prompt_tokens)
    prefix = load.prefix_tokens + prompt_tokens - per_step
    prefills = (PrefillChunk(per_step, prefix),) if prompt_tokens else ()
    return model.step_seconds(StepBatch(prefills, load.decode_seqs, load.decode_context_tokens))


def full_step_fits(
    model: StepTimeModel,
    load: Load,
    budget_s: float,
    step_tokens: int,
    more_decodes: int = 0,
    more_context_tokens: int = 0,
    prompt_tokens: int = 0,
) -> bool:
    """Whether a step filling the engine's prefill budget (`step_tokens`) beside `load`, plus
    `more_decodes` sequences over `more_context_tokens`, fits `budget_s`: if it does, no number of
    batch prompts waiting to prefill can make a step longer than the budget. The step is priced at
    the deepest position a prefill reaches, in flight or in a new prompt of `prompt_tokens`: the
    last step of a 1024-token prompt attends over the 512 before it, and on `cpu-small` that step
    is half as long again as the first."""
    more = replace(
        load,
        decode_seqs=load.decode_seqs + more_decodes,
        decode_context_tokens=load.decode_context_tokens + more_context_tokens,
        prefix_tokens=max(load.prefix_tokens, prompt_tokens - step_tokens),
    )
    return step_seconds(model, more, step_tokens, step_tokens) <= budget_s


def largest_prompt_within(
    model: StepTimeModel,
    budget_s: float,
    load: Load,
    cap: int,
    granularity: int,
    step_tokens: int | None,
) -> int:
    """The largest batch prompt (a multiple of `granularity`, at most `cap`) whose steps beside
    `load` all fit `budget_s`; 0 if none. Step time never falls as the prompt grows, so a binary
    search over ~log2(cap / granularity) model calls finds it."""

    def fits(units: int) -> bool:
        return step_seconds(model, load, units * granularity, step_tokens) <= budget_s

    return _largest(fits, cap // granularity) * granularity


def prefill_allowance(
    model: StepTimeModel, load: Load, wait_s: float, step_tokens: int | None
) -> int | None:
    """Batch prompt tokens the engine prefills in `wait_s` beside `load`: how much batch prefill a
    chat may find ahead of it. None without `step_tokens` (the drain rate is then unknown)."""
    if step_tokens is None:
        return None
    return int(wait_s / step_seconds(model, load, step_tokens, step_tokens) * step_tokens)


def _largest(fits: Callable[[int], bool], hi: int) -> int:
    """The largest u in [1, hi] with fits(u), for a `fits` that turns False and stays so; 0 if none."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
