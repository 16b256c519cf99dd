"""Engine step times from request timings the streaming client sees.

The engine exposes no per-step timer, and on a busy host single steps cannot be read off a stream
either: on cpu-small the engine stepped every 1-3 ms while whole responses reached the client in one
burst (its API server and the client only get the CPU between engine steps). What survives is time
conservation over a request, from submission to a token, since the lags at both ends are alike:

- Decode steps: the same B cached prompts are sent for 1 and for 1 + n output tokens; the difference
  of their times to last token is n decode steps of B sequences.
- Prefill steps: a prompt whose first p tokens are in the prefix cache is prefilled in one step that
  carries one chunk at prefix p; its time to first token is that step plus the request's overhead,
  which 1-token requests measure.

Other processes on the host only ever add time (a stalled engine or client), never remove it, so
of repeated runs the fastest is the closest to the engine's own cost: samples take the minimum.

Pure functions of those timings, so synthetic timings test them.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.latency_fit import StepSample
from scheduler.step import PrefillChunk, StepBatch, StepTimeModel


@dataclass(frozen=True)
class DecodeRun:
    """One repeat of a decode shape: each stream's seconds from submission to its last token, sent
    for `short_tokens` and then for `long_tokens` output tokens with the same (cached) prompts."""

    context: int
    """Prompt tokens of each stream."""
    short_tokens: int
    long_tokens: int
    short_s: tuple[float, ...]
    long_s: tuple[float, ...]

    @property
    def seqs(self) -> int:
        return len(self.long_s)


def decode_sample(runs: Sequence[DecodeRun]) -> StepSample | None:
    """The decode step from the fastest short and the fastest long run (each the median over its
    streams, which end together), or None when noise left no positive step time.

    Output token j is computed over context + j tokens, and the timed steps produce tokens
    short..long-1, so the sample's context is their mean."""
    r = runs[0]
    short = min(statistics.median(run.short_s) for run in runs)
    long = min(statistics.median(run.long_s) for run in runs)
    seconds = (long - short) / (r.long_tokens - r.short_tokens)
    if not seconds > 0:
        return None
    mean_context = r.context + (r.short_tokens + r.long_tokens - 1) / 2
    return StepSample(StepBatch((), r.seqs, round(r.seqs * mean_context)), seconds)


@dataclass(frozen=True)
class ChunkRun:
    """One request prefilled in a single step beside `decode_seqs` decoding streams: its chunk (the
    prompt past the cached prefix the engine reported) and its time to first token."""

    decode_seqs: int
    decode_context: int
    """Total context of the decoding streams at the time (an estimate: see `decoder_context`)."""
    chunk: PrefillChunk
    ttft_s: float


def decoder_context(
    seqs: int, prompt: int, elapsed_s: float, step_s: float, max_tokens: int
) -> int:
    """Total context of `seqs` streams that have decoded for `elapsed_s` at `step_s` a token."""
    generated = min(int(elapsed_s / step_s), max_tokens) if step_s > 0 else 0
    return seqs * (prompt + generated)


def request_overhead(null_ttfts: Sequence[Sequence[float]], null_step_s: float) -> float:
    """Seconds a request spends outside its engine step (HTTP, queueing, sending the token), from
    1-token requests less the step they ran in.

    The requests come in groups, one per chunk group, as many as each chunk was timed; each group
    gives its fastest, like each chunk sample, and the overhead is the median of those. The
    fastest of all would be luckier than a chunk's fastest of a few, and leave chunks too slow."""
    fastest = statistics.median(min(group) for group in null_ttfts)
    return max(fastest - null_step_s, 0.0)


def chunk_samples(
    runs: Sequence[ChunkRun], overhead_s: Mapping[int, float]
) -> tuple[list[StepSample], list[tuple[int, PrefillChunk]]]:
    """One sample per (decodes, chunk): the fastest time to first token over repeats, less the
    request overhead beside that many decodes. Also returns the shapes left with no positive time."""
    groups: dict[tuple[int, PrefillChunk], list[ChunkRun]] = defaultdict(list)
    for run in runs:
        groups[(run.decode_seqs, run.chunk)].append(run)
    samples, dropped = [], []
    for (seqs, chunk), seen in groups.items():
        seconds = min(r.ttft_s for r in seen) - overhead_s[seqs]
        if not seconds > 0:
            dropped.append((seqs, chunk))
            continue
        context = round(statistics.median(r.decode_context for r in seen))
        samples.append(StepSample(StepBatch((chunk,), seqs, context), seconds))
    return samples, dropped


def nearest_decode_step(samples: Sequence[StepSample], seqs: int) -> float | None:
    """The measured decode-only step whose batch size is nearest `seqs` (at its shortest context),
    or None when no decode step was measured."""
    decode = [s for s in samples if not s.batch.prefills]
    if not decode:
        return None
    nearest = min(
        decode, key=lambda s: (abs(s.batch.decode_seqs - seqs), s.batch.decode_context_tokens)
    )
    return nearest.seconds


def stalled(samples: Sequence[StepSample], model: StepTimeModel, k: float = 3.0) -> list[int]:
    """Indices of samples so much slower than `model` that contention, not the step, explains them.

    Residuals are taken as log(measured / predicted), so a step twice as slow weighs as much at 2 ms
    as at 200 ms; a sample is stalled when its residual exceeds the median by `k` robust standard
    deviations (1.4826 MAD). One-sided, because contention only ever adds time: a sample faster
    than the model is information about the model, never noise of this kind."""
    logs = [math.log(s.seconds / model.step_seconds(s.batch)) for s in samples]
    middle = statistics.median(logs)
    spread = 1.4826 * statistics.median(abs(r - middle) for r in logs)
    return [i for i, r in enumerate(logs) if spread > 0 and r > middle + k * spread]
