"""What the controller and the benchmarks read off an engine config's `vllm:` flags (dash form)."""

from __future__ import annotations

import math
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


def batch_seat_limit(flags: Mapping[str, Any], chat_share: float) -> int | None:
    """Most batch seats an engine with these flags can give without taking the sequence slots chat
    needs: `max-num-seqs` less `chat_share` of it (at least one slot kept for chat). A chat
    arriving at a full engine waits for a batch request to finish, whatever its priority. None
    when the flag is unset."""
    slots = flags.get("max-num-seqs")
    if slots is None:
        return None
    return max(1, int(slots) - max(1, math.ceil(int(slots) * chat_share)))
