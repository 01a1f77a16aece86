"""Taints and tolerations: the one check every placement makes first.

Kept apart from requirements because the rules differ (an empty-key Exists toleration
matches every taint, effects must match unless the toleration leaves the effect out) and
because the drainer and the kube-scheduler emulation need it on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from spotwright.model.objects import Taint, Toleration

__all__ = ["tolerates", "toleration_matches", "untolerated_prefer_no_schedule"]


def toleration_matches(toleration: Toleration, taint: Taint) -> bool:
    """Kubernetes' ``Toleration.ToleratesTaint``."""
    if toleration.effect is not None and toleration.effect != taint.effect:
        return False
    if toleration.operator == "Exists":
        return toleration.key == "" or toleration.key == taint.key
    return toleration.key == taint.key and toleration.value == taint.value


def tolerates(tolerations: Sequence[Toleration], taints: Sequence[Taint]) -> Taint | None:
    """The first NoSchedule/NoExecute taint no toleration matches, or None if all are.

    PreferNoSchedule taints are soft and never block; see
    ``untolerated_prefer_no_schedule`` for the preference check.
    """
    for taint in taints:
        if taint.effect == "PreferNoSchedule":
            continue
        if not any(toleration_matches(t, taint) for t in tolerations):
            return taint
    return None


def untolerated_prefer_no_schedule(
    tolerations: Sequence[Toleration], taints: Sequence[Taint]
) -> Taint | None:
    """The first PreferNoSchedule taint not tolerated (used before preferences relax)."""
    for taint in taints:
        if taint.effect == "PreferNoSchedule" and not any(
            toleration_matches(t, taint) for t in tolerations
        ):
            return taint
    return None
