"""Scoring one benchmark scenario from its records. Pure: records in, figures out.

Chat latency follows docs/design.md §4.6: ITL percentiles over every token gap (token-weighted), TTFT and E2E
over requests. A window holds the SLO when its chat ITL p99 and TTFT p99 are within target, and its E2E
p99 where the SLO sets one (a chat counts in the window it ended in), and no chat request failed in
it; goodput counts batch tokens of requests that ended in such windows.

ITL can come from two places: the client's streamed gaps, or the engine's own histogram (see
serving/engine_itl.py for why the engine's is the one to judge by on a small shared host). Functions
that judge ITL take an optional `engine_itl(t0, t1) -> p99 ms`; without it they use the gaps.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Sequence

from bench.serving_metrics import goodput, goodput_slos, request_latency
from scheduler.latency_model import largest_chunk_within
from scheduler.records import RequestRecord, percentile
from scheduler.slo import SLO
from scheduler.step import PrefillChunk, StepBatch, StepTimeModel

FAILED = ("error", "timeout")  # cancelled at the end of a run is not a user-visible failure

WindowP99 = Callable[[float, float], float | None]
"""ITL p99 in ms over [t0, t1) from another source than the streamed gaps (None: no tokens)."""


def chat_latency(
    chat: list[RequestRecord],
    engine_itl_ms: dict[str, float | None] | None = None,
    slo: SLO | None = None,
    seconds: float | None = None,
) -> dict:
    """Chat latency figures (bench/serving_metrics.py: TTFT, TPOT, ITL, E2E). `itl_ms` is the
    engine's when `engine_itl_ms` is given, with the client's gaps kept beside it as
    `client_itl_ms`; `itl_source` says which is which. With `slo` and `seconds`, also vLLM-style
    `goodput`: requests/s over `seconds` that met the SLO's targets one by one."""
    latency = request_latency(chat)
    out = {
        "ttft_ms": latency["ttft_ms"],
        "tpot_ms": latency["tpot_ms"],
        "itl_ms": engine_itl_ms if engine_itl_ms is not None else latency["itl_ms"],
        "itl_source": "engine" if engine_itl_ms is not None else "client",
        "client_itl_ms": latency["itl_ms"],
        "e2e_ms": latency["e2e_ms"],
        "requests": len(chat),
        "errors": sum(r.status in FAILED for r in chat),
    }
    if slo is not None and seconds is not None:
        out |= goodput(chat, goodput_slos(slo), seconds)
    return out


