"""Node selector requirements as sets of allowed label values, and their algebra.

Every constraint on a node label (In, NotIn, Exists, DoesNotExist, Gt, Lt) is one shape:
a finite set of values or the complement of one, optional integer bounds, and whether the
label may be missing altogether. With that one shape, intersecting a NodePool's
requirements with a pod's, or with an instance type's labels, is a few set operations, and
"can these both hold?" is "is anything left?". Keys are normalised through
``labels.ALIASES`` once, at construction, so the hot loop never sees a deprecated key;
EKS's and eksctl's capacity-type labels become ``karpenter.sh/capacity-type`` the same
way (``compat``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from spotwright.model import labels as wk
from spotwright.model.objects import NodeSelectorRequirement
from spotwright.scheduling.compat import (
    EKS_CAPACITY_TYPE,
    EKSCTL_LIFECYCLE,
    canonical_value,
    normalise,
)

__all__ = ["KeyRequirement", "Requirements", "canonical_key", "min_values_shortfall"]

_ALIASED_BY: dict[str, tuple[str, ...]] = {}
for _alias, _canonical in wk.ALIASES.items():
    _ALIASED_BY[_canonical] = (*_ALIASED_BY.get(_canonical, ()), _alias)


def canonical_key(key: str) -> str:
    return wk.ALIASES.get(key, key)


def _as_int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class KeyRequirement:
    """What one label key may be: a value set (or its complement), bounds, absence.

    ``complement`` False means "one of ``values``"; True means "anything but ``values``".
    ``absent_ok`` says whether a node without the label satisfies it (NotIn, DoesNotExist).
    """

    values: frozenset[str]
    complement: bool
    absent_ok: bool
    gt: int | None = None
    lt: int | None = None

    @classmethod
    def from_term(cls, op: str, values: Iterable[str]) -> KeyRequirement:
        vals = frozenset(values)
        if op == "In":
            return cls(vals, False, False)
        if op == "NotIn":
            return cls(vals, True, True)
        if op == "Exists":
            return cls(frozenset(), True, False)
        if op == "DoesNotExist":
            return cls(frozenset(), False, True)
        if op in ("Gt", "Lt"):
            bound = _as_int(next(iter(vals))) if len(vals) == 1 else None
            if bound is None:
                raise ValueError(
                    f"operator {op} needs exactly one integer value, got {sorted(vals)}"
                )
            return cls(
                frozenset(),
                True,
                False,
                gt=bound if op == "Gt" else None,
                lt=bound if op == "Lt" else None,
            )
        raise ValueError(f"unknown node selector operator {op!r}")

    def allows(self, value: str) -> bool:
        """True if a node labelled ``value`` satisfies this requirement."""
        if self.gt is not None or self.lt is not None:
            number = _as_int(value)
            if number is None:
                return False
            if self.gt is not None and number <= self.gt:
                return False
            if self.lt is not None and number >= self.lt:
                return False
        return (value not in self.values) if self.complement else (value in self.values)

    def has_value(self) -> bool:
        """True if at least one label value satisfies the requirement."""
        if not self.complement:
            return bool(self.values)
        if self.gt is None or self.lt is None:
            return True
        low, high = self.gt + 1, self.lt - 1
        if high < low:
            return False
        excluded = sum(1 for v in self.values if (n := _as_int(v)) is not None and low <= n <= high)
        return high - low + 1 > excluded

    def satisfiable(self) -> bool:
        return self.absent_ok or self.has_value()

    def intersect(self, other: KeyRequirement) -> KeyRequirement:
        if self == other:
            return self
        if self.complement and other.complement:
            values, complement = self.values | other.values, True
        elif self.complement:
            values, complement = other.values - self.values, False
        elif other.complement:
            values, complement = self.values - other.values, False
        else:
            values, complement = self.values & other.values, False
        gt = (
            self.gt if other.gt is None else other.gt if self.gt is None else max(self.gt, other.gt)
        )
        lt = (
            self.lt if other.lt is None else other.lt if self.lt is None else min(self.lt, other.lt)
        )
        merged = KeyRequirement(values, complement, self.absent_ok and other.absent_ok, gt, lt)
        if not complement and (gt is not None or lt is not None):
            merged = KeyRequirement(
                frozenset(v for v in values if merged.allows(v)), False, merged.absent_ok, gt, lt
            )
        return merged

    def describe(self, key: str) -> str:
        if self.gt is not None or self.lt is not None:
            parts = []
            if self.gt is not None:
                parts.append(f"{key} Gt {self.gt}")
            if self.lt is not None:
                parts.append(f"{key} Lt {self.lt}")
            return " and ".join(parts)
        listed = ", ".join(sorted(self.values))
        if self.complement:
            return f"{key} NotIn [{listed}]" if self.values else f"{key} Exists"
        return (
            f"{key} In [{listed}]" if self.values or not self.absent_ok else f"{key} DoesNotExist"
        )

    def to_terms(self, key: str) -> list[NodeSelectorRequirement]:
        out: list[NodeSelectorRequirement] = []
        if not self.complement:
            if self.values or not self.absent_ok:
                out.append(NodeSelectorRequirement(key, "In", tuple(sorted(self.values))))
            else:
                out.append(NodeSelectorRequirement(key, "DoesNotExist"))
            return out
        if self.values:
            out.append(NodeSelectorRequirement(key, "NotIn", tuple(sorted(self.values))))
        elif not self.absent_ok and self.gt is None and self.lt is None:
            out.append(NodeSelectorRequirement(key, "Exists"))
        if self.gt is not None:
            out.append(NodeSelectorRequirement(key, "Gt", (str(self.gt),)))
        if self.lt is not None:
            out.append(NodeSelectorRequirement(key, "Lt", (str(self.lt),)))
        return out


_EMPTY: dict[str, KeyRequirement] = {}


class Requirements(Mapping[str, KeyRequirement]):
    """An immutable AND of per-key requirements; hashable, so results can be cached.

    The node side (a NodePool template or a claim) calls ``compatible(pod_side)``. A
    well-known key that the node side leaves out is unconstrained: the instance type
    will define it. Any other key the node side leaves out will be missing on the node.
    """

    __slots__ = ("_hash", "_keys")

    def __init__(self, keys: Mapping[str, KeyRequirement] | None = None) -> None:
        self._keys: dict[str, KeyRequirement] = dict(keys) if keys else _EMPTY
        self._hash: int | None = None

    # -- construction ---------------------------------------------------------------
    @classmethod
    def from_terms(cls, reqs: Iterable[NodeSelectorRequirement]) -> Requirements:
        keys: dict[str, KeyRequirement] = {}
        for term in reqs:
            key, values = normalise(canonical_key(term.key), term.operator, term.values)
            new = KeyRequirement.from_term(term.operator, values)
            old = keys.get(key)
            keys[key] = new if old is None else old.intersect(new)
        return cls(keys)

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> Requirements:
        keys: dict[str, KeyRequirement] = {}
        for raw, value in labels.items():
            key, values = normalise(canonical_key(raw), "In", (value,))
            new = KeyRequirement(frozenset(values), False, False)
            old = keys.get(key)
            keys[key] = new if old is None else old.intersect(new)
        return cls(keys)

    # -- mapping protocol -------------------------------------------------------------
    def __getitem__(self, key: str) -> KeyRequirement:
        return self._keys[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._keys.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Requirements):
            return NotImplemented
        return hash(self) == hash(other) and self._keys == other._keys

    def __str__(self) -> str:
        if not self._keys:
            return "(none)"
        return ", ".join(self._keys[k].describe(k) for k in sorted(self._keys))

    def __repr__(self) -> str:
        return f"Requirements({self})"

    # -- algebra ------------------------------------------------------------------------
    def intersect(self, other: Requirements) -> Requirements:
        if not other._keys or other is self:
            return self
        if not self._keys:
            return other
        keys = dict(self._keys)
        changed = False
        for key, req in other._keys.items():
            mine = keys.get(key)
            merged = req if mine is None else mine.intersect(req)
            if merged != mine:
                keys[key] = merged
                changed = True
        return Requirements(keys) if changed else self

    def with_key(self, key: str, req: KeyRequirement) -> Requirements:
        """These requirements with ``key`` narrowed further by ``req``."""
        keys = dict(self._keys)
        mine = keys.get(key)
        keys[key] = req if mine is None else mine.intersect(req)
        return Requirements(keys)

    def conflict(self, other: Requirements) -> str | None:
        """The first key on which ``other`` (pod side) cannot hold here, or None."""
        for key, req in other._keys.items():
            mine = self._keys.get(key)
            if mine is None:
                if key in wk.WELL_KNOWN:
                    if not req.satisfiable():
                        return key
                elif not req.absent_ok:
                    return key
            elif not mine.intersect(req).satisfiable():
                return key
        return None

    def compatible(self, other: Requirements) -> bool:
        """Can a node with these requirements satisfy ``other`` (Karpenter semantics)?"""
        return self.conflict(other) is None

    def intersects(self, other: Requirements) -> bool:
        """Do the two agree on every key both constrain? Keys only one side has are free."""
        small, large = (self, other) if len(self._keys) <= len(other._keys) else (other, self)
        for key, req in small._keys.items():
            theirs = large._keys.get(key)
            if theirs is not None and not theirs.intersect(req).satisfiable():
                return False
        return True

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Does a node with exactly these ``labels`` satisfy every requirement?"""
        for key, req in self._keys.items():
            value = labels.get(key)
            if value is None:
                for alias in _ALIASED_BY.get(key, ()):
                    value = labels.get(alias)
                    if value is not None:
                        break
            if value is None and key == wk.CAPACITY_TYPE:
                for foreign in (EKS_CAPACITY_TYPE, EKSCTL_LIFECYCLE):
                    found = labels.get(foreign)
                    if found is not None:
                        value = canonical_value(foreign, found)
                        if value is not None:
                            break
            if value is None:
                if not req.absent_ok:
                    return False
            elif not req.allows(value):
                return False
        return True

    def allowed(self, key: str) -> frozenset[str] | None:
        """The finite set of values ``key`` may take, or None if it is not a finite set."""
        req = self._keys.get(canonical_key(key))
        if req is None or req.complement:
            return None
        return req.values

    def to_terms(self) -> tuple[NodeSelectorRequirement, ...]:
        out: list[NodeSelectorRequirement] = []
        for key in sorted(self._keys):
            out.extend(self._keys[key].to_terms(key))
        return tuple(out)


def min_values_shortfall(
    terms: Iterable[NodeSelectorRequirement], labels: Iterable[Mapping[str, str]]
) -> str | None:
    """Which ``minValues`` the candidate instance types (given by their labels) break.

    A NodePool that asks for ``instance-family`` with ``minValues: 3`` wants every claim
    flexible across at least three families, so a spot shortage in one cannot strand it.
    Returns None when every floor holds, else a sentence naming the first one that does
    not. Only keys the instance types themselves carry are counted.
    """
    floors = [(canonical_key(t.key), t.min_values) for t in terms if t.min_values]
    if not floors:
        return None
    seen: dict[str, set[str]] = {key: set() for key, _ in floors}
    carried: set[str] = set()
    for type_labels in labels:
        for key, values in seen.items():
            value = type_labels.get(key)
            if value is not None:
                values.add(value)
                carried.add(key)
    for key, floor in floors:
        if key in carried and len(seen[key]) < floor:
            found = len(seen[key])
            return (
                f"minValues {floor} for {key} not met: the instance types that fit "
                f"offer {found} value{'' if found == 1 else 's'}"
            )
    return None
