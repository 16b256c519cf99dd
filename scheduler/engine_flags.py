"""What the controller and the benchmarks read off an engine config's `vllm:` flags (dash form)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def engine_step_tokens(flags: Mapping[str, Any]) -> int | None:
    """Most prompt tokens the engine prefills for one request in one step: the long-prefill
    threshold when set below the step budget, else the budget; None when chunked prefill is off (a
    prompt then goes in one step) or the budget is not set."""
    budget = flags.get("max-num-batched-tokens")
    if budget is None or flags.get("enable-chunked-prefill") is False:
        return None
    threshold = flags.get("long-prefill-token-threshold") or 0
    return int(min(budget, threshold) if 0 < threshold else budget)
