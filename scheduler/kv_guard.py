"""KV-cache headroom arithmetic shared by the controller and the Gate.

A preempted batch request loses its KV and restarts its prefill from zero (DESIGN §1), which for an
80k-token document wastes minutes of GPU time and stalls chat while it recomputes. So batch work is
admitted against KV that is already *committed*, not just KV in use: a request admitted a moment ago
has barely started its prefill, yet it will hold its whole prompt (and its output) in KV soon.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.admission import BatchInFlight


def committed_kv(
    kv_usage: float, capacity_tokens: int | None, batch: Iterable[BatchInFlight]
) -> float:
    """KV fraction in use now plus the prompt tokens admitted batch requests have yet to prefill.

    Without a capacity in tokens the pending prefills cannot be expressed as a fraction, so the
    answer is the usage alone (the guard then only knows what the engine reports)."""
    if not capacity_tokens:
        return kv_usage
    pending = sum(b.prefill_remaining for b in batch)
    return kv_usage + pending / capacity_tokens


def seats_that_fit(
    committed: float, capacity_tokens: int, seat_tokens: int, high_water: float
) -> int:
    """How many more batch requests of `seat_tokens` KV each fit below the high-water mark."""
    room_tokens = (high_water - committed) * capacity_tokens
    if room_tokens <= 0 or seat_tokens <= 0:
        return 0
    return int(room_tokens // seat_tokens)


def request_fits(
    committed: float, capacity_tokens: int | None, request_tokens: int, high_water: float
) -> bool:
    """Whether one more request holding `request_tokens` of KV keeps usage under the high-water mark.

    With an unknown capacity only the current usage can be checked."""
    if not capacity_tokens:
        return committed < high_water
    return committed + request_tokens / capacity_tokens <= high_water
