"""Calibration without an engine: the sweep plan, request timings turned into step samples (from a
known latency model plus contention noise), saving, and the measurement loop against a fake replica."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from pathlib import Path

import httpx
import pytest

from flows.cli import app
from scheduler.latency_fit import StepSample, fit
from scheduler.latency_model import LatencyModel
from scheduler.step import PrefillChunk, StepBatch
from serving.calibration import (
    CalibrationResult,
    Calibrator,
    calibrate,
    fit_without_stalls,
    save,
)
from serving.calibration_plan import (
    QUICK,
    CalibrationError,
    EngineLimits,
    SweepConfig,
    engine_limits,
    plan_sweep,
)
from serving.client import StreamingClient
from serving.engine_config import load_engine_config
from serving.step_samples import read_samples, samples_path
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

REPO = Path(__file__).resolve().parents[2]
SMALL = EngineLimits(
    step_tokens=512, long_prefill_threshold=512, max_model_len=32768, max_num_seqs=32
)
TINY = EngineLimits(step_tokens=512, max_model_len=4096, max_num_seqs=16)
TRUE = LatencyModel(
    s_per_token=4e-5,
    s_weight_read=1.5e-3,
    s_per_attention_unit=2e-9,
    s_per_context_token=3e-7,
    overhead_s=1e-3,
)


# --- the sweep plan ---------------------------------------------------------------------------


def test_full_sweep_on_cpu_small_covers_batches_contexts_prefixes_and_chunks() -> None:
    plan = plan_sweep(SMALL, SweepConfig())
    assert len(plan.decode) == 15 and not plan.skipped
    assert {(s.seqs, s.context) for s in plan.decode} >= {(1, 128), (16, 8192)}
    # 49k and 80k meet at the deepest prefix cpu-small's 32k context leaves for the largest chunk
    deepest = {0: 32768 - 512 - 1, 4: 32768 - 508 - 1}
    assert [(g.decode_seqs, g.prefix) for g in plan.chunks] == [
        (b, p) for b in (0, 4) for p in (0, 2048, 8192, 16384, 24576, deepest[b])
    ]
    # beside 4 decodes one step has 508 tokens left for the chunk
    assert {g.decode_seqs: g.sizes for g in plan.chunks} == {0: (64, 256, 512), 4: (64, 256, 508)}


def test_limits_shrink_shapes_and_drop_duplicates() -> None:
    plan = plan_sweep(TINY, SweepConfig())
    assert max(s.context for s in plan.decode) == 4096 - SweepConfig().decode_steps - 2
    assert len({(s.seqs, s.context) for s in plan.decode}) == len(plan.decode)
    prefixes = [g.prefix for g in plan.chunks if g.decode_seqs == 0]
    assert prefixes == [0, 2048, 4096 - 512 - 1]  # 8k, 16k and 24k all become the deepest that fits
    for g in plan.chunks:
        assert g.prefix + max(g.sizes) < TINY.max_model_len


def test_shapes_beyond_max_num_seqs_or_kv_are_skipped_with_a_reason() -> None:
    limits = dataclasses.replace(TINY, max_num_seqs=4, kv_capacity_tokens=20_000)
    plan = plan_sweep(limits, SweepConfig())
    assert all(s.seqs <= 4 for s in plan.decode)
    assert any("max-num-seqs" in note for note in plan.skipped)
    assert any("KV" in note for note in plan.skipped)
    need = [s.seqs * (s.context + SweepConfig().decode_steps + 1) for s in plan.decode]
    assert max(need) <= 20_000 * 0.8


def test_chunk_budget_is_step_budget_less_decodes_capped_by_threshold() -> None:
    limits = EngineLimits(step_tokens=2048, long_prefill_threshold=1024)
    assert limits.max_chunk(0) == 1024 and limits.max_chunk(1500) == 548


def test_engine_limits_from_the_repository_configs() -> None:
    small = engine_limits(load_engine_config(REPO / "engine_configs" / "cpu-small.yaml"), None)
    assert (small.step_tokens, small.long_prefill_threshold) == (512, 512)
    assert (small.max_model_len, small.max_num_seqs) == (32768, 32)
    tiny = engine_limits(load_engine_config(REPO / "engine_configs" / "cpu-tiny.yaml"), 10**6)
    plan = plan_sweep(tiny, QUICK)
    assert len(plan.decode) == 6 and sum(len(g.sizes) for g in plan.chunks) == 12


def test_engine_limits_name_what_to_set(tmp_path: Path) -> None:
    config = load_engine_config(REPO / "engine_configs" / "cpu-tiny.yaml")
    flags = {k: v for k, v in config.vllm.items() if k != "max-num-batched-tokens"}
    with pytest.raises(CalibrationError, match="max-num-batched-tokens"):
        engine_limits(config.model_copy(update={"vllm": flags}), None)
    no_cache = {**config.vllm, "enable-prefix-caching": False}
    with pytest.raises(CalibrationError, match="enable-prefix-caching: true"):
        engine_limits(config.model_copy(update={"vllm": no_cache}), None)


# --- timings into samples ---------------------------------------------------------------------


def _decode_runs(seqs: int, context: int, step: float, rng: random.Random, stall: float = 0.0):
    """Request timings of a decode shape on an engine stepping at `step`: overhead plus the steps,
    plus contention that only ever adds time."""

    def ends(tokens: int) -> tuple[float, ...]:
        return tuple(0.012 + tokens * step + rng.uniform(0, 0.002) for _ in range(seqs))

    runs = [DecodeRun(context, 1, 65, ends(1), ends(65)) for _ in range(3)]
    runs[1] = dataclasses.replace(runs[1], long_s=tuple(t + stall for t in runs[1].long_s))
    return runs


def test_decode_step_is_the_difference_of_the_fastest_runs() -> None:
    rng = random.Random(3)
    sample = decode_sample(_decode_runs(4, 1000, 0.004, rng, stall=0.5))
    assert sample.seconds == pytest.approx(0.004, rel=0.01)
    assert sample.batch == StepBatch((), 4, 4 * 1000 + 4 * 32.5)  # timed tokens 1..64


def test_decode_sample_gives_up_when_noise_leaves_no_time() -> None:
    run = DecodeRun(64, 1, 65, (0.5, 0.5), (0.4, 0.4))
    assert decode_sample([run]) is None


def test_overhead_is_the_median_of_each_groups_fastest_null_less_its_step() -> None:
    groups = [[0.030, 0.012, 0.2], [0.014, 0.5, 0.02], [0.009, 0.011, 0.3]]
    # fastest per group 12, 14 and 9 ms: the median (12) is what a chunk's fastest of 3 compares to
    assert request_overhead(groups, 0.002) == pytest.approx(0.010)
    assert request_overhead([[0.001]], 0.002) == 0.0


def test_chunk_samples_subtract_overhead_per_decode_batch_and_take_the_fastest() -> None:
    chunk = PrefillChunk(256, 2048)
    runs = [
        ChunkRun(0, 0, chunk, 0.050),
        ChunkRun(0, 0, chunk, 0.041),
        ChunkRun(4, 300, chunk, 0.060),
        ChunkRun(4, 340, chunk, 0.090),
        ChunkRun(4, 300, PrefillChunk(64, 0), 0.019),
    ]
    samples, dropped = chunk_samples(runs, {0: 0.010, 4: 0.020})
    by_batch = {s.batch: s.seconds for s in samples}
    assert by_batch[StepBatch((chunk,), 0, 0)] == pytest.approx(0.031)
    assert by_batch[StepBatch((chunk,), 4, 320)] == pytest.approx(0.040)
    assert dropped == [(4, PrefillChunk(64, 0))]


def test_decoder_context_grows_with_time_up_to_the_output_limit() -> None:
    assert decoder_context(4, 64, 0.5, 0.005, 4096) == 4 * (64 + 100)
    assert decoder_context(4, 64, 100.0, 0.005, 4096) == 4 * (64 + 4096)
    assert decoder_context(0, 64, 1.0, 0.005, 4096) == 0


def test_nearest_decode_step_prefers_batch_size_then_short_context() -> None:
    samples = [
        StepSample(StepBatch((), 1, 5000), 0.009),
        StepSample(StepBatch((), 1, 100), 0.002),
        StepSample(StepBatch((), 8, 800), 0.006),
        StepSample(StepBatch((PrefillChunk(64),), 1, 10), 0.5),
    ]
    assert nearest_decode_step(samples, 1) == 0.002
    assert nearest_decode_step(samples, 5) == 0.006
    assert nearest_decode_step(samples[3:], 1) is None


def _timed_decode(shape, rng: random.Random) -> list[DecodeRun]:
    """Three repeats of a decode shape on an engine that runs TRUE's steps, seen through 15 ms of
    request overhead and contention that only ever adds time (exponential, mean 1 ms)."""

    def ends(tokens: int) -> tuple[float, ...]:
        steps = sum(
            TRUE.step_seconds(StepBatch((), shape.seqs, shape.seqs * (shape.context + j)))
            for j in range(tokens)
        )
        return tuple(0.015 + steps + rng.expovariate(1000) for _ in range(shape.seqs))

    return [DecodeRun(shape.context, 1, 129, ends(1), ends(129)) for _ in range(3)]


def _ttft(batch: StepBatch, rng: random.Random) -> float:
    """Time to first token of a request prefilled in `batch`: overhead, half a decode step of
    waiting when others decode, the step, contention."""
    waiting = 0.001 if batch.decode_seqs else 0.0
    return 0.015 + waiting + TRUE.step_seconds(batch) + rng.expovariate(1000)


def test_synthetic_sweep_recovers_the_model_it_was_timed_on() -> None:
    """Every planned shape timed as TRUE would run it: the fit of the resulting samples predicts
    TRUE's steps within 10%, though every timing carried overhead and contention."""
    rng = random.Random(7)
    plan = plan_sweep(SMALL, SweepConfig())
    decode = [decode_sample(_timed_decode(shape, rng)) for shape in plan.decode]
    runs, nulls = [], {0: [], 4: []}
    for group in plan.chunks:
        seqs, context = group.decode_seqs, group.decode_seqs * 500
        null = StepBatch((PrefillChunk(1),), seqs, context)
        nulls[seqs].append([_ttft(null, rng) for _ in range(3)])
        for size in group.sizes:
            batch = StepBatch((PrefillChunk(size, group.prefix),), seqs, context)
            runs += [
                ChunkRun(seqs, context, batch.prefills[0], _ttft(batch, rng)) for _ in range(3)
            ]
    overhead = {
        b: request_overhead(t, nearest_decode_step(decode, b + 1)) for b, t in nulls.items()
    }
    chunks, dropped = chunk_samples(runs, overhead)
    assert not dropped and len(decode) == 15 and len(chunks) == 36
    model, report = fit(decode + chunks)
    assert report.mean_abs_pct_error < 5
    for s in decode + chunks:
        assert model.step_seconds(s.batch) == pytest.approx(TRUE.step_seconds(s.batch), rel=0.10)


