"""bench/controller_targets.py: which static caps the controller is judged against, and the list of
its missed windows with what to look at first."""

from __future__ import annotations

from bench.controller_targets import PROFILE, closest_static, missed_windows, targets
from flows.cli_simulate import engine_params, load_profile, sim_config, step_model
from scheduler.admission import NoAdmissionControl
from simulator.run import simulate


def pooled(**figures: tuple[float, float]) -> dict:
    """(scenario, policy) → figures, from policy=(windows met, tokens/s) for both scenarios."""
    out = {}
    for name, (met, tps) in figures.items():
        policy = name.replace("_", " ")
        for scenario, scale in (("steady", 1.0), ("varying", 2.0)):
            out[(scenario, policy)] = {"scenario": scenario, "policy": policy,
                                       "slo_windows_met": met, "batch_tokens_per_s": tps * scale}  # fmt: skip
    return out


def test_the_best_static_that_holds_is_the_reference():
    p = pooled(slo=(1.0, 900.0), static_1x2048=(1.0, 600.0), static_2x2048=(0.995, 1000.0),
               static_4x4096=(0.9, 3000.0))  # fmt: skip
    r = targets(p)
    assert r["static_holds"] and r["static_chosen"] == "static 2x2048"
    assert r["steady_ratio"] == 0.9 and r["steady_ok"]


def test_without_a_holding_static_the_closest_one_is_the_reference():
    p = pooled(slo=(0.995, 700.0), static_1x2048=(0.983, 680.0), static_1x4096=(0.942, 1090.0))
    assert closest_static(p, "steady")["policy"] == "static 1x2048"
    r = targets(p)
    assert not r["static_holds"] and r["static_chosen"] == "static 1x2048"
    assert r["static_windows_met"] == 0.983 and r["windows_ok"]
    assert abs(r["steady_ratio"] - 700 / 680) < 1e-9


def test_missed_windows_name_the_batch_ahead_and_the_decision_in_force():
    profile = load_profile(PROFILE, [])
    model = step_model(profile, None)
    cfg = sim_config(
        profile,
        engine=engine_params(profile),
        chat={"rate": 5.0},
        batch={"docs": 20, "mode": "whole", "start_s": 30.0},
        slo={"chat_itl_p99_ms": 50.0, "chat_ttft_p99_ms": 1000.0},
        duration_s=240.0,
    )
    result = simulate(cfg, model, lambda _replica: NoAdmissionControl())
    missed = missed_windows(result)
    assert len(missed) == round(4 * (1 - result.summary["chat"]["slo_windows_met"]))
    assert missed and all(m["reason"] == "uncontrolled" for m in missed)
    assert any(m["batch_ahead_tokens"] > 0 for m in missed)
    assert all(m["itl_p99_ms"] > 50 or m["ttft_p99_ms"] > 1000 for m in missed)
