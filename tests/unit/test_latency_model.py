"""Latency model: roofline prior from specs, least-squares fit, JSON, and the chunk search."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.latency_fit import StepSample, fit, nnls
from scheduler.latency_model import (
    FORMAT,
    FORMAT_V1,
    LatencyModel,
    largest_chunk_within,
    roofline_model,
)
from scheduler.step import PrefillChunk, StepBatch

REPO = Path(__file__).resolve().parents[2]

TRUE = LatencyModel(
    s_per_token=2e-5,
    s_weight_read=4e-3,
    s_per_attention_unit=3e-10,
    s_per_context_token=4e-8,
    overhead_s=3e-3,
)
SEVEN = LatencyModel(
    s_per_token=2e-5,
    s_weight_read=4e-3,
    s_per_attention_unit=3e-10,
    s_per_context_token=4e-8,
    overhead_s=1e-3,
    s_per_chunk_prefix_token=6e-7,
    s_per_decode_seq=3e-4,
)
"""Every term matters: f adds 14 ms to a chunk at 24k, g 10 ms to 32 decodes."""


def _sweep(model: LatencyModel, noise: float = 0.0, seed: int = 1) -> list[StepSample]:
    """Steps like a calibration sweep: chunk sizes × prefix positions × decode batches."""
    rng = random.Random(seed)
    samples = []
    for chunk in (0, 16, 64, 256, 1024):
        for prefix in (0, 2000, 8000, 24000):
            for seqs in (0, 1, 8, 32):
                if chunk == 0 and (seqs == 0 or prefix):
                    continue
                prefills = (PrefillChunk(chunk, prefix),) if chunk else ()
                batch = StepBatch(prefills, seqs, seqs * rng.randint(200, 3000))
                seconds = model.step_seconds(batch) * (1 + rng.gauss(0, noise))
                samples.append(StepSample(batch, seconds))
    return samples


def test_roofline_70b_fp8_on_two_h100s():
    m = roofline_model("llama-3.1-70b", "h100-sxm", gpus=2, weight_dtype="fp8", kv_dtype="fp8")
    n = 70_553_706_496
    assert m.s_per_token == pytest.approx(2 * n / (2 * 1978.9e12))
    assert m.s_weight_read == pytest.approx(n / 6.7e12)
    assert m.s_per_attention_unit == pytest.approx(4 * 80 * 64 * 128 / (2 * 989.4e12))
    assert m.s_per_context_token == pytest.approx(163_840 / 6.7e12)
    assert m.overhead_s == 0
    # a chunk re-reads its prefix's KV like a decode its context; nothing prices a sequence
    assert m.s_per_chunk_prefix_token == m.s_per_context_token
    assert m.s_per_decode_seq == 0
    assert m.source["kind"] == "roofline" and m.source["gpus"] == 2


def test_decode_step_is_weights_plus_kv_over_bandwidth():
    m = roofline_model("llama-3.1-70b", "h100-sxm", gpus=2, weight_dtype="fp8", kv_dtype="fp8")
    step = m.step_seconds(StepBatch(decode_seqs=125, decode_context_tokens=125 * 4096))
    assert step == pytest.approx((70_553_706_496 + 125 * 4096 * 163_840) / 6.7e12)


def test_efficiency_and_overhead_slow_the_prior_down():
    fast = roofline_model("llama-3.1-8b", "h100-sxm")
    slow = roofline_model("llama-3.1-8b", "h100-sxm", efficiency=0.5, overhead_s=0.001)
    batch = StepBatch((PrefillChunk(512, 1000),), 4, 4000)
    assert slow.step_seconds(batch) == pytest.approx(2 * fast.step_seconds(batch) + 0.001)
    with pytest.raises(ValueError, match="efficiencies"):
        roofline_model("llama-3.1-8b", "h100-sxm", bandwidth_efficiency=1.5)


def test_linear_part_turns_compute_bound_above_the_knee():
    m = LatencyModel(s_per_token=1e-4, s_weight_read=1e-2)
    assert m.knee_tokens == pytest.approx(100)
    assert m.step_seconds(StepBatch(decode_seqs=50)) == pytest.approx(1e-2)
    assert m.step_seconds(StepBatch(decode_seqs=400)) == pytest.approx(4e-2)
    assert m.step_seconds(StepBatch()) == 0.0


def test_chunk_prefix_and_decode_sequence_terms():
    m = LatencyModel(s_weight_read=0.01, s_per_chunk_prefix_token=1e-6, s_per_decode_seq=1e-3)
    two_chunks = StepBatch((PrefillChunk(16, 1000), PrefillChunk(512, 3000)), 4, 4000)
    # each chunk re-reads its own prefix whatever its size; each decode sequence pays g
    assert m.step_seconds(two_chunks) == pytest.approx(0.01 + 4000 * 1e-6 + 4 * 1e-3)
    assert m.step_seconds(StepBatch((PrefillChunk(64, 0),))) == pytest.approx(0.01)


def test_attention_grows_with_prefix_position():
    m = roofline_model("llama-3.1-70b", "h100-sxm", gpus=2, weight_dtype="fp8")
    early = m.step_seconds(StepBatch((PrefillChunk(512, 0),)))
    late = m.step_seconds(StepBatch((PrefillChunk(512, 78_000),)))
    assert late > 2 * early


def test_negative_coefficients_are_refused():
    with pytest.raises(ValueError, match="overhead_s"):
        LatencyModel(overhead_s=-1.0)


def test_fit_recovers_exact_coefficients():
    model, report = fit(_sweep(TRUE))
    for name, value in TRUE.coefficients().items():
        # f and g are 0 in TRUE: the fit may leave a trace of them, 1000x below SEVEN's
        near = pytest.approx(value, rel=0.05, abs=1e-3 * getattr(SEVEN, name))
        assert getattr(model, name) == near, name
    assert report.mean_abs_pct_error < 0.5
    assert report.r2 > 0.9999
    assert model.source["kind"] == "fit"


def test_fit_recovers_all_seven_coefficients_through_noise():
    """g·B shares B with a·T; chunks (tokens in T, no sequences in B) tell the two apart. The
    knee search's grid leaves the exact fit a few % off on a, b and e (a·knee and e overlap)."""
    exact, report = fit(_sweep(SEVEN))
    for name, value in SEVEN.coefficients().items():
        assert getattr(exact, name) == pytest.approx(value, rel=0.1), name
    assert report.mean_abs_pct_error < 0.5
    noisy, report = fit(_sweep(SEVEN, noise=0.02, seed=4))
    for name, value in SEVEN.coefficients().items():
        assert getattr(noisy, name) == pytest.approx(value, rel=0.15), name
    assert report.mean_abs_pct_error < 3


