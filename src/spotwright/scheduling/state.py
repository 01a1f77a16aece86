"""The packer's working records: pools, existing nodes and claims under construction.

Kept apart from the algorithm so the explanation and output code can read them without
importing the packer, and so the hot helpers (``room``, ``plus``) sit with the tuples
they operate on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spotwright.model.objects import Pod
from spotwright.model.resources import Extended
from spotwright.scheduling.candidates import Candidates, CatalogView, Vec
from spotwright.scheduling.plan import ExistingCapacity, NodePoolTemplate
from spotwright.scheduling.requirements import Requirements
from spotwright.scheduling.topology import Constraint, Counter

__all__ = [
    "BIG",
    "ClaimState",
    "NodeState",
    "Pool",
    "Profile",
    "node_room",
    "plus",
    "room",
    "take_from_node",
]

BIG = 2**62
_ZERO: Vec = (0, 0, 0, 0, 0)


@dataclass(eq=False, slots=True)
class Pool:
    """A NodePool template with its resolved requirements and what its limits still allow."""

    template: NodePoolTemplate
    reqs: Requirements
    #: The instance types as this pool's nodes see them (after its DaemonSets' overhead).
    catalog: CatalogView
    cands: Candidates
    budget: list[int] | None
    nodes_left: int | None
    used: list[int] = field(default_factory=lambda: [0, 0, 0, 0, 0])
    #: ``minValues`` as (label key, least values): claims stop growing before breaking one.
    floors: tuple[tuple[str, int], ...] = ()


@dataclass(eq=False, slots=True)
class NodeState:
    """Existing capacity and what is still free on it this round."""

    cap: ExistingCapacity
    host: str
    free: Vec
    #: Extended resources still free (device counts, pod ENIs), by name.
    ext: dict[str, int] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class ClaimState:
    """A new claim being filled: its narrowed requirements, candidates and price cap."""

    pool: Pool
    reqs: Requirements
    cands: Candidates
    cap_price: float
    host: str
    idx: int = 0
    total: Vec = (0, 0, 0, 0, 0)
    contrib: Vec = (0, 0, 0, 0, 0)
    pods: list[Pod] = field(default_factory=list)
    retired: bool = False
    #: If set, the claim holds at most this capacity (the type it was opened for).
    target: Vec | None = None
    #: Where ``FreeRoom`` files the claim (None: not filed, no room left).
    cell: tuple[int, int] | None = None
    #: variant id -> (the claim requirements it was computed for, their meet or None)
    meets: dict[int, tuple[Requirements, Requirements | None]] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class Profile:
    """A group's topology bookkeeping for one variant."""

    records: list[Counter]
    owners: list[Counter]
    inverse: list[Counter]
    constraints: list[Constraint]


def room(cap: Vec, total: Vec, req: Vec) -> int:
    """How many more pods of ``req`` fit into ``cap`` on top of ``total``."""
    best = BIG
    for d in range(5):
        if req[d] > 0:
            n = (cap[d] - total[d]) // req[d]
            if n < best:
                best = n
    return best


def node_room(node: NodeState, req: Vec, ext: Extended) -> int:
    """How many more pods of ``req`` (and ``ext`` extended resources) ``node`` holds."""
    best = room(node.free, _ZERO, req)
    for name, n in ext:
        left = node.ext.get(name, 0) // n
        if left < best:
            best = left
    return best


def take_from_node(node: NodeState, req: Vec, ext: Extended, k: int) -> None:
    node.free = plus(node.free, req, -k)
    for name, n in ext:
        node.ext[name] = node.ext.get(name, 0) - k * n


def plus(total: Vec, req: Vec, k: int) -> Vec:
    return (
        total[0] + k * req[0],
        total[1] + k * req[1],
        total[2] + k * req[2],
        total[3] + k * req[3],
        total[4] + k * req[4],
    )