def _true_steps(noise: float, seed: int = 5) -> list[StepSample]:
    rng = random.Random(seed)
    batches = [StepBatch((), b, b * c) for b in (1, 2, 4, 8, 16) for c in (128, 2048, 8192)]
    batches += [StepBatch((PrefillChunk(c, p),), b, b * 300) for b in (0, 4)
                for c in (64, 256, 508) for p in (0, 2048, 8192, 16384, 24576)]  # fmt: skip
    return [StepSample(b, TRUE.step_seconds(b) * (1 + rng.uniform(0, noise))) for b in batches]


def test_only_steps_far_slower_than_the_model_count_as_stalled() -> None:
    samples = _true_steps(0.1)
    samples[3] = StepSample(samples[3].batch, samples[3].seconds * 5)
    samples[20] = StepSample(samples[20].batch, samples[20].seconds * 3)
    samples[7] = StepSample(samples[7].batch, samples[7].seconds / 5)  # fast: the model's problem
    assert stalled(samples, TRUE) == [3, 20]


def test_fit_leaves_stalled_steps_out_and_recovers_the_model() -> None:
    samples = _true_steps(0.05)
    for i in (2, 17, 30, 41):
        samples[i] = StepSample(samples[i].batch, samples[i].seconds * 6)
    model, report, kept, dropped = fit_without_stalls(samples, None)
    assert {s.batch for s in dropped} == {samples[i].batch for i in (2, 17, 30, 41)}
    assert len(kept) == len(samples) - 4 and report.samples == len(kept)
    assert report.mean_abs_pct_error < 5
    assert fit(samples)[1].mean_abs_pct_error > 3 * report.mean_abs_pct_error


