"""The controller as `nightshift simulate` and the Gate build it: it knows the engine's step size.

Without `engine_step_tokens` a batch prompt is priced as one step and the TTFT guard is off; both
places that build a controller from an engine config must pass it on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli_simulate import (
    apply_settings,
    engine_params,
    load_profile,
    policy_factory,
    sim_config,
    step_model,
)
from pipelines.gate_setup import build_policy
from scheduler.admission import BatchInFlight, Observation, StaticCaps
from scheduler.controller import ControllerConfig, SLOController
from tests.unit.test_controller import MODEL, SLO_50

PROFILE = Path(__file__).resolve().parents[2] / "engine_configs" / "h100x2-llama-3.1-70b-fp8.yaml"
FLAGS = {"max-num-batched-tokens": 512, "long-prefill-token-threshold": 256}


def queued_prefill(replica: str = "r0") -> Observation:
    """Three 4k-token batch prompts not yet prefilled: far past a quarter of a 1 s TTFT SLO."""
    return Observation(
        t=0.0,
        replica=replica,
        chat_itl_p99_s=0.02,
        batch_in_flight=tuple(BatchInFlight(4096, 0) for _ in range(3)),
    )


@pytest.fixture(scope="module")
def profile():
    return load_profile(PROFILE, [])


def simulate_controller(profile, *settings: str) -> SLOController:
    cfg = sim_config(profile, engine=engine_params(profile, 1_000_000), duration_s=60.0)
    cfg = apply_settings(cfg, list(settings))
    ctrl = policy_factory("slo", cfg, step_model(profile, None), 4, 2048)("sim-0")
    assert isinstance(ctrl, SLOController)
    return ctrl


def test_simulate_passes_the_engine_step_to_the_controller(profile):
    ctrl = simulate_controller(profile)
    assert ctrl.config.engine_step_tokens == profile.vllm["max-num-batched-tokens"] == 272
    d = ctrl.decide(queued_prefill())
    assert d.pause and d.reason == "ttft-guard"  # the TTFT guard is on


def test_simulate_reads_the_step_of_the_engine_it_runs(profile):
    lower = simulate_controller(profile, "engine.long_prefill_token_threshold=128")
    assert lower.config.engine_step_tokens == 128
    whole = simulate_controller(profile, "engine.enable_chunked_prefill=false")
    assert whole.config.engine_step_tokens is None


def test_the_gate_policy_reads_the_engine_step_from_the_engine_flags():
    ctrl = build_policy("slo", SLO_50, latency_model=MODEL, engine_flags=FLAGS)
    assert isinstance(ctrl, SLOController) and ctrl.config.engine_step_tokens == 256
    d = ctrl.decide(queued_prefill())
    assert d.pause and d.reason == "ttft-guard"
    blind = build_policy("slo", SLO_50, latency_model=MODEL)
    assert blind.config.engine_step_tokens is None
    assert blind.decide(queued_prefill()).reason != "ttft-guard"


def test_the_gate_policy_keeps_the_callers_controller_settings():
    tuned = ControllerConfig(headroom=0.6, cold_start_seats=3)
    ctrl = build_policy("slo", SLO_50, tuned, MODEL, engine_flags=FLAGS)
    assert (ctrl.config.headroom, ctrl.config.cold_start_seats) == (0.6, 3)
    assert ctrl.config.engine_step_tokens == 256
    chosen = ControllerConfig(engine_step_tokens=None)  # set on purpose: the caller's word stands
    assert build_policy("slo", SLO_50, chosen, MODEL, engine_flags=FLAGS).config == chosen
    static = build_policy("static", SLO_50, engine_flags=FLAGS, static_caps=(2, 1024))
    assert static == StaticCaps(2, 1024)


def test_the_gate_actor_hands_the_engine_flags_to_its_controller(tmp_path):
    from pipelines.gate import GateActor

    path = tmp_path / "model.json"
    MODEL.to_json(path)
    gate = GateActor(
        "wired", [("r0", "http://127.0.0.1:9")], latency_model=str(path), engine_flags=FLAGS
    )
    assert gate.policy.config.engine_step_tokens == 256
    blind = GateActor("blind", [("r0", "http://127.0.0.1:9")], latency_model=str(path))
    assert blind.policy.config.engine_step_tokens is None


def test_the_gate_takes_the_engine_configs_tuning_and_step(tmp_path):
    import yaml

    from scheduler.controller import controller_config
    from serving.engine_config import load_engine_config

    doc = yaml.safe_load((PROFILE.parent / "cpu-small.yaml").read_text())
    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump({**doc, "controller": {"headroom": 0.5}}))
    tuned = load_engine_config(path)
    config = controller_config(tuned.controller, tuned.vllm)
    assert config.headroom == 0.5 and config.engine_step_tokens == 512


def test_simulate_takes_the_engine_configs_controller_tuning(profile):
    tuned = ControllerConfig(headroom=0.5)
    cfg = sim_config(profile, engine=engine_params(profile, 1_000_000), duration_s=60.0)
    ctrl = policy_factory("slo", cfg, step_model(profile, None), 4, 2048, tuned)("sim-0")
    assert ctrl.config.headroom == 0.5 and ctrl.config.engine_step_tokens is not None