def test_fit_reports_noise_it_cannot_explain():
    samples = _sweep(TRUE, noise=0.05)
    model, report = fit(samples)
    assert report.samples == len(samples)
    assert 1 < report.mean_abs_pct_error < 10
    assert report.mean_abs_pct_error <= report.p90_abs_pct_error <= report.max_abs_pct_error
    assert 0.9 < report.r2 < 1.0
    assert model.s_per_attention_unit == pytest.approx(TRUE.s_per_attention_unit, rel=0.15)


def test_fit_keeps_all_coefficients_non_negative():
    # steps that get *faster* with more context would need d < 0; the fit clamps it to 0
    samples = [
        StepSample(StepBatch(decode_seqs=seqs, decode_context_tokens=ctx), 0.02 - ctx * 1e-7)
        for seqs in (4, 16)
        for ctx in range(1000, 9000, 1000)
    ]
    model, report = fit(samples)
    assert all(v >= 0 for v in model.coefficients().values())
    assert model.s_per_context_token == 0
    assert report.max_abs_pct_error > 1  # the clamped fit cannot follow the falling times


def test_terms_the_samples_never_exercise_come_from_the_prior():
    decode_only = [
        StepSample(StepBatch(decode_seqs=s, decode_context_tokens=s * 1000), 0.004 + s * 1e-4)
        for s in (1, 2, 4, 8, 16, 32)
    ]
    prior = LatencyModel(1e-5, 1e-3, 5e-10, 1e-8, 1e-3, 2e-8, 0.0, source={"kind": "roofline"})
    model, _ = fit(decode_only, prior=prior)
    assert model.s_per_attention_unit == prior.s_per_attention_unit
    assert model.s_per_chunk_prefix_token == prior.s_per_chunk_prefix_token
    assert model.source["prior"] == {"kind": "roofline"}
    without, _ = fit(decode_only)
    assert without.s_per_attention_unit == without.s_per_chunk_prefix_token == 0


