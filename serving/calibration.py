"""Measure a real replica's engine steps through the streaming client and fit the latency model.

The sweep (`serving.calibration_plan`) runs serially: two shapes at once would share steps. Every
shape is ordinary `/v1/completions` requests with random token-id prompts (fresh ones never hit the
prefix cache; repeated ones are meant to) and `ignore_eos`, so lengths are exactly what the plan
says; `serving.step_timing` explains how request timings become step samples. The fit itself is
`scheduler.latency_fit.fit`; this module adds where its samples came from, and keeps them
(`serving.step_samples`) so `refit` can fit them again without a replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import math
import os
import random
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.latency_fit import FitReport, StepSample, fit
from scheduler.latency_model import LatencyModel
from scheduler.step import PrefillChunk
from serving.calibration_plan import CalibrationError, ChunkGroup, DecodeShape, SweepPlan
from serving.client import ClientConfig, Completion, StreamingClient
from serving.engine_config import EngineConfig
from serving.step_samples import read_samples, samples_path, write_samples
from serving.step_timing import (
    ChunkRun,
    DecodeRun,
    chunk_samples,
    decode_sample,
    decoder_context,
    nearest_decode_step,
    request_overhead,
    stalled,
)

FIRST_TOKEN_ID = 16
"""Prompt ids start here, clear of the special tokens at the bottom of the local vocabularies."""
FALLBACK_VOCAB = 1000
"""Prompt ids stay below this when the config names no vocabulary: every real tokenizer is larger."""
MIN_SAMPLES = 8
"""Fewer measured steps than this cannot pin down seven coefficients and the knee."""
STALL_ROUNDS = 2
"""Fit, drop the steps contention stalled, refit: at most this many times."""
MIN_KEPT_SHARE = 0.75
"""Never drop more than a quarter of the steps as stalled: beyond that the model, not the host, is
what does not fit."""
LEAD_S = 0.05
"""Pause between sending the decoding streams and the probe that confirms they decode."""
CLIENT = ClientConfig(
    connect_timeout_s=120.0, read_timeout_s=900.0, total_timeout_s=1800.0, retries=0
)
"""A busy host can leave a connection or a deep prefill waiting for minutes; a retry would bill
the failed attempt to the request's timing, so there is none."""

Progress = Callable[[str], None]


@dataclass
class CalibrationResult:
    """The fitted model, how well it fits, and what the sweep saw."""

    model: LatencyModel
    report: FitReport
    samples: list[StepSample]
    """The steps the model was fitted to."""
    stalled: list[StepSample] = field(default_factory=list)
    """Measured steps left out of the fit as stalled by other processes on the host."""
    notes: list[str] = field(default_factory=list)
    """Shapes skipped or unreadable, with why."""
    wall_s: float = 0.0
    host_load: dict = field(default_factory=dict)
    """1-minute load average before and after, and the CPU count: a busy host inflates steps."""


def prompt_vocab(config: EngineConfig) -> int:
    """Size of the id range prompts draw from: the served model's vocabulary where the config says."""
    if config.model.architecture is not None:
        return config.model.architecture.vocab
    if config.model.spec is not None:
        from scheduler.specs import model_spec

        return model_spec(config.model.spec).vocab
    return FALLBACK_VOCAB


