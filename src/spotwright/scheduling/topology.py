"""Topology spread and pod (anti-)affinity: counting pods per domain and narrowing claims.

A domain is a value of a topology key: a zone, a capacity type, or a node (hostname). A
``Counter`` tracks how many pods matching one label selector sit in each domain. Each
constraint of a pod reads one counter; every placed pod bumps the counters whose
selector it matches. For zone-like keys a claim whose requirements still allow several
domains is narrowed to one (the least loaded for spread, the most loaded for affinity),
as Karpenter does, so the count stays exact. For hostname every claim is its own domain,
and a new claim always counts zero, so a hostname spread of ``maxSkew`` means at most
``maxSkew`` matching pods per node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from spotwright.model import labels as wk
from spotwright.model.objects import LabelSelector, Pod, PodAffinityTerm
from spotwright.scheduling.requirements import Requirements, canonical_key

__all__ = ["Constraint", "Counter", "PodTopology", "Topology", "selector_matches"]


def selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    for key, wanted in selector.match_labels:
        if labels.get(key) != wanted:
            return False
    for expr in selector.match_expressions:
        value = labels.get(expr.key)
        op = expr.operator
        if op == "In":
            if value is None or value not in expr.values:
                return False
        elif op == "NotIn":
            if value is not None and value in expr.values:
                return False
        elif op == "Exists":
            if value is None:
                return False
        elif op == "DoesNotExist":
            if value is not None:
                return False
        else:
            return False
    return True


CounterKey = tuple[str, LabelSelector, frozenset[str]]


class Counter:
    """Pods matching ``selector`` (in ``namespaces``) per domain of ``key``."""

    __slots__ = ("counts", "key", "namespaces", "selector", "total")

    def __init__(self, key: str, selector: LabelSelector, namespaces: frozenset[str]) -> None:
        self.key = key
        self.selector = selector
        self.namespaces = namespaces
        self.counts: dict[str, int] = {}
        self.total = 0

    def matches(self, pod: Pod) -> bool:
        return pod.namespace in self.namespaces and selector_matches(self.selector, pod.labels)

    def add(self, domain: str, count: int = 1) -> None:
        self.counts[domain] = self.counts.get(domain, 0) + count
        self.total += count


@dataclass(frozen=True, slots=True)
class Constraint:
    kind: str  # "spread", "affinity" or "anti"
    key: str
    counter: Counter
    max_skew: int = 1
    min_domains: int | None = None
    self_match: bool = False


def _term_key(pod: Pod, term: PodAffinityTerm) -> CounterKey:
    return (
        canonical_key(term.topology_key),
        term.selector,
        frozenset(term.namespaces or (pod.namespace,)),
    )


class Topology:
    """Every counter of one scheduling round, seeded with the pods already bound."""

    def __init__(
        self,
        existing: Iterable[tuple[str, Mapping[str, str], Iterable[Pod]]],
        universe: Callable[[str], frozenset[str]],
    ) -> None:
        self._existing = [(host, labels, list(pods)) for host, labels, pods in existing]
        self._universe_fn = universe
        self._universe: dict[str, frozenset[str]] = {}
        self.counters: dict[CounterKey, Counter] = {}
        self.owners: dict[CounterKey, Counter] = {}
        for host, labels, pods in self._existing:
            for pod in pods:
                for term in pod.pod_anti_affinity:
                    owner = self._get(self.owners, _term_key(pod, term))
                    domain = self.domain_of(owner.key, host, labels)
                    if domain is not None:
                        owner.add(domain)

    @staticmethod
    def domain_of(key: str, host: str, labels: Mapping[str, str]) -> str | None:
        return host if key == wk.HOSTNAME else labels.get(key)

    def universe(self, key: str) -> frozenset[str]:
        found = self._universe.get(key)
        if found is None:
            values = set(self._universe_fn(key))
            for host, labels, _ in self._existing:
                value = self.domain_of(key, host, labels)
                if value is not None and key != wk.HOSTNAME:
                    values.add(value)
            found = self._universe[key] = frozenset(values)
        return found

    def _get(self, table: dict[CounterKey, Counter], key: CounterKey) -> Counter:
        counter = table.get(key)
        if counter is None:
            counter = table[key] = Counter(*key)
            for host, labels, pods in self._existing:
                domain = self.domain_of(counter.key, host, labels)
                if domain is None:
                    continue
                matched = sum(1 for p in pods if counter.matches(p))
                if matched:
                    counter.add(domain, matched)
        return counter

    # -- per pod group -------------------------------------------------------------------
    def register(self, pod: Pod) -> None:
        """Create the counters ``pod``'s terms read (before any group is profiled)."""
        for spread in pod.topology_spread:
            self._get(self.counters, self._spread_key(pod, spread.topology_key, spread.selector))
        for term in (*pod.pod_affinity, *(w.term for w in pod.preferred_pod_affinity)):
            self._get(self.counters, _term_key(pod, term))
        for term in (*pod.pod_anti_affinity, *(w.term for w in pod.preferred_pod_anti_affinity)):
            self._get(self.counters, _term_key(pod, term))
        for term in pod.pod_anti_affinity:  # only required terms repel other pods
            self._get(self.owners, _term_key(pod, term))

    @staticmethod
    def _spread_key(pod: Pod, key: str, selector: LabelSelector) -> CounterKey:
        return (canonical_key(key), selector, frozenset((pod.namespace,)))

    def records(self, pod: Pod) -> list[Counter]:
        """Counters a placed pod like ``pod`` increments."""
        return [c for c in self.counters.values() if c.matches(pod)]

    def inverse(self, pod: Pod) -> list[Counter]:
        """Anti-affinity owners whose terms select ``pod``: their domains are closed to it."""
        return [c for c in self.owners.values() if c.matches(pod)]

    def constraints(
        self,
        pod: Pod,
        spreads: Iterable[tuple[str, LabelSelector, int, int | None]],
        affinity: Iterable[PodAffinityTerm],
        anti: Iterable[PodAffinityTerm],
    ) -> tuple[list[Constraint], list[Counter]]:
        """The constraints of one variant, and the owner counters its placement bumps."""
        out: list[Constraint] = []
        for key, selector, skew, min_domains in spreads:
            counter = self._get(self.counters, self._spread_key(pod, key, selector))
            out.append(Constraint("spread", counter.key, counter, skew, min_domains))
        for term in affinity:
            counter = self._get(self.counters, _term_key(pod, term))
            out.append(
                Constraint("affinity", counter.key, counter, self_match=counter.matches(pod))
            )
        owners: list[Counter] = []
        for term in anti:
            term_key = _term_key(pod, term)
            counter = self._get(self.counters, term_key)
            out.append(Constraint("anti", counter.key, counter))
            if term in pod.pod_anti_affinity:
                owners.append(self._get(self.owners, term_key))
        return out, owners