def test_chunks_only_at_prefix_zero_leave_f_to_the_prior_and_decodes_fit_g():
    steps = [StepBatch((PrefillChunk(c),), b, b * 500) for c in (64, 256, 1024) for b in (0, 4)]
    steps += [StepBatch((), b, b * 2000) for b in (1, 8, 32)]
    samples = [StepSample(b, SEVEN.step_seconds(b)) for b in steps]
    model, _ = fit(samples, prior=SEVEN)
    assert model.s_per_chunk_prefix_token == SEVEN.s_per_chunk_prefix_token  # never exercised
    assert model.s_per_decode_seq == pytest.approx(SEVEN.s_per_decode_seq, rel=0.01)


def test_fit_rejects_too_few_or_untimed_samples():
    with pytest.raises(ValueError, match="at least 3"):
        fit(_sweep(TRUE)[:2])
    bad = _sweep(TRUE)
    bad[0] = StepSample(bad[0].batch, 0.0)
    with pytest.raises(ValueError, match="seconds > 0"):
        fit(bad)


def test_nnls_matches_unconstrained_solution_when_it_is_feasible():
    rng = np.random.default_rng(0)
    a = rng.random((30, 4))
    x_true = np.array([1.0, 2.0, 0.5, 3.0])
    assert np.allclose(nnls(a, a @ x_true), x_true)


def test_nnls_clamps_the_negative_direction():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    x = nnls(a, np.array([2.0, -1.0, 1.0]))
    assert x[1] == 0 and x[0] == pytest.approx(1.5)


def test_nnls_finds_the_best_feasible_active_set():
    rng = np.random.default_rng(3)
    for _ in range(40):
        m, n = int(rng.integers(5, 30)), int(rng.integers(1, 5))
        a = rng.normal(size=(m, n)) * 10.0 ** rng.integers(-6, 6, size=n)
        b = rng.normal(size=m)
        x = nnls(a, b)
        assert (x >= 0).all()
        best = np.inf
        for k in range(n + 1):
            for subset in itertools.combinations(range(n), k):
                z = np.zeros(n)
                if subset:
                    z[list(subset)] = np.linalg.lstsq(a[:, list(subset)], b, rcond=None)[0]
                if (z >= 0).all():
                    best = min(best, float(np.sum((a @ z - b) ** 2)))
        assert np.sum((a @ x - b) ** 2) <= best * (1 + 1e-9) + 1e-12


def test_json_round_trip_keeps_coefficients_and_provenance(tmp_path):
    prior = roofline_model("nightshift-small", "l40s", overhead_s=0.002)
    path = tmp_path / "fit.json"
    for model in (prior, dataclasses.replace(SEVEN, source={"kind": "fit"})):
        model.to_json(path)
        assert LatencyModel.from_json(path) == model
    doc = json.loads(path.read_text())
    assert doc["format"] == FORMAT and len(doc["coefficients"]) == 7
    prior.to_json(path)
    assert json.loads(path.read_text())["source"]["model"] == "nightshift-small"


def test_five_coefficient_files_of_format_1_still_load(tmp_path):
    real = LatencyModel.from_json(REPO / "tests" / "unit" / "data" / "cpu-small-five-term-fit.json")
    assert real.s_per_token > 0 and real.source["kind"] == "fit"
    assert real.s_per_chunk_prefix_token == real.s_per_decode_seq == 0
    five = {k: v for k, v in TRUE.coefficients().items() if k in list(TRUE.coefficients())[:5]}
    path = tmp_path / "old.json"
    for fmt in (FORMAT_V1, None):  # a hand-written file may leave the format out
        path.write_text(json.dumps({"format": fmt, "coefficients": five, "source": {}}))
        old = LatencyModel.from_json(path)
        assert old == TRUE
        batch = StepBatch((PrefillChunk(256, 8000),), 8, 8000)
        assert old.step_seconds(batch) == TRUE.step_seconds(batch)