def test_fit_never_leaves_out_more_than_a_quarter() -> None:
    samples = _true_steps(0.05)
    slow = set(range(0, len(samples), 2))  # half the steps 6x slower: a model problem, not stalls
    samples = [
        StepSample(s.batch, s.seconds * (6 if i in slow else 1)) for i, s in enumerate(samples)
    ]
    _, report, kept, dropped = fit_without_stalls(samples, None)
    assert len(dropped) <= len(samples) // 4 and report.samples == len(kept)


# --- saving -----------------------------------------------------------------------------------


def test_save_keeps_provenance_and_every_step(tmp_path: Path) -> None:
    samples = [
        StepSample(StepBatch((), b, b * 100), TRUE.step_seconds(StepBatch((), b, b * 100)))
        for b in (1, 2, 4, 8)
    ]
    samples += [
        StepSample(
            StepBatch((PrefillChunk(c, p),), 0, 0),
            TRUE.step_seconds(StepBatch((PrefillChunk(c, p),), 0, 0)),
        )
        for c in (64, 512)
        for p in (0, 4096, 16384)
    ]
    model, report = fit(samples)
    result = CalibrationResult(
        model, report, samples, stalled=samples[:1], notes=["a note"], wall_s=12.3,
        host_load={"before": 0.5},
    )  # fmt: skip
    path = tmp_path / "fits" / "x.json"
    save(result, path, {"engine_config": "cpu-test"})
    loaded = LatencyModel.from_json(path)
    assert loaded.coefficients() == pytest.approx(model.coefficients())
    src = loaded.source
    assert src["kind"] == "fit" and src["engine_config"] == "cpu-test"
    assert src["report"]["samples"] == len(samples) and src["notes"] == ["a note"]
    assert src["fitted_at"] and src["host_load"] == {"before": 0.5}
    assert "steps" not in src and src["stalled_samples"] == 1
    assert src["samples_file"] == "x.samples.jsonl"
    # kept then stalled, from the fit file and from the samples file beside it
    assert read_samples(path) == read_samples(samples_path(path)) == samples + samples[:1]
    json.loads(path.read_text())  # plain JSON, readable by anything


