"""The controller as `nightshift simulate` and the Gate build it from an engine config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines.gate_setup import build_policy
from scheduler.admission import BatchInFlight, FixedBudget, Observation, StaticCaps
from scheduler.budget_controller import BudgetController, BudgetControllerConfig
from scheduler.latency_model import LatencyModel
from scheduler.policy_factory import PolicyChoice, make_policy
from scheduler.slo import SLO
from serving.engine_config import load_engine_config
from serving.engine_profile import engine_params, load_profile, step_model
from simulator.config import sim_config

PROFILE = Path(__file__).resolve().parents[2] / "engine_configs" / "h100x2-llama-3.1-70b-fp8.yaml"
MODEL = LatencyModel(s_per_token=1e-5, s_weight_read=0.01)
SLO_50 = SLO(chat_itl_p99_ms=50, chat_ttft_p99_ms=1000)
FLAGS = {"max-num-seqs": 16, "max-num-batched-tokens": 512}


@pytest.fixture(scope="module")
def profile():
    return load_profile(PROFILE, [])


def test_the_gate_policies_by_name():
    assert build_policy("static", SLO_50, static_caps=(2, 1024)) == StaticCaps(2, 1024)
    assert build_policy("budget", SLO_50, budget=(3, 25.0)) == FixedBudget(3, 25.0)
    ctrl = build_policy("slo", SLO_50, None, MODEL, engine_flags=FLAGS)
    assert isinstance(ctrl, BudgetController) and ctrl.engine_slots == 16
    with pytest.raises(ValueError, match="needs latency_model"):
        build_policy("slo", SLO_50)
    with pytest.raises(ValueError, match="none, static, budget, slo"):
        build_policy("fast", SLO_50)


def test_the_controller_leaves_chat_its_share_of_the_engines_slots():
    ctrl = build_policy("slo", SLO_50, BudgetControllerConfig(chat_slot_share=0.25), MODEL,
                        engine_flags=FLAGS)  # fmt: skip
    many = tuple(BatchInFlight(10, 10, 1) for _ in range(30))
    d = ctrl.decide(Observation(t=0, replica="r0", batch_in_flight=many))
    assert d.batch_seats == 12


def test_the_engine_configs_controller_section_is_the_controllers_config(tmp_path):
    doc = yaml.safe_load((PROFILE.parent / "cpu-small.yaml").read_text())
    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump({**doc, "controller": {"cut_factor": 0.5}}))
    assert load_engine_config(path).controller == BudgetControllerConfig(cut_factor=0.5)
    path.write_text(yaml.safe_dump({**doc, "controller": {"headroom": 0.5}}))
    with pytest.raises(ValueError, match="headroom"):
        load_engine_config(path)


def test_simulate_builds_the_controller_with_the_engines_slots_and_tuning(profile):
    cfg = sim_config(profile.name, engine=engine_params(profile, 1_000_000), duration_s=60.0)
    tuned = BudgetControllerConfig(cut_factor=0.5)
    slots = cfg.engine.max_num_seqs
    ctrl = make_policy(PolicyChoice("slo"), cfg.slo, step_model(profile, None), tuned, slots)
    assert isinstance(ctrl, BudgetController)
    assert ctrl.config.cut_factor == 0.5 and ctrl.engine_slots == cfg.engine.max_num_seqs
    fixed = make_policy(PolicyChoice("budget", 4, 2048, 30.0), cfg.slo)
    assert fixed == FixedBudget(4, 30.0)


def test_every_policy_says_through_the_protocol_whether_it_steers_and_guards_kv():
    """The Gate reads these instead of asking which policy class or name it was given."""
    want = {"none": (False, False), "static": (False, False), "budget": (True, False),
            "slo": (True, True)}  # fmt: skip
    for name, (steers, guards) in want.items():
        policy = make_policy(PolicyChoice(name), SLO_50, MODEL)  # type: ignore[arg-type]
        assert (policy.steers_engine, policy.guards_kv) == (steers, guards), name