class Calibrator:
    """Runs one sweep plan against one replica, shape after shape."""

    def __init__(
        self,
        client: StreamingClient,
        plan: SweepPlan,
        vocab: int,
        seed: int = 0,
        progress: Progress | None = None,
    ) -> None:
        self.client = client
        self.plan = plan
        self.vocab = max(vocab, FIRST_TOKEN_ID + 2)
        self.rng = random.Random(seed)
        self.progress = progress or (lambda _msg: None)
        self._notes: Counter[str] = Counter(plan.skipped)
        self._decode_prompts: dict[int, list[list[int]]] = {}
        """Prompts of the decode shapes kept in the engine's prefix cache, by length."""
        self._prefixes: dict[int, list[int]] = {}
        """Prefixes of the chunk groups kept in the engine's prefix cache, by length."""

    def note(self, message: str) -> None:
        """Record something that could not be measured; repeats are counted, not listed."""
        self._notes[message] += 1

    @property
    def notes(self) -> list[str]:
        return [m if n == 1 else f"{m} (x{n})" for m, n in self._notes.items()]

    def prompt(self, tokens: int) -> list[int]:
        """Random token ids: no two prompts share a cacheable block."""
        return [self.rng.randrange(FIRST_TOKEN_ID, self.vocab) for _ in range(tokens)]

    async def stream(self, prompt: list[int], max_tokens: int) -> Completion:
        done = await self.client.complete(
            prompt, max_tokens=max_tokens, ignore_eos=True, cls="batch"
        )
        if not done.ok or not done.token_times:
            raise CalibrationError(
                f"replica {self.client.base_url} failed a calibration request "
                f"({len(prompt)} prompt tokens): {done.record.error}"
            )
        return done

    async def measure(self) -> list[StepSample]:
        """Warm up, then time every planned shape once per pass; what could not be timed goes to
        `notes`. Passes rather than back-to-back repeats: a burst of load on the host lasting
        seconds then spoils one run of many shapes instead of every run of one shape."""
        await self.warm_up()
        sweep = self.plan.sweep
        decode_runs: dict[DecodeShape, list[DecodeRun]] = defaultdict(list)
        chunk_runs: list[ChunkRun] = []
        nulls: dict[ChunkGroup, list[float]] = defaultdict(list)
        decode: list[StepSample] = []
        for n in range(1, sweep.repeats + 1):
            for shape in self.plan.decode:
                self.progress(f"pass {n}/{sweep.repeats}: decode B={shape.seqs} L={shape.context}")
                decode_runs[shape].append(await self.decode_run(shape))
            decode = self.decode_samples(decode_runs)
            for group in self.plan.chunks:
                self.progress(
                    f"pass {n}/{sweep.repeats}: chunks {group.sizes} at "
                    f"p={group.prefix} beside B={group.decode_seqs}"
                )
                chunk_runs += await self.chunk_run(group, decode, nulls[group])
        for shape, runs in decode_runs.items():
            if decode_sample(runs) is None:
                self.note(f"decode B={shape.seqs} L={shape.context}: no positive step time")
        return decode + self.chunk_samples(chunk_runs, nulls, decode)

    async def warm_up(self) -> None:
        """A small request of each batch size and one full chunk: the CPU engine compiles on first
        use of a shape, and that must not be billed to a measured step."""
        sweep = self.plan.sweep
        for seqs in sorted({*sweep.decode_seqs, *(b + 1 for b in sweep.chunk_decode_seqs)}):
            if seqs <= self.plan.limits.max_num_seqs:
                await self.together([self.prompt(32) for _ in range(seqs)], 8)
        await self.stream(self.prompt(self.plan.limits.max_chunk(0)), 1)
        self.progress("warm-up done")

    async def together(self, prompts: list[list[int]], max_tokens: int) -> tuple[float, ...]:
        """Send prompts at once; each stream's seconds from submission to its last token."""
        done = await asyncio.gather(*(self.stream(p, max_tokens) for p in prompts))
        return tuple(c.token_times[-1] - c.record.t_submit for c in done)

    async def decode_run(self, shape: DecodeShape) -> DecodeRun:
        """The shape's cached prompts sent for 1 and for 1 + decode_steps output tokens."""
        prompts = await self.cached_prompts(shape)
        steps = self.plan.sweep.decode_steps
        short = await self.together(prompts, 1)
        long = await self.together(prompts, 1 + steps)
        return DecodeRun(shape.context, 1, 1 + steps, short, long)

    async def cached_prompts(self, shape: DecodeShape) -> list[list[int]]:
        """`shape.seqs` prompts in the prefix cache, so the timed runs skip their prefill: those a
        smaller batch of the same context left there, and fresh ones sent once for 1 token."""
        prompts = self._decode_prompts.setdefault(shape.context, [])
        fresh = [self.prompt(shape.context) for _ in range(shape.seqs - len(prompts))]
        if fresh:
            await self.together(fresh, 1)
            prompts += fresh
        return prompts[: shape.seqs]

    async def cached_prefix(self, tokens: int) -> list[int]:
        """A prompt of `tokens` in the prefix cache, shared by every group at that position."""
        if tokens not in self._prefixes:
            self._prefixes[tokens] = self.prompt(tokens)
            if tokens:
                await self.stream(self._prefixes[tokens], 1)
        return self._prefixes[tokens]

    @staticmethod
    def decode_samples(runs: dict[DecodeShape, list[DecodeRun]]) -> list[StepSample]:
        samples = [decode_sample(r) for r in runs.values()]
        return [s for s in samples if s is not None]

    async def chunk_run(
        self, group: ChunkGroup, decode: list[StepSample], nulls: list[float]
    ) -> list[ChunkRun]:
        """With fresh decoders running, one 1-token request (the overhead) and one request per
        chunk size, each the cached prefix plus fresh tokens. A run whose decoders did not last
        is dropped, and so is a request that was not prefilled in one step (both noted)."""
        prefix = await self.cached_prefix(group.prefix)
        step = nearest_decode_step(decode, group.decode_seqs) or 0.0
        async with self.decoding(group.decode_seqs) as decoders:
            started, runs = time.time(), []
            nulls.append((await self.stream(self.prompt(1), 1)).record.ttft_s)
            for size in group.sizes:
                done = await self.stream(prefix + self.prompt(size), 1)
                runs.append(self._chunk_run(done, group.decode_seqs, started, step))
            ended_early = any(d.done() for d in decoders)
        where = f"chunks at p={group.prefix} beside B={group.decode_seqs}"
        if ended_early:
            self.note(f"{where}: run dropped, a decoding stream ended early")
            return []
        if None in runs:
            self.note(
                f"{where}: a request took more than one step (prefix not cached, or the replica "
                "does not report cached tokens: set vllm: enable-prompt-tokens-details: true)"
            )
        return [r for r in runs if r is not None]

    def chunk_samples(
        self,
        runs: list[ChunkRun],
        nulls: dict[ChunkGroup, list[float]],
        decode: list[StepSample],
    ) -> list[StepSample]:
        """Chunk samples less the request overhead measured beside the same number of decodes."""
        by_seqs: dict[int, list[list[float]]] = defaultdict(list)
        for group, ttfts in nulls.items():
            by_seqs[group.decode_seqs].append(ttfts)
        overhead = {
            seqs: request_overhead(groups, nearest_decode_step(decode, seqs + 1) or 0.0)
            for seqs, groups in by_seqs.items()
        }
        samples, dropped = chunk_samples(runs, overhead)
        for seqs, chunk in dropped:
            self.note(
                f"chunk {chunk.tokens} at p={chunk.prefix_tokens} beside B={seqs}: "
                "no time left after the request overhead"
            )
        return samples

    def _chunk_run(
        self, done: Completion, seqs: int, started: float, step: float
    ) -> ChunkRun | None:
        """The chunk this request was prefilled in, from the cached prefix the engine reported;
        None when the uncached part cannot have fit in one step."""
        rec = done.record
        chunk = PrefillChunk(rec.prompt_tokens - rec.cached_tokens, rec.cached_tokens)
        if chunk.tokens > self.plan.limits.max_chunk(seqs):
            return None
        sweep = self.plan.sweep
        context = decoder_context(
            seqs,
            sweep.decoder_prompt_tokens,
            rec.t_submit - started,
            step,
            self.plan.decoder_tokens,
        )
        return ChunkRun(seqs, context, chunk, rec.ttft_s)

    @contextlib.asynccontextmanager
    async def decoding(self, seqs: int) -> AsyncIterator[list[asyncio.Task]]:
        """`seqs` streams decoding for the length of the block, then cancelled (the engine aborts
        them). The probe after them is served after their prompts (equal priorities run in
        arrival order), so once it answers they all decode."""
        sweep = self.plan.sweep
        tasks = [
            asyncio.create_task(
                self.stream(self.prompt(sweep.decoder_prompt_tokens), self.plan.decoder_tokens)
            )
            for _ in range(seqs)
        ]
        try:
            if tasks:
                await asyncio.sleep(LEAD_S)
                await self.stream(self.prompt(1), 1)
            yield tasks
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def calibrate(
    base_url: str,
    served_model: str,
    plan: SweepPlan,
    vocab: int,
    prior: LatencyModel | None = None,
    seed: int = 0,
    progress: Progress | None = None,
    engine_steps: Path | None = None,
) -> CalibrationResult:
    """Measure the replica at `base_url` along `plan` and fit the latency model to what it saw.

    With `engine_steps`, the replica's own step log (`serving/engine_site/step_log.py`, written by
    the plug-in), the fit is to the steps as the engine timed them: every step the sweep caused,
    its composition exact, no request overhead in it. The sweep's own timings from outside are
    then only a check that the sweep ran."""
    start, load_before = time.monotonic(), os.getloadavg()[0]
    logged_before = _line_count(engine_steps) if engine_steps is not None else 0
    async with StreamingClient(base_url, served_model, run_id="calibrate", config=CLIENT) as client:
        calibrator = Calibrator(client, plan, vocab, seed, progress)
        samples, notes = await calibrator.measure(), calibrator.notes
    if engine_steps is not None:
        outside = len(samples)
        samples = read_samples(engine_steps)[logged_before:]
        notes.append(
            f"fitted to the {len(samples)} steps the engine timed itself "
            f"({outside} timed from outside by the sweep)"
        )
    if len(samples) < MIN_SAMPLES:
        raise CalibrationError(
            f"only {len(samples)} engine steps could be timed (need {MIN_SAMPLES}): "
            + "; ".join(notes or ["no shape was readable"])
            + ". Rerun on a quieter host or without --quick"
        )
    result = fit_steps(samples, prior, notes)
    result.host_load = {"before": load_before, "after": os.getloadavg()[0], "cpus": os.cpu_count()}
    result.wall_s = time.monotonic() - start
    return result


