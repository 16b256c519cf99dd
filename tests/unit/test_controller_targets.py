"""bench/controller_targets.py: which static caps the controller is judged against, and the list of
its missed windows with what to look at first."""

from __future__ import annotations

from bench.controller_targets import PROFILE, closest_static, missed_windows, targets
from scheduler.admission import NoAdmissionControl
from serving.engine_profile import engine_params, load_profile, step_model
from simulator.config import sim_config
from simulator.run import simulate


def pooled(**figures: tuple[float, float]) -> dict:
    """(scenario, policy) → figures, from policy=(windows met, tokens/s) for both scenarios."""
    out = {}
    for name, (met, tps) in figures.items():
        policy = name.replace("_", " ")
        policy = "chat-only" if policy == "chat-only" else policy
        for scenario, scale in (("steady", 1.0), ("varying", 2.0)):
            out[(scenario, policy)] = {"scenario": scenario, "policy": policy,
                                       "slo_windows_met": met, "batch_tokens_per_s": tps * scale}  # fmt: skip
    return out


def test_the_best_static_that_holds_is_the_reference_in_each_family():
    p = pooled(slo=(1.0, 1500.0), **{"static-engine_1x2048": (1.0, 600.0),
               "static-engine_2x2048": (0.995, 1000.0), "static-engine_4x4096": (0.9, 3000.0),
               "static-budget_4x0.5": (1.0, 1400.0)})  # fmt: skip
    r = targets(p)
    engine, budget = r["static-engine"], r["static-budget"]
    assert engine["holds"] and engine["chosen"] == "static-engine 2x2048"
    assert engine["steady_ratio"] == 1.5 and engine["steady_ok"]
    assert budget["chosen"] == "static-budget 4x0.5" and not budget["steady_ok"]  # 1.07 < 1.1


def test_without_a_holding_static_the_closest_one_is_the_reference():
    p = pooled(slo=(0.995, 700.0), **{"static-engine_1x2048": (0.983, 680.0),
               "static-engine_1x4096": (0.942, 1090.0)})  # fmt: skip
    assert closest_static(p, "steady", "static-engine")["policy"] == "static-engine 1x2048"
    r = targets(p)["static-engine"]
    assert not r["holds"] and r["chosen"] == "static-engine 1x2048"
    assert r["windows_met"] == 0.983
    assert abs(r["steady_ratio"] - 700 / 680) < 1e-9


def test_the_windows_target_is_what_chat_alone_can_hold():
    p = pooled(slo=(0.97, 700.0), **{"chat-only": (0.975, 0.0), "static-engine_1x2048": (0.9, 9.0)})
    r = targets(p)
    assert r["windows_needed"]["steady"] == 0.975 and not r["windows_ok"]


def test_missed_windows_name_the_batch_ahead_and_the_decision_in_force():
    profile = load_profile(PROFILE, [])
    model = step_model(profile, None)
    cfg = sim_config(
        profile.name,
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


def test_the_controller_is_judged_against_the_latency_bound_it_measured():
    p = pooled(slo=(1.0, 700.0))
    p[("steady", "slo")] |= {"slo_batch_tokens_per_s": 700.0, "bound_tokens_per_s": 1000.0}
    p[("varying", "slo")] |= {"slo_batch_tokens_per_s": 1400.0, "bound_tokens_per_s": 3000.0}
    r = targets(p)["bound"]
    assert r["steady"]["fraction"] == 0.7 and r["steady"]["ok"]
    assert abs(r["varying"]["fraction"] - 1400 / 3000) < 1e-9 and not r["varying"]["ok"]