def window_verdicts(
    chat: list[RequestRecord], t0: float, t1: float, slo: SLO, engine_itl: WindowP99 | None = None
) -> list[bool]:
    """Per window of `slo.window_s` from t0: did chat hold its SLO? (No chat: held.) ITL from
    `engine_itl` when given, else from the streamed gaps."""
    n = max(1, math.ceil((t1 - t0) / slo.window_s - 1e-9))
    gaps: list[list[float]] = [[] for _ in range(n)]
    ttfts: list[list[float]] = [[] for _ in range(n)]
    e2es: list[list[float]] = [[] for _ in range(n)]
    failed = [False] * n

    def window(t: float | None) -> int | None:
        if t is None or t < t0 or t >= t0 + n * slo.window_s:
            return None
        return int((t - t0) // slo.window_s)

    for r in chat:
        for g in r.gaps:
            if (w := window(g.t)) is not None:
                gaps[w].append(g.gap_s)
        if r.ttft_s is not None and (w := window(r.t_first_token)) is not None:
            ttfts[w].append(r.ttft_s)
        if r.status == "ok" and r.e2e_s is not None and (w := window(r.t_end)) is not None:
            e2es[w].append(r.e2e_s)
        if r.status in FAILED and (w := window(r.t_end)) is not None:
            failed[w] = True
    verdicts = []
    for w in range(n):
        if engine_itl is not None:
            itl_p99 = engine_itl(t0 + w * slo.window_s, t0 + (w + 1) * slo.window_s)
        else:
            itl_p99 = percentile(sorted(gaps[w]), 99) * 1000 if gaps[w] else None
        verdicts.append(_holds(itl_p99, ttfts[w], e2es[w], slo) and not failed[w])
    return verdicts


def _holds(itl_p99_ms: float | None, ttfts: list[float], e2es: list[float], slo: SLO) -> bool:
    def within(values: list[float], target_ms: float | None) -> bool:
        return target_ms is None or not values or percentile(sorted(values), 99) * 1000 <= target_ms

    itl_ok = itl_p99_ms is None or itl_p99_ms <= slo.chat_itl_p99_ms
    return itl_ok and within(ttfts, slo.chat_ttft_p99_ms) and within(e2es, slo.chat_e2e_p99_ms)


def batch_throughput(
    batch_rows: list[dict], t0: float, t1: float, slo: SLO, verdicts: list[bool]
) -> dict:
    """Batch tokens (prompt + output) of requests that ended ok inside [t0, t1), per second, in
    all windows and in windows where chat held its SLO."""
    total = good = 0
    for r in batch_rows:
        end = r.get("t_end")
        if r.get("status") != "ok" or end is None or not t0 <= end < t1:
            continue
        tokens = (r.get("prompt_tokens") or 0) + (r.get("output_tokens") or 0)
        total += tokens
        w = min(int((end - t0) // slo.window_s), len(verdicts) - 1)
        good += tokens if verdicts[w] else 0
    seconds = max(t1 - t0, 1e-9)
    return {"tokens_per_s": total / seconds, "slo_batch_tokens_per_s": good / seconds}


def chat_decode_load(chat: list[RequestRecord], t0: float, t1: float) -> tuple[float, float]:
    """Mean chat sequences decoding at once (Little's law over decode time) and their mean
    context length, over [t0, t1)."""
    busy = [r for r in chat if r.t_first_token is not None and r.t_end is not None]
    decode_s = sum(max(0.0, min(r.t_end, t1) - max(r.t_first_token, t0)) for r in busy)
    seqs = decode_s / max(t1 - t0, 1e-9)
    contexts = [r.prompt_tokens + r.output_tokens / 2 for r in busy]
    return seqs, (sum(contexts) / len(contexts) if contexts else 0.0)


def batch_prompts(batch_rows: list[dict]) -> list[int]:
    """The prompt lengths of the batch requests a run finished: what its bound walks through."""
    return [
        r["prompt_tokens"] for r in batch_rows if r.get("status") == "ok" and r.get("prompt_tokens")
    ]


def _step_decodes(decode_seqs: float, context: float) -> tuple[int, int]:
    """The chat decodes a priced step carries: the mean sequences decoding (at least one) and
    their total context, at the mean context each."""
    seqs = max(1, round(decode_seqs))
    return seqs, int(seqs * context)


def chat_prompt_share(
    model: StepTimeModel,
    chat: list[RequestRecord],
    t0: float,
    t1: float,
    decode_seqs: float,
    context: float,
    chunk_tokens: int,
    room_tokens: int,
) -> float:
    """Share of the engine's time over [t0, t1) that chat's own prompts take from batch prefill.

    The engine schedules chat first, each prompt in chunks of at most `chunk_tokens` (its cap on
    one request's chunk, `step_chunk_cap`), so every chunk but a prompt's last fills the step's
    token room (`room_tokens`, what the step budget leaves beside the decodes), and no batch
    prefill fits in that step. Each chunk of a prompt whose first token came in the span, from
    its cached prefix on, is priced as a step beside the chat decodes, and counted for the share
    of the room it fills: the room a short last chunk leaves is room batch could use."""
    seqs, ctx = _step_decodes(decode_seqs, context)
    busy = 0.0
    for r in chat:
        if r.t_first_token is None or not t0 <= r.t_first_token < t1:
            continue
        position = r.cached_tokens
        while position < r.prompt_tokens:
            chunk = min(chunk_tokens, r.prompt_tokens - position)
            step_s = model.step_seconds(StepBatch((PrefillChunk(chunk, position),), seqs, ctx))
            busy += step_s * min(1.0, chunk / room_tokens)
            position += chunk
    return min(1.0, busy / max(t1 - t0, 1e-9))


def bound_tokens_per_s(
    model: StepTimeModel,
    slo: SLO,
    decode_seqs: float,
    context: float,
    max_chunk: int,
    prompts: Sequence[int] = (),
    chat_prompt_share: float = 0.0,
) -> float:
    """Batch prefill tokens per second that fit the ITL SLO beside the measured chat load: every
    step carries the largest batch chunk whose predicted step time stays within the SLO, back to
    back, through each of `prompts` (the prompt lengths the run sent) from its first token to its
    last, in the time chat's own prompts leave (`chat_prompt_share` of it is theirs). Deep in a
    long prompt a chunk pays attention over its whole prefix, so an 80k-token document sent whole
    bounds lower than the same tokens in sections. Without prompts, one chunk at position 0. An
    upper bound: it ignores KV, which may not hold a whole document beside chat."""
    free = 1.0 - chat_prompt_share
    seqs, ctx = _step_decodes(decode_seqs, context)

    def chunk_at(position: int) -> int:
        return largest_chunk_within(
            model, slo.chat_itl_p99_ms / 1000, position, seqs, ctx, max_chunk
        )

    def step_s(chunk: int, position: int) -> float:
        return model.step_seconds(StepBatch((PrefillChunk(chunk, position),), seqs, ctx))

    lengths = sorted(p for p in prompts if p > 0)
    if not lengths:
        chunk = chunk_at(0)
        return free * chunk / step_s(chunk, 0) if chunk > 0 else 0.0
    # One walk in full chunks to the longest prompt; each prompt takes the walk's steps up to
    # its own length and a last chunk cut to it, as it would prefilled alone. (Cutting the walk
    # at every prompt's length would price steps of a few tokens no prompt runs.)
    starts, ends = [0], [0.0]  # chunk start positions and the walk's time at each
    while starts[-1] < lengths[-1]:
        chunk = chunk_at(starts[-1])
        if chunk <= 0:
            return 0.0
        ends.append(ends[-1] + step_s(chunk, starts[-1]))
        starts.append(starts[-1] + chunk)
    seconds = 0.0
    for length in lengths:
        i = bisect_left(starts, length) - 1  # the chunk that ends the prompt starts at starts[i]
        seconds += ends[i] + step_s(length - starts[i], starts[i])
    return free * sum(lengths) / seconds
