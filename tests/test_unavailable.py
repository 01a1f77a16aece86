"""The unavailable-offerings cache: what failed is avoided for its TTL, then tried again."""

from __future__ import annotations

from spotwright.controllers.unavailable import UnavailableOfferings
from spotwright.ports.cloud import Offering

SPOT_A = Offering("g4dn.xlarge", "us-east-1a", "spot", 0.2)
SPOT_B = Offering("g4dn.xlarge", "us-east-1b", "spot", 0.2)
OD_A = Offering("g4dn.xlarge", "us-east-1a", "on-demand", 0.526)


def test_failed_offering_is_hidden_for_three_minutes_only() -> None:
    cache = UnavailableOfferings(ttl=180)
    cache.mark_offering("spot", "g4dn.xlarge", "us-east-1a", now=0)
    during = cache.apply([SPOT_A, SPOT_B, OD_A], now=179)
    assert [o.available for o in during] == [False, True, True]
    after = cache.apply([SPOT_A, SPOT_B, OD_A], now=181)
    assert all(o.available for o in after)


def test_quota_closes_the_whole_capacity_type_so_fallback_is_immediate() -> None:
    cache = UnavailableOfferings(ttl=180)
    cache.mark_capacity_type("spot", now=10)
    out = cache.apply([SPOT_A, SPOT_B, OD_A], now=11)
    assert [o.capacity_type for o in out if o.available] == ["on-demand"]
    assert cache.next_expiry(now=11) == 190
