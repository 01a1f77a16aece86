from sched_fixtures import itype

from spotwright.model import labels as wk
from spotwright.model.objects import NodeSelectorRequirement as R
from spotwright.model.resources import Resources
from spotwright.ports.cloud import Offering
from spotwright.scheduling import ClaimPlan, choose_offerings

TYPES = {t.name: t for t in (itype("a.large", 2, 8, 0.10), itype("b.large", 2, 8, 0.12))}


def claim(*reqs: R, types: tuple[str, ...] = ("a.large", "b.large")) -> ClaimPlan:
    return ClaimPlan("default", [], Resources(cpu=1000), types, reqs)


def test_reserved_then_spot_then_on_demand() -> None:
    offers = [
        Offering("a.large", "z1", wk.ON_DEMAND, 0.10),
        Offering("a.large", "z1", wk.SPOT, 0.04),
        Offering("b.large", "z1", wk.RESERVED, 0.0),
    ]
    assert choose_offerings(claim(), TYPES, offers)[0] == wk.RESERVED  # type: ignore[index]
    ct, chosen = choose_offerings(claim(), TYPES, offers[:2])  # type: ignore[misc]
    assert ct == wk.SPOT and [o.price for o in chosen] == [0.04]
    only_od = claim(R(wk.CAPACITY_TYPE, "In", (wk.ON_DEMAND,)))
    assert choose_offerings(only_od, TYPES, offers)[0] == wk.ON_DEMAND  # type: ignore[index]


def test_unavailable_offerings_fall_back() -> None:
    offers = [
        Offering("a.large", "z1", wk.SPOT, 0.04, available=False),
        Offering("a.large", "z1", wk.ON_DEMAND, 0.10),
    ]
    ct, chosen = choose_offerings(claim(), TYPES, offers)  # type: ignore[misc]
    assert ct == wk.ON_DEMAND and all(o.available for o in chosen)
    assert choose_offerings(claim(), TYPES, [offers[0]]) is None


def test_spot_dearer_than_on_demand_dropped() -> None:
    offers = [
        Offering("a.large", "z1", wk.ON_DEMAND, 0.10),
        Offering("b.large", "z1", wk.SPOT, 0.11),
        Offering("a.large", "z2", wk.SPOT, 0.05),
    ]
    ct, chosen = choose_offerings(claim(), TYPES, offers)  # type: ignore[misc]
    assert ct == wk.SPOT and [o.instance_type for o in chosen] == ["a.large"]
    ct, _ = choose_offerings(claim(), TYPES, offers[:2])  # type: ignore[misc]
    assert ct == wk.ON_DEMAND


def test_zone_requirement_and_truncation() -> None:
    offers = [
        Offering("a.large", "z1", wk.SPOT, 0.04),
        Offering("a.large", "z2", wk.SPOT, 0.03),
        Offering("b.large", "z2", wk.SPOT, 0.02),
    ]
    zoned = claim(R(wk.ZONE, "In", ("z2",)))
    _, chosen = choose_offerings(zoned, TYPES, offers, max_types=1)  # type: ignore[misc]
    assert [(o.instance_type, o.zone) for o in chosen] == [("b.large", "z2")]
