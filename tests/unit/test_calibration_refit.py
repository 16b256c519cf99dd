"""Refitting saved calibration steps without a replica: the samples file beside FIT.json, reading it
back (and the steps older fit files carry inline), `refit`, and `nightshift calibrate --refit`."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from scheduler.latency_fit import StepSample
from scheduler.latency_model import LatencyModel
from scheduler.step import PrefillChunk, StepBatch
from serving.calibration import CalibrationResult, fit_steps, refit, save
from serving.calibration_plan import CalibrationError
from serving.step_samples import read_samples, samples_path

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "tests" / "unit" / "data" / "cpu-small-five-term-fit.json"
"""The five-term fit of a real cpu-small calibration sweep, kept with its steps."""
"""A format-1 fit of a real cpu-small sweep, its steps inline (saved before samples files)."""
TRUE = LatencyModel(
    s_per_token=4e-5,
    s_weight_read=1.5e-3,
    s_per_attention_unit=2e-9,
    s_per_context_token=3e-7,
    overhead_s=5e-4,
    s_per_chunk_prefix_token=1.4e-6,
    s_per_decode_seq=3.5e-4,
)
STALLED = (3, 17, 33)


def _measured(seed: int = 2) -> list[StepSample]:
    """The full sweep's shapes timed on TRUE with contention that only adds time, three of them
    stalled six times over."""
    rng = random.Random(seed)
    batches = [StepBatch((), b, b * c) for b in (1, 2, 4, 8, 16) for c in (128, 2048, 8192)]
    batches += [StepBatch((PrefillChunk(c, p),), b, b * 300) for b in (0, 4)
                for c in (64, 256, 508) for p in (0, 2048, 8192, 16384, 24576)]  # fmt: skip
    samples = [StepSample(b, TRUE.step_seconds(b) * (1 + rng.uniform(0, 0.05))) for b in batches]
    for i in STALLED:
        samples[i] = StepSample(samples[i].batch, samples[i].seconds * 6)
    return samples


def _calibrated(tmp_path: Path) -> tuple[CalibrationResult, Path]:
    """What `calibrate` does once the steps are measured: fit in memory, then save."""
    result = fit_steps(_measured(), None, [])
    path = tmp_path / "fit.json"
    save(result, path, {"engine_config": "cpu-test"})
    return result, path


def test_refit_from_the_samples_file_gives_the_model_fitted_in_memory(tmp_path: Path) -> None:
    result, path = _calibrated(tmp_path)
    assert {s.batch for s in result.stalled} == {_measured()[i].batch for i in STALLED}
    for source in (samples_path(path), path):
        again = refit(source)
        assert again.model.coefficients() == pytest.approx(result.model.coefficients(), rel=1e-9)
        assert again.report.mean_abs_pct_error == pytest.approx(result.report.mean_abs_pct_error)
        assert again.samples == result.samples and again.stalled == result.stalled
        assert again.notes == result.notes
    assert result.model.s_per_decode_seq == pytest.approx(TRUE.s_per_decode_seq, rel=0.15)
    assert result.model.s_per_chunk_prefix_token == pytest.approx(
        TRUE.s_per_chunk_prefix_token, rel=0.15
    )


def test_samples_file_holds_one_step_per_line(tmp_path: Path) -> None:
    result, path = _calibrated(tmp_path)
    lines = samples_path(path).read_text().splitlines()
    assert samples_path(path).name == "fit.samples.jsonl"
    assert len(lines) == len(result.samples) + len(result.stalled)
    rows = [json.loads(line) for line in lines]
    assert set(rows[-1]) == {
        "prefills", "decode_seqs", "decode_context_tokens", "seconds", "stalled"
    }  # fmt: skip
    assert [r["stalled"] for r in rows].count(True) == len(STALLED)
    chunk = next(r for r in rows if r["prefills"])
    assert chunk["prefills"] == [[64, 0]]
    assert json.loads(path.read_text())["source"]["samples_file"] == "fit.samples.jsonl"


def test_a_saved_refit_can_be_refitted_again(tmp_path: Path) -> None:
    _, path = _calibrated(tmp_path)
    first = refit(path)
    save(first, tmp_path / "again.json", {"refit_from": str(path)})
    second = refit(tmp_path / "again.samples.jsonl")
    assert second.model.coefficients() == pytest.approx(first.model.coefficients(), rel=1e-9)


def test_committed_five_term_calibration_refits_better_with_seven_terms() -> None:
    """The real cpu-small sweep: f and g come out positive and of the size the calibration found,
    and the refitted model predicts the steps the old fit kept better than the old fit does."""
    old = LatencyModel.from_json(COMMITTED)
    kept = read_samples(COMMITTED)[: old.source["samples"]]  # the stalled step comes last
    new = refit(COMMITTED).model
    assert all(v >= 0 for v in new.coefficients().values())
    assert 0.5e-6 < new.s_per_chunk_prefix_token < 5e-6
    assert 0.1e-3 < new.s_per_decode_seq < 1e-3

    def mean_error(model: LatencyModel) -> float:
        errors = [abs(model.step_seconds(s.batch) / s.seconds - 1) for s in kept]
        return 100 * sum(errors) / len(errors)

    assert mean_error(old) == pytest.approx(old.source["report"]["mean_abs_pct_error"])
    assert mean_error(new) < 0.7 * mean_error(old)


def test_bad_samples_files_name_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.samples.jsonl"
    good = '{"prefills": [[64, 0]], "decode_seqs": 0, "decode_context_tokens": 0, "seconds": 0.01}'
    path.write_text(good + "\n{not json\n")
    with pytest.raises(ValueError, match="line 2: not JSON"):
        read_samples(path)
    path.write_text(good + "\n\n" + good.replace('"seconds": 0.01', '"secs": 0.01') + "\n")
    with pytest.raises(ValueError, match="line 3: not a step sample.*seconds"):
        read_samples(path)
    path.write_text(good + "\n")
    with pytest.raises(CalibrationError, match="holds 1 engine steps"):
        refit(path)
    with pytest.raises(ValueError, match="cannot read step samples"):
        read_samples(tmp_path / "missing.samples.jsonl")
    prior = tmp_path / "prior.json"
    LatencyModel(s_per_token=1e-5, source={"kind": "roofline"}).to_json(prior)
    with pytest.raises(ValueError, match="carries no measured steps"):
        read_samples(prior)


def _cli(*args: str):
    return CliRunner().invoke(app, ["calibrate", *args])


def test_cli_refit_writes_the_model_and_its_samples(tmp_path: Path) -> None:
    _, path = _calibrated(tmp_path)
    out = tmp_path / "refit" / "cpu.json"
    result = _cli("--refit", str(samples_path(path)), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "saved engine steps" in result.output and "s_per_decode_seq" in result.output
    assert (tmp_path / "refit" / "cpu.samples.jsonl").exists()
    model = LatencyModel.from_json(out)
    assert model.coefficients() == pytest.approx(refit(path).model.coefficients(), rel=1e-9)
    assert model.source["refit_from"] == str(samples_path(path))
    gpu = REPO / "engine_configs" / "h100x2-llama-3.1-70b-fp8.yaml"
    with_prior = _cli("--refit", str(path), "--out", str(out), "--engine-config", str(gpu))
    assert with_prior.exit_code == 0, with_prior.output
    source = LatencyModel.from_json(out).source
    assert source["prior"]["kind"] == "roofline" and source["engine_config_path"] == str(gpu)


def test_cli_refit_bad_input_exits_2(tmp_path: Path) -> None:
    out = str(tmp_path / "x.json")
    neither = _cli("--out", out)
    assert neither.exit_code == 2 and "--engine-config CONFIG" in neither.output
    _, path = _calibrated(tmp_path)
    both = _cli("--refit", str(path), "--out", out, "--replica-url", "http://127.0.0.1:9")
    assert both.exit_code == 2 and "drop --replica-url" in both.output
    bad = tmp_path / "bad.samples.jsonl"
    bad.write_text("{}\n")
    broken = _cli("--refit", str(bad), "--out", out)
    assert broken.exit_code == 2 and "line 1: not a step sample" in broken.output
    assert not Path(out).exists()
    steps = samples_path(path)
    over = _cli("--refit", str(steps), "--out", str(steps))  # would overwrite its own input
    assert over.exit_code == 2 and "name the model's JSON file" in over.output
    assert read_samples(steps)