def _line_count(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


def refit(path: str | Path, prior: LatencyModel | None = None) -> CalibrationResult:
    """Fit the steps a calibration saved (`serving.step_samples`) as `calibrate` fits fresh ones,
    stalled steps judged again: no replica needed."""
    samples = read_samples(path)
    if len(samples) < MIN_SAMPLES:
        raise CalibrationError(
            f"{path} holds {len(samples)} engine steps; a fit needs at least {MIN_SAMPLES}"
        )
    return fit_steps(samples, prior, [])


def fit_steps(
    samples: list[StepSample], prior: LatencyModel | None, notes: list[str]
) -> CalibrationResult:
    """The model of measured `samples`, stalled steps left out and noted."""
    model, report, kept, dropped = fit_without_stalls(samples, prior)
    if dropped:
        notes.append(
            f"{len(dropped)} step(s) left out of the fit: far slower than the other steps "
            "suggest, as when another process held the CPU"
        )
    return CalibrationResult(model, report, kept, dropped, notes)


def fit_without_stalls(
    samples: list[StepSample], prior: LatencyModel | None
) -> tuple[LatencyModel, FitReport, list[StepSample], list[StepSample]]:
    """Fit, leave out the steps contention stalled (`step_timing.stalled`), refit. Returns the
    model, its report on the kept steps, the kept steps and the left-out ones."""
    model, report = fit(samples, prior)
    kept, dropped = list(samples), []
    floor = max(MIN_SAMPLES, math.ceil(MIN_KEPT_SHARE * len(samples)))
    for _ in range(STALL_ROUNDS):
        out = set(stalled(kept, model))
        if not out or len(kept) - len(out) < floor:
            break
        dropped += [s for i, s in enumerate(kept) if i in out]
        kept = [s for i, s in enumerate(kept) if i not in out]
        model, report = fit(kept, prior)
    return model, report, kept, dropped


def save(result: CalibrationResult, path: str | Path, provenance: dict) -> None:
    """Write the model with what it was fitted on: `provenance` (config, replica, sweep), the date,
    the notes and the host load; every measured step goes to the samples file beside it
    (FIT.samples.jsonl, named in the model's source), the form `refit` and other tools read. A
    sweep timed inside the engine holds thousands of steps: they are kept once, there."""
    model, path = result.model, Path(path)
    steps = samples_path(path)
    model.source = {
        **model.source,
        **provenance,
        "fitted_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "wall_s": round(result.wall_s, 1),
        "host_load": result.host_load,
        "notes": result.notes,
        "samples_file": steps.name,
        "stalled_samples": len(result.stalled),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_samples(steps, result.samples, result.stalled)
    model.to_json(path)
