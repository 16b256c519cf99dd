"""The real bench's running order and its step probe, with the runs themselves replaced: which
scenario runs when, under which SLO, and how the probe's ratio prices the ITL floor."""

from __future__ import annotations

from dataclasses import replace

import pytest

import bench.scenarios as scenarios
from bench.chat_load import ChatLoadSpec
from bench.scenarios import BenchConfig, ScenarioRun, run_scenarios
from scheduler.slo import SLO
from tests.replicas import REPO

CONFIG = REPO / "engine_configs" / "cpu-small.yaml"
FIT = REPO / "engine_configs" / "fits" / "cpu-small.json"
CHAT_ALONE_ITL_MS = 5.0
"""Chat alone's ITL p99 in these runs: 3x it is under any floor, so the floor sets the SLO."""


@pytest.fixture
def ran(monkeypatch) -> list[dict]:
    """Every run `run_scenarios` starts, in order: its name, policy, budget and SLO. The step
    probe's plug-in measures steps at half the fit's prediction."""
    log: list[dict] = []

    def run(name: str, policy: str, slo: SLO | None, budget=None) -> ScenarioRun:
        log.append({"name": name, "policy": policy, "slo": slo, "budget": budget})
        return ScenarioRun(name, f"b-{name}", 0.0, 1.0, [], [])

    def with_batch(cfg, name, replicas, model, tokenizer, slo, policy, static_caps=(1, 512),
                   pipeline=None, budget=(4, 40.0)):  # fmt: skip
        return run(name, policy, slo, budget if policy == "budget" else None)

    def derive(chat_only, factor, window_s, floor_ms):
        return SLO(chat_itl_p99_ms=max(CHAT_ALONE_ITL_MS * factor, floor_ms), window_s=window_s)

    def steps(cfg, run_id):
        probe = [{"step_time_ratio": 0.5, "batch_prefill_tokens": 64}]
        return probe if run_id == "b-step-probe" else []

    monkeypatch.setattr(scenarios, "_with_batch", with_batch)
    monkeypatch.setattr(scenarios, "_chat_only", lambda *a: run("chat-only", "none", None))
    monkeypatch.setattr(scenarios, "derive_slo", derive)
    monkeypatch.setattr(scenarios, "_engine_steps", steps)
    monkeypatch.setattr(scenarios, "score", lambda run, slo: {"slo": slo})
    monkeypatch.setattr(scenarios, "score_sweeps", lambda sweeps, runs, scored, score: {})
    monkeypatch.setattr(scenarios, "summarize", lambda *a: {})

    def recorded(results, run_ids, slo: SLO) -> None:
        log.append({"recorded": list(run_ids), "slo": slo})

    monkeypatch.setattr(scenarios, "record_judging_slo", recorded)
    return log


def config(scenario_names: tuple[str, ...], **more) -> BenchConfig:
    return BenchConfig(
        engine_config=str(CONFIG), corpus="", latency_model=str(FIT), chat=ChatLoadSpec(),
        scenarios=scenario_names, static_sweep=((1, 512),), budget_sweep=((4, 0.5),), **more,
    )  # fmt: skip


def test_stock_scenarios_run_before_the_plugin_is_first_steered(ran) -> None:
    asked = ("controlled", "static-budget", "uncontrolled", "static-engine")
    run_scenarios(config(asked), [], "m", None)
    names = [r["name"].split("-4x")[0] for r in ran if "name" in r]  # static-budget-4x<target>ms
    assert names == [
        "warmup", "chat-only", "uncontrolled", "static-engine-1x512", "step-probe",
        "static-budget", "controlled",
    ]  # fmt: skip
    first_steered = next(i for i, r in enumerate(ran) if r.get("policy") in ("budget", "slo"))
    assert ran[first_steered]["name"] == "step-probe"
    assert all(r["policy"] in ("none", "static") for r in ran[:first_steered])


def test_the_probe_prices_the_floor_every_scenario_is_judged_by(ran) -> None:
    fit_floor = scenarios._itl_floor_ms(config(()))
    out = run_scenarios(config(("uncontrolled", "controlled")), [], "m", None)
    here = scenarios._itl_floor_ms(config(()), 0.5)
    assert here < fit_floor
    probe = next(r for r in ran if r.get("name") == "step-probe")
    assert probe["budget"] == (scenarios.PROBE_SEATS, fit_floor / 2)  # one full step by the fit
    assert probe["slo"].chat_itl_p99_ms == fit_floor
    controlled = next(r for r in ran if r.get("name") == "controlled")
    assert controlled["slo"].chat_itl_p99_ms == here  # the controller steers to the host's floor
    assert out["slo"]["chat_itl_p99_ms"] == here
    assert out["scenarios"]["uncontrolled"]["slo"].chat_itl_p99_ms == here  # and is judged by it
    [recorded] = [r for r in ran if "recorded" in r]
    assert set(recorded["recorded"]) == set(out["run_ids"].values()), "every scenario's run"
    assert recorded["slo"].chat_itl_p99_ms == here, "the warehouse judges as OUT.json does"
    basis = out["slo_basis"]
    assert (basis["itl_floor_ms"], basis["itl_floor_ms_fit"], basis["floor_step_ratio"]) == (
        here,
        fit_floor,
        0.5,
    )


