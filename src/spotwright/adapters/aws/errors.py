"""EC2 launch errors, sorted into the three kinds the provisioner acts on.

* An offering is out of capacity (``InsufficientCapacityError`` listing each failed
  offering): the provisioner avoids those (type, zone, capacity type) pools for a while.
* A whole capacity type is closed by a limit (``QuotaExceededError``): the provisioner stops
  asking for it at all, so fallback to on-demand is immediate rather than one pool at a time
  (Karpenter issues aws#5789 and aws#4318).
* Anything else (``CloudError`` with the EC2 code): the launch failed for a reason that
  avoiding offerings would not fix, such as a bad launch template or missing permission.

CreateFleet of type ``instant`` reports most failures inside a successful response, one
``Errors`` item per override it tried; quota and permission problems can also come back as
the call's own error. Both paths end up here. The codes are the ones the simulated market
raises, so controllers behave the same in both worlds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from spotwright.model import labels as wk
from spotwright.ports.cloud import (
    CloudError,
    InsufficientCapacityError,
    Offering,
    OfferingError,
    QuotaExceededError,
)

__all__ = [
    "OFFERING_CODES",
    "QUOTA_CODES",
    "classify_call_error",
    "classify_fleet_errors",
    "quota_capacity_type",
]

#: Codes that fail one override, i.e. one (instance type, zone) pool.
OFFERING_CODES: Final = frozenset(
    {
        "InsufficientInstanceCapacity",
        "UnfulfillableCapacity",
        "InsufficientFreeAddressesInSubnet",
        "Unsupported",
    }
)
#: Codes that close a capacity type in the region. ``None`` means the request's own type.
QUOTA_CODES: Final[Mapping[str, str | None]] = {
    "MaxSpotInstanceCountExceeded": wk.SPOT,
    # Spot needs the AWSServiceRoleForEC2Spot role; without permission to create it, no
    # spot launch can succeed until someone creates it.
    "AuthFailure.ServiceLinkedRoleCreationNotPermitted": wk.SPOT,
    "VcpuLimitExceeded": None,
    # The simulated market's on-demand quota code; EC2 uses it for older instance limits.
    "InstanceLimitExceeded": None,
}


def quota_capacity_type(code: str, requested: str) -> str | None:
    """The capacity type ``code`` closes, or None if it is not a quota code."""
    if code not in QUOTA_CODES:
        return None
    return QUOTA_CODES[code] or requested


def classify_fleet_errors(
    errors: Iterable[Mapping[str, Any]],
    *,
    capacity_type: str,
    offerings: Sequence[Offering],
    zone_of_subnet: Mapping[str, str],
) -> CloudError:
    """The error for a request that got no instance, from CreateFleet's ``Errors`` list.

    A quota code anywhere wins (it explains every other failure). Otherwise, when every
    error is an offering code, each names its override's offering; an error without an
    override applies to every offering of the request. An empty list (EC2 returned neither
    instances nor errors) is treated as every offering being unfulfillable, so the
    provisioner moves on instead of retrying the same pools at once. Any other code wins
    as a plain ``CloudError``.
    """
    items = list(errors)
    for item in items:
        code = str(item.get("ErrorCode") or "")
        closed = quota_capacity_type(code, capacity_type)
        if closed is not None:
            return QuotaExceededError(code, closed, str(item.get("ErrorMessage") or code))
    for item in items:
        code = str(item.get("ErrorCode") or "Unknown")
        if code not in OFFERING_CODES:
            return CloudError(code, str(item.get("ErrorMessage") or code))
    by_pool = {(o.instance_type, o.zone): o for o in offerings}
    failed: dict[tuple[str, str], OfferingError] = {}
    for item in items:
        code = str(item["ErrorCode"])
        message = str(item.get("ErrorMessage") or code)
        override = (item.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
        instance_type = override.get("InstanceType")
        zone = override.get("AvailabilityZone") or zone_of_subnet.get(
            str(override.get("SubnetId") or "")
        )
        if instance_type and zone:
            targets = [by_pool[(instance_type, zone)]] if (instance_type, zone) in by_pool else []
        elif instance_type:
            targets = [o for o in offerings if o.instance_type == instance_type]
        else:
            targets = list(offerings)
        for offering in targets:
            failed.setdefault(
                (offering.instance_type, offering.zone), OfferingError(offering, code, message)
            )
    if not items:
        message = "CreateFleet returned no instance and no error"
        failed = {
            (o.instance_type, o.zone): OfferingError(o, "UnfulfillableCapacity", message)
            for o in offerings
        }
    if not failed:  # errors for overrides this request did not send: blame them all
        first = items[0]
        failed = {
            (o.instance_type, o.zone): OfferingError(
                o, str(first["ErrorCode"]), str(first.get("ErrorMessage") or "")
            )
            for o in offerings
        }
    return InsufficientCapacityError(list(failed.values()))


def classify_call_error(
    error: CloudError, *, capacity_type: str, offerings: Sequence[Offering]
) -> CloudError:
    """The port error for a CreateFleet call that itself failed (after retries).

    Always a new exception object, so the callers of a merged launch do not share one.
    """
    closed = quota_capacity_type(error.code, capacity_type)
    if closed is not None:
        return QuotaExceededError(error.code, closed, error.message)
    if error.code in OFFERING_CODES:
        return InsufficientCapacityError(
            [OfferingError(o, error.code, error.message) for o in offerings]
        )
    return CloudError(error.code, error.message)