def _least(counts: dict[str, int]) -> Callable[[str], tuple[int, str]]:
    def order(domain: str) -> tuple[int, str]:
        return (counts.get(domain, 0), domain)

    return order


def _most(counts: dict[str, int]) -> Callable[[str], tuple[int, str]]:
    def order(domain: str) -> tuple[int, str]:
        return (-counts.get(domain, 0), domain)

    return order


class PodTopology:
    """The domains open to one pod right now, given the counts so far."""

    __slots__ = ("allowed", "host_rules", "inverse_host", "monotone", "order")

    def __init__(
        self,
        topology: Topology,
        constraints: list[Constraint],
        inverse: list[Counter],
        reqs: Requirements,
    ) -> None:
        self.allowed: dict[str, set[str]] = {}
        self.order: dict[str, Callable[[str], tuple[int, str]]] = {}
        self.host_rules: list[Constraint] = []
        self.inverse_host: list[Counter] = []
        self.monotone = True
        for c in constraints:
            if c.key == wk.HOSTNAME:
                self.host_rules.append(c)
                if c.kind == "affinity":
                    self.monotone = False
                continue
            universe = topology.universe(c.key)
            req = reqs.get(c.key)
            eligible = {d for d in universe if req is None or req.allows(d)}
            counts = c.counter.counts
            if c.kind == "spread":
                low = min((counts.get(d, 0) for d in eligible), default=0)
                if c.min_domains is not None and len(eligible) < c.min_domains:
                    low = 0
                ok = {d for d in eligible if counts.get(d, 0) + 1 - low <= c.max_skew}
                self.order[c.key] = _least(counts)
            elif c.kind == "affinity":
                if c.counter.total > 0:
                    ok = {d for d in eligible if counts.get(d, 0) > 0}
                else:
                    ok = eligible if c.self_match else set()
                self.order.setdefault(c.key, _most(counts))
            else:
                ok = {d for d in eligible if counts.get(d, 0) == 0}
            self._narrow(c.key, ok)
        for owner in inverse:
            if not owner.total:
                continue
            if owner.key == wk.HOSTNAME:
                self.inverse_host.append(owner)
                continue
            closed = {d for d, n in owner.counts.items() if n > 0}
            base = self.allowed.get(owner.key)
            if base is None:
                base = set(topology.universe(owner.key))
            self.allowed[owner.key] = base - closed

    def _narrow(self, key: str, ok: set[str]) -> None:
        current = self.allowed.get(key)
        self.allowed[key] = ok if current is None else current & ok

    @property
    def impossible(self) -> bool:
        return any(not ok for ok in self.allowed.values())

    def host_ok(self, host: str) -> bool:
        for c in self.host_rules:
            have = c.counter.counts.get(host, 0)
            if c.kind == "spread":
                if have + 1 > c.max_skew:
                    return False
            elif c.kind == "affinity":
                if have == 0 and not (c.counter.total == 0 and c.self_match):
                    return False
            elif have:
                return False
        return all(not owner.counts.get(host) for owner in self.inverse_host)

    def node_ok(self, host: str, labels: Mapping[str, str]) -> bool:
        for key, ok in self.allowed.items():
            value = labels.get(key)
            if value is None:
                # a node without the key is outside every domain: fine for anti-affinity
                # alone, but spread and affinity need it to be in one.
                if key in self.order:
                    return False
                continue
            if value not in ok:
                return False
        return self.host_ok(host)

    def choose(self, host: str, possible: Callable[[str], frozenset[str]]) -> dict[str, str] | None:
        """The domain per zone-like key a claim must be narrowed to, or None if none fits."""
        if not self.host_ok(host):
            return None
        chosen: dict[str, str] = {}
        for key, ok in self.allowed.items():
            options = ok & possible(key)
            if not options:
                return None
            order = self.order.get(key)
            chosen[key] = min(options, key=order) if order else min(options)
        return chosen