@pytest.mark.parametrize(
    "scenario_names, more",
    [
        (("uncontrolled", "static-engine"), {}),  # nothing steered: nothing to probe for
        (("controlled",), {"slo": SLO(chat_itl_p99_ms=80.0)}),  # a given SLO has no floor
        (("controlled",), {"warmup_s": 0.0}),  # no unmeasured runs asked for
    ],
)
def test_no_probe_where_nothing_needs_it(ran, scenario_names, more) -> None:
    out = run_scenarios(config(scenario_names, **more), [], "m", None)
    assert "step-probe" not in [r.get("name") for r in ran]
    assert out["slo_basis"]["floor_step_ratio"] is None


def test_a_probe_that_priced_no_step_leaves_the_fit_floor(ran, monkeypatch) -> None:
    monkeypatch.setattr(scenarios, "_engine_steps", lambda cfg, run_id: [])
    out = run_scenarios(config(("controlled",)), [], "m", None)
    fit_floor = scenarios._itl_floor_ms(config(()))
    assert out["slo"]["chat_itl_p99_ms"] == fit_floor
    assert out["slo_basis"]["floor_step_ratio"] is None


def test_the_probe_runs_as_long_as_the_warmup(monkeypatch) -> None:
    seen: list[float] = []

    def with_batch(cfg, name, *a, **k):
        seen.append(cfg.duration_s)
        return ScenarioRun(name, "b-probe", 0.0, 1.0, [], [])

    monkeypatch.setattr(scenarios, "_with_batch", with_batch)
    monkeypatch.setattr(scenarios, "_engine_steps", lambda cfg, run_id: [])
    cfg = replace(config(("controlled",)), warmup_s=12.0, duration_s=90.0)
    assert scenarios._probe_step_ratio(cfg, [], "m", None, SLO(), 60.0) is None
    assert seen == [12.0]


def test_a_probe_that_priced_nothing_is_not_run_again(ran, monkeypatch) -> None:
    monkeypatch.setattr(scenarios, "_engine_steps", lambda cfg, run_id: [])
    run_scenarios(config(("static-budget", "controlled")), [], "m", None)
    assert [r.get("name") for r in ran].count("step-probe") == 1


def test_each_run_records_the_slo_it_was_judged_by(tmp_path) -> None:
    from warehouse.run_files import RunMeta, read_meta, run_dir, write_meta

    for run_id in ("b-uncontrolled", "b-controlled"):
        directory = run_dir(tmp_path, run_id)
        directory.mkdir(parents=True)
        write_meta(directory, RunMeta(run_id, policy="none", slo={"chat_itl_p99_ms": 94.9}))
    judged = SLO(chat_itl_p99_ms=260.4, chat_ttft_p99_ms=410.5, window_s=15.0)
    scenarios.record_judging_slo(tmp_path, ["b-uncontrolled", "b-controlled"], judged)
    meta = read_meta(run_dir(tmp_path, "b-uncontrolled"))
    assert meta.slo == judged.model_dump() and meta.policy == "none"


def test_the_jobs_sections_set_the_pipeline_every_scenario_but_static_engine_runs(tmp_path):
    from bench.real_bench import RealOptions, bench_config
    from serving.engine_config import load_engine_config

    config = load_engine_config(CONFIG)
    opts = RealOptions(engine_config=CONFIG, scenarios=("controlled",), duration=10.0,
                       results=tmp_path, section_tokens=1024)  # fmt: skip
    sections = bench_config(config, opts).pipeline
    whole = bench_config(config, replace(opts, section_tokens=None)).pipeline
    assert (sections.mode, sections.section_tokens) == ("map_reduce", 1024)
    assert whole.mode != "map_reduce"
    assert whole.model_dump() == {**sections.model_dump(), "mode": whole.mode,
                                  "section_tokens": whole.section_tokens}  # fmt: skip


def test_a_section_too_small_is_refused_by_its_option_before_any_replica_starts(tmp_path):
    from bench.real_bench import BenchInputError, RealOptions, bench_config
    from serving.engine_config import load_engine_config

    opts = RealOptions(engine_config=CONFIG, scenarios=("controlled",), duration=10.0,
                       results=tmp_path, section_tokens=10)  # fmt: skip
    with pytest.raises(BenchInputError, match="--section-tokens 10: .*16"):
        bench_config(load_engine_config(CONFIG), opts)
