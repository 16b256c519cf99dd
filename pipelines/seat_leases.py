"""Seat leases: the Gate takes back the seats of a worker that died holding them.

A seat is returned by its worker's `release`, also on failure and on cancellation; a worker that
dies (its process killed, its node lost) releases nothing, and Ray Data retries its document on
another worker, which then waits for a seat the dead one still holds. Without leases a night that
lost a worker ran on fewer seats until it stalled for good.

So a worker names itself (its holder id) when it asks for a seat and renews its lease with the
abort check it already sends the Gate every half second. A holder unheard of for `lease_s` is
dead, and the Gate releases its seats. Invariants:
- a lease expires only after `lease_s` of the Gate's own waking time without a word from its
  holder: when the Gate itself was stalled (its checks more than half a lease apart, as on a host
  too loaded to run it), every lease is renewed at the next check, so a slow Gate never mistakes
  its own silence for its workers' death;
- a holder is forgotten once expired; a word from it later starts a new lease (a worker that was
  only slow loses the seats it held, and its releases of them are harmless no-ops).
Pure: the caller passes the clock.
"""

from __future__ import annotations

DEFAULT_LEASE_S = 30.0
"""Sixty missed renewals: far beyond a loaded host's hiccup, short beside a night."""


class SeatLeases:
    """When each holder was last heard of, and which have been silent for too long."""

    def __init__(self, lease_s: float = DEFAULT_LEASE_S) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s {lease_s} must be positive seconds")
        self.lease_s = lease_s
        self._seen: dict[str, float] = {}
        self._checked: float | None = None

    def renew(self, holder: str, now: float) -> None:
        self._seen[holder] = now

    def forget(self, holder: str) -> None:
        self._seen.pop(holder, None)

    def expired(self, now: float) -> list[str]:
        """Holders silent for `lease_s`, forgotten as they are returned (see the invariants)."""
        stalled = self._checked is not None and now - self._checked > self.lease_s / 2
        self._checked = now
        if stalled:
            self._seen = dict.fromkeys(self._seen, now)
            return []
        gone = [h for h, t in self._seen.items() if now - t >= self.lease_s]
        for h in gone:
            del self._seen[h]
        return gone

    def __contains__(self, holder: str) -> bool:
        return holder in self._seen
