"""Capacity-type labels of EKS managed node groups and eksctl, understood as Karpenter's.

Manifests written for an EKS managed node group select spot nodes with
``eks.amazonaws.com/capacityType: SPOT``; those written for eksctl's mixed node groups use
``lifecycle: Ec2Spot``. spotwright's nodes carry both labels next to
``karpenter.sh/capacity-type`` (``compat_labels``, applied by ``model.nodes``), and the
scheduler reads a pod's selector or affinity on either key as a requirement on the
capacity type (``normalise``), so such pods keep scheduling, on new capacity and on
existing nodes.

Reserved capacity (capacity reservations) is on-demand capacity to these tools, so
``ON_DEMAND`` and ``OnDemand`` allow both on-demand and reserved offerings, and reserved
nodes are labelled as on-demand. EKS's ``CAPACITY_BLOCK`` has no counterpart here (a
reserved node says ``ON_DEMAND``), so, like any unknown value, it matches no node.

``lifecycle`` is a common word, so it is only read as a capacity type when every value
given is one of eksctl's two (or with Exists and DoesNotExist, which eksctl's values
cannot contradict); ``lifecycle: stable`` stays an ordinary custom label.
"""

from __future__ import annotations

from collections.abc import Iterable

from spotwright.model import labels as wk
from spotwright.model.nodes import EKS_CAPACITY_TYPE, EKSCTL_LIFECYCLE, compat_labels

__all__ = [
    "EKSCTL_LIFECYCLE",
    "EKS_CAPACITY_TYPE",
    "canonical_value",
    "compat_labels",
    "normalise",
]

#: Foreign value -> the Karpenter capacity types it allows.
_EKS_VALUES = {
    "SPOT": (wk.SPOT,),
    "ON_DEMAND": (wk.ON_DEMAND, wk.RESERVED),
}
_EKSCTL_VALUES = {
    "Ec2Spot": (wk.SPOT,),
    "OnDemand": (wk.ON_DEMAND, wk.RESERVED),
}
_FOREIGN = {EKS_CAPACITY_TYPE: _EKS_VALUES, EKSCTL_LIFECYCLE: _EKSCTL_VALUES}


def normalise(key: str, operator: str, values: Iterable[str]) -> tuple[str, tuple[str, ...]]:
    """(key, values) with a foreign capacity-type requirement rewritten as Karpenter's.

    Anything else comes back unchanged. An unknown value under the EKS key is kept as
    is, so it matches no capacity type (the pod stays pending, as it would on EKS).
    """
    table = _FOREIGN.get(key)
    given = tuple(values)
    if table is None:
        return key, given
    if operator in ("Exists", "DoesNotExist"):
        return wk.CAPACITY_TYPE, given
    if key == EKSCTL_LIFECYCLE and not (given and all(v in table for v in given)):
        return key, given
    out: list[str] = []
    for value in given:
        for mapped in table.get(value, (value,)):
            if mapped not in out:
                out.append(mapped)
    return wk.CAPACITY_TYPE, tuple(out)


def canonical_value(key: str, value: str) -> str | None:
    """A node's foreign label value as a Karpenter capacity type, or None if unknown.

    A node labelled ``ON_DEMAND`` is taken to be on-demand (not reserved).
    """
    table = _FOREIGN.get(key)
    if table is None:
        return None
    mapped = table.get(value)
    return mapped[0] if mapped else None
