"""The seed's incidents, replayed on the 70B FP8 / 2×H100 profile (issue 3, item 5).

Each test simulates only a few minutes of the profile from engine_configs/, priced by the roofline
latency model at the planner's typical efficiencies, exactly as `nightshift simulate` does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.engine_profile import engine_params, load_profile, step_model
from simulator.config import sim_config
from simulator.run import simulate

PROFILE = Path(__file__).resolve().parents[2] / "engine_configs" / "h100x2-llama-3.1-70b-fp8.yaml"


def run(overrides: list[str], chat: dict, batch_docs: int = 0, duration: float = 240.0, seed=0):
    profile = load_profile(PROFILE, overrides)
    cfg = sim_config(
        profile.name,
        engine=engine_params(profile),
        chat=chat,
        batch={"docs": batch_docs, "doc_tokens": 80_000, "mode": "whole"},
        duration_s=duration,
        seed=seed,
    )
    return simulate(cfg, step_model(profile, None)).summary


@pytest.mark.parametrize("seed", [0, 1])
def test_prefix_caching_cuts_chat_ttft_p95_at_least_2_5x(seed):
    # A 6k system prompt plus 4k of retrieved context per user, re-prefilled every turn without
    # prefix caching; 0.5 requests/s puts that at ~2.5-3.5 s TTFT p95, as the incident saw.
    chat = {"rate": 0.5, "system_prompt_tokens": 6000, "context_tokens": 4000}
    without = run(["enable-prefix-caching=false"], chat, duration=300.0, seed=seed)
    with_cache = run(["enable-prefix-caching=true"], chat, duration=300.0, seed=seed)
    slow, fast = without["chat"]["ttft_ms"]["p95"], with_cache["chat"]["ttft_ms"]["p95"]
    assert slow > 2000
    assert slow >= 2.5 * fast


@pytest.fixture(scope="module")
def chat_only_itl_p99() -> float:
    return run([], {"rate": 5.0})["chat"]["itl_ms"]["p99"]


def test_80k_documents_without_chunked_prefill_push_chat_itl_p99_up_10x(chat_only_itl_p99):
    mixed = run(["enable-chunked-prefill=false"], {"rate": 5.0}, batch_docs=10)
    assert mixed["chat"]["itl_ms"]["p99"] >= 10 * chat_only_itl_p99


def test_chunked_prefill_with_a_small_budget_keeps_chat_itl_p99_within_1_5x(chat_only_itl_p99):
    # The profile's own budget (272) is sized for chat alone: full 272-token steps of an 80k prompt
    # late in the document add ~25 ms of attention each (~1.6x chat-only). Without an admission
    # controller to shrink those chunks, the engine-wide budget must be smaller still.
    mixed = run(["max-num-batched-tokens=192"], {"rate": 5.0}, batch_docs=10)
    assert mixed["chat"]["itl_ms"]["p99"] <= 1.5 * chat_only_itl_p99
    assert mixed["batch"]["docs_done"] > 0  # batch did run beside chat