# --- the measurement loop against a fake replica -----------------------------------------------


class FakeReplica:
    """A stand-in for vLLM's completions stream: prefix cache by 16-token blocks, a decode step of
    `step_s`, prefill time proportional to the uncached tokens, usage with cached tokens."""

    def __init__(self, step_s: float = 0.0005, max_stream_tokens: int = 10**6) -> None:
        self.step_s = step_s
        self.max_stream_tokens = max_stream_tokens
        """Streams end after this many tokens, whatever they asked for (a replica that stops)."""
        self.blocks: set[tuple[int, ...]] = set()
        self.live = 0
        """Streams still generating: neither finished nor abandoned by the client."""
        self.requests: list[dict] = []

    def cached(self, prompt: list[int]) -> int:
        hit = 0
        for end in range(16, len(prompt), 16):
            if tuple(prompt[:end]) not in self.blocks:
                break
            hit = end
        self.blocks.update(tuple(prompt[:end]) for end in range(16, len(prompt) + 1, 16))
        return hit

    async def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        prompt, tokens = body["prompt"], min(body["max_tokens"], self.max_stream_tokens)
        cached = self.cached(prompt)
        return httpx.Response(200, content=self.stream(len(prompt), cached, tokens))

    async def stream(self, prompt: int, cached: int, tokens: int):
        self.live += 1
        try:
            await asyncio.sleep(self.step_s + (prompt - cached) * 2e-6)
            for i in range(tokens):
                if i:
                    await asyncio.sleep(self.step_s)
                chunk = {"choices": [{"index": 0, "text": "x", "token_ids": [i]}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": tokens,
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
        except BaseException:  # the client went away: the engine aborts the request
            self.live -= 1
            raise
        self.live -= 1
        yield b"data: [DONE]\n\n"


SMALL_SWEEP = SweepConfig(
    decode_seqs=(1, 2),
    decode_contexts=(32, 300),
    decode_steps=8,
    chunk_decode_seqs=(0, 1),
    chunk_prefixes=(0, 640),
    chunk_sizes=(64, 511),
    repeats=2,
)


async def test_calibrator_sends_cached_prefixes_and_cancels_its_decoders() -> None:
    # 2 ms steps: a 64-token chunk's time stays well above the event loop's jitter on a busy host,
    # which at 0.5 ms once left it no time after the measured request overhead.
    fake = FakeReplica(step_s=0.002)
    http = httpx.AsyncClient(transport=httpx.MockTransport(fake.handler))
    plan = plan_sweep(TINY, SMALL_SWEEP)
    async with StreamingClient("http://fake", "m", http=http) as client:
        calibrator = Calibrator(client, plan, vocab=1000, seed=1)
        samples = await calibrator.measure()
    await http.aclose()
    assert calibrator.notes == [] and fake.live == 0
    decode = [s.batch for s in samples if not s.batch.prefills]
    # 8 timed steps produce output tokens 1..8, at context L + 4.5 on average
    assert sorted((b.decode_seqs, b.decode_context_tokens) for b in decode) == sorted(
        (seqs, round(seqs * (context + 4.5))) for seqs in (1, 2) for context in (32, 300)
    )
    chunks = {(s.batch.decode_seqs, s.batch.prefills[0]) for s in samples if s.batch.prefills}
    assert chunks == {(b, PrefillChunk(c, p)) for b in (0, 1) for p in (0, 640) for c in (64, 511)}
    assert all(s.seconds > 0 for s in samples)
    assert all(r["ignore_eos"] for r in fake.requests)


async def test_calibrate_fits_and_reports_too_few_samples() -> None:
    fake = FakeReplica()
    sweep = dataclasses.replace(
        SMALL_SWEEP,
        decode_seqs=(1,),
        decode_contexts=(32,),
        chunk_prefixes=(0,),
        chunk_sizes=(64,),
        chunk_decode_seqs=(0,),
    )
    plan = plan_sweep(TINY, sweep)
    transport = httpx.MockTransport(fake.handler)
    original = httpx.AsyncClient.__init__

    def with_fake(self, *args, **kwargs):
        kwargs["transport"] = transport
        original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(httpx.AsyncClient, "__init__", with_fake)
        # 2 steps on a quiet host; a loaded one can spoil a timing difference, leaving fewer
        with pytest.raises(CalibrationError, match=r"only [0-2] engine steps could be timed"):
            await calibrate("http://fake", "m", plan, vocab=1000)


# --- the command's bad input ------------------------------------------------------------------


def _calibrate_cli(*args: str):
    from typer.testing import CliRunner

    return CliRunner().invoke(app, ["calibrate", *args])


def test_unreachable_replica_is_a_clear_error(tmp_path: Path) -> None:
    tiny = str(REPO / "engine_configs" / "cpu-tiny.yaml")
    result = _calibrate_cli(
        "--engine-config",
        tiny,
        "--out",
        str(tmp_path / "x.json"),
        "--replica-url",
        "http://127.0.0.1:9",
    )
    assert result.exit_code == 2
    assert "not reachable" in result.output and "nightshift engine up" in result.output
    assert not (tmp_path / "x.json").exists()


def test_config_without_step_budget_is_a_clear_error(tmp_path: Path) -> None:
    text = (REPO / "engine_configs" / "cpu-tiny.yaml").read_text()
    config = tmp_path / "no-budget.yaml"
    config.write_text(text.replace("  max-num-batched-tokens: 512\n", ""))
    result = _calibrate_cli("--engine-config", str(config), "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 2 and "set vllm: max-num-batched-tokens" in result.output
    missing = _calibrate_cli("--engine-config", str(tmp_path / "nope.yaml"), "--out", "x.json")
    assert missing.exit_code == 2 and "no such engine config" in missing.output


async def test_runs_whose_decoders_ended_early_are_dropped_with_a_note() -> None:
    fake = FakeReplica(max_stream_tokens=3)
    http = httpx.AsyncClient(transport=httpx.MockTransport(fake.handler))
    sweep = dataclasses.replace(SMALL_SWEEP, decode_seqs=(1,), decode_contexts=(32,))
    async with StreamingClient("http://fake", "m", http=http) as client:
        calibrator = Calibrator(client, plan_sweep(TINY, sweep), vocab=1000, seed=1)
        samples = await calibrator.measure()
    await http.aclose()
    assert {s.batch.decode_seqs for s in samples if s.batch.prefills} == {0}
    # Only the dropped runs are this test's concern: on a loaded host the fake's 64-token chunk
    # can vanish into timing noise and earn a note of its own, which is right but beside the point.
    dropped = [note for note in calibrator.notes if "run dropped" in note]
    assert dropped == [
        f"chunks at p={p} beside B=1: run dropped, a decoding stream ended early (x2)"
        for p in (0, 640)
    ]


def test_gpu_configs_get_the_roofline_prior_and_cpu_configs_none() -> None:
    from serving.calibration_run import prior as _prior
    from serving.calibration_run import sweep_plan as _plan

    gpu = load_engine_config(REPO / "engine_configs" / "h100x2-llama-3.1-70b-fp8.yaml")
    prior = _prior(gpu)
    assert prior is not None and prior.source["kind"] == "roofline" and prior.source["gpus"] == 2
    assert _prior(load_engine_config(REPO / "engine_configs" / "cpu-small.yaml")) is None
    plan = _plan(gpu, quick=False, repeats=5)
    assert plan.sweep.repeats == 5
    assert plan.limits.step_tokens == int(gpu.flag("max-num-batched-tokens"))
    assert plan.limits.kv_capacity_tokens and plan.limits.kv_capacity_tokens > 100_000
