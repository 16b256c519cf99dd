"""Seat leases: silent holders expire, a stalled Gate does not mistake its own silence for theirs."""

from __future__ import annotations

import pytest

from pipelines.seat_leases import SeatLeases


def test_a_holder_silent_for_a_lease_expires_once_and_others_keep_theirs() -> None:
    leases = SeatLeases(lease_s=10.0)
    leases.renew("a", 0.0)
    leases.renew("b", 0.0)
    for t in range(1, 10):  # checked every second, as the Gate's polls do
        leases.renew("b", float(t))
        assert leases.expired(float(t)) == []
    assert leases.expired(10.0) == ["a"]
    assert "a" not in leases and "b" in leases
    assert leases.expired(11.0) == []  # forgotten: reported once
    leases.renew("a", 12.0)  # heard of again: a new lease
    assert "a" in leases


def test_a_gate_that_stalled_renews_every_lease_instead_of_expiring_them() -> None:
    leases = SeatLeases(lease_s=10.0)
    leases.renew("a", 0.0)
    assert leases.expired(1.0) == []
    assert leases.expired(40.0) == []  # the Gate itself was away 39 s: nobody is blamed
    assert leases.expired(45.0) == []
    assert leases.expired(50.0) == ["a"]  # then a lease of the Gate's waking time


def test_forget_and_bad_lease() -> None:
    leases = SeatLeases(lease_s=1.0)
    leases.renew("a", 0.0)
    leases.forget("a")
    assert leases.expired(0.4) == [] and leases.expired(0.8) == []
    with pytest.raises(ValueError, match="lease_s 0 must be positive"):
        SeatLeases(lease_s=0)