def test_from_json_names_the_problem(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"coefficients": {"s_per_token": 1.0}}))
    with pytest.raises(ValueError, match="coefficients must be exactly"):
        LatencyModel.from_json(path)
    path.write_text("not json")
    with pytest.raises(ValueError, match="not a latency model file"):
        LatencyModel.from_json(path)
    seven = SEVEN.coefficients()
    unknown = {**seven, "s_per_lora": 1e-3}
    path.write_text(json.dumps({"format": FORMAT, "coefficients": unknown}))
    with pytest.raises(ValueError, match="coefficients must be exactly.*s_per_lora"):
        LatencyModel.from_json(path)
    # format 2 promises all seven: a missing one is a damaged file, not a zero
    partial = {k: v for k, v in seven.items() if k != "s_per_decode_seq"}
    path.write_text(json.dumps({"format": FORMAT, "coefficients": partial}))
    with pytest.raises(ValueError, match="coefficients must be exactly"):
        LatencyModel.from_json(path)
    # format 1 never had f and g
    path.write_text(json.dumps({"format": FORMAT_V1, "coefficients": seven}))
    with pytest.raises(ValueError, match=f"format {FORMAT_V1}"):
        LatencyModel.from_json(path)
    path.write_text(json.dumps({"format": "nightshift.latency_model/9", "coefficients": seven}))
    with pytest.raises(ValueError, match="unknown latency model format.*latency_model/2"):
        LatencyModel.from_json(path)


def test_predict_ms():
    batch = StepBatch((PrefillChunk(100, 0),), 2, 200)
    assert TRUE.predict_ms(batch) == pytest.approx(1000 * TRUE.step_seconds(batch))


def _brute_force(model, budget, prefix, seqs, ctx, max_chunk, g):
    best = 0
    for chunk in range(g, max_chunk + 1, g):
        if model.step_seconds(StepBatch((PrefillChunk(chunk, prefix),), seqs, ctx)) <= budget:
            best = chunk
    return best


@settings(max_examples=60, deadline=None)
@given(
    budget_ms=st.floats(1, 200),
    prefix=st.integers(0, 80_000),
    seqs=st.integers(0, 200),
    ctx_per_seq=st.integers(0, 8000),
    max_chunk=st.integers(0, 3000),
    granularity=st.sampled_from([1, 16, 64]),
)
def test_chunk_search_agrees_with_brute_force(
    budget_ms, prefix, seqs, ctx_per_seq, max_chunk, granularity
):
    model = dataclasses.replace(
        roofline_model("llama-3.1-8b", "a100-80gb", efficiency=0.6, overhead_s=0.002),
        s_per_decode_seq=5e-5,
    )
    args = (model, budget_ms / 1000, prefix, seqs, seqs * ctx_per_seq, max_chunk, granularity)
    assert largest_chunk_within(*args) == _brute_force(*args)


@settings(max_examples=60, deadline=None)
@given(
    coefficients=st.lists(st.floats(0, 1), min_size=7, max_size=7),
    budget_ms=st.floats(1, 200),
    prefix=st.integers(0, 80_000),
    seqs=st.integers(0, 64),
)
def test_chunk_search_stays_monotone_with_all_seven_terms(coefficients, budget_ms, prefix, seqs):
    """A deeper prefix, more decodes or a tighter budget never allow a larger chunk."""
    scale = (2e-5, 4e-3, 3e-10, 4e-8, 3e-3, 1e-6, 5e-4)  # SEVEN's magnitudes, each 0-1x
    model = LatencyModel(*(w * x for w, x in zip(scale, coefficients, strict=True)))
    chunk = largest_chunk_within(model, budget_ms / 1000, prefix, seqs, seqs * 1000, 4096)
    assert (
        largest_chunk_within(model, budget_ms / 1000, prefix + 4096, seqs, seqs * 1000, 4096)
        <= chunk
    )
    assert (
        largest_chunk_within(model, budget_ms / 1000, prefix, seqs + 8, (seqs + 8) * 1000, 4096)
        <= chunk
    )
    assert largest_chunk_within(model, budget_ms / 2000, prefix, seqs, seqs * 1000, 4096) <= chunk


def test_chunk_shrinks_deep_into_a_long_prompt():
    model = roofline_model("llama-3.1-70b", "h100-sxm", 2, "fp8", "fp8", efficiency=0.6)
    early = largest_chunk_within(model, 0.05, 0, 100, 100 * 4096, 131072)
    late = largest_chunk_within(model, 0.05, 78_000, 100, 100 * 4096, 131072)
    assert early % 16 == 0 and late % 16 == 0
    assert early >= 3 * late > 0


def test_chunk_search_returns_zero_when_decode_alone_breaks_the_budget():
    model = LatencyModel(s_weight_read=0.03, s_per_token=1e-6)
    assert largest_chunk_within(model, 0.02, 0, 10, 0, 4096) == 0
    assert largest_chunk_within(model, 0.05, 0, 10, 0, 8) == 0  # below one granule
    with pytest.raises(ValueError, match="granularity"):
        largest_chunk_within(model, 0.05, 0, 10, 0, 4096, granularity=0)
