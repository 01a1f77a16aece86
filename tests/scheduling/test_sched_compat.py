"""EKS and eksctl capacity-type labels: read as Karpenter's, and carried by new nodes.

The ground truth is Kubernetes itself: a new node carries ``karpenter.sh/capacity-type``
and the labels of ``compat_labels``, so a pod's selector, evaluated on those labels the
way kube-scheduler evaluates it, says whether the pod may run there. The scheduler must
agree, both when it matches existing nodes and when it chooses capacity types for new
claims.
"""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st
from sched_fixtures import catalog, offers, pod

from spotwright.model import labels as wk
from spotwright.model.objects import NodeSelectorRequirement, Operator
from spotwright.scheduling import NodePoolTemplate, Requirements, compat_labels, schedule
from spotwright.scheduling.compat import EKS_CAPACITY_TYPE, EKSCTL_LIFECYCLE

CAPACITY_TYPES = (wk.SPOT, wk.ON_DEMAND, wk.RESERVED)
VOCABULARY = {
    wk.CAPACITY_TYPE: (*CAPACITY_TYPES, "bogus"),
    EKS_CAPACITY_TYPE: ("SPOT", "ON_DEMAND", "CAPACITY_BLOCK", "bogus"),
    EKSCTL_LIFECYCLE: ("Ec2Spot", "OnDemand"),
}
TYPES = catalog()


def node_labels(capacity_type: str) -> dict[str, str]:
    return {wk.CAPACITY_TYPE: capacity_type, **compat_labels(capacity_type)}


def kube_matches(term: NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    """kube-scheduler's evaluation of one node selector requirement."""
    value = labels.get(term.key)
    if term.operator == "In":
        return value is not None and value in term.values
    if term.operator == "NotIn":
        return value is None or value not in term.values
    if term.operator == "Exists":
        return value is not None
    assert term.operator == "DoesNotExist"
    return value is None


@st.composite
def terms_st(draw: st.DrawFn) -> NodeSelectorRequirement:
    key = draw(st.sampled_from(sorted(VOCABULARY)))
    operator: Operator = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
    values: tuple[str, ...] = ()
    if operator in ("In", "NotIn"):
        values = tuple(draw(st.sets(st.sampled_from(VOCABULARY[key]), min_size=1)))
    return NodeSelectorRequirement(key, operator, values)


def test_compat_labels() -> None:
    assert compat_labels(wk.SPOT) == {EKS_CAPACITY_TYPE: "SPOT", EKSCTL_LIFECYCLE: "Ec2Spot"}
    assert compat_labels(wk.ON_DEMAND) == {
        EKS_CAPACITY_TYPE: "ON_DEMAND",
        EKSCTL_LIFECYCLE: "OnDemand",
    }
    assert compat_labels(wk.RESERVED) == compat_labels(wk.ON_DEMAND)
    assert compat_labels("nonsense") == {}
    labels = compat_labels(wk.SPOT)
    labels[EKSCTL_LIFECYCLE] = "changed"
    assert compat_labels(wk.SPOT)[EKSCTL_LIFECYCLE] == "Ec2Spot"  # a fresh dict each time


def test_selectors_mean_capacity_types() -> None:
    spot = Requirements.from_labels({wk.CAPACITY_TYPE: wk.SPOT})
    assert Requirements.from_labels({EKS_CAPACITY_TYPE: "SPOT"}) == spot
    assert Requirements.from_labels({EKSCTL_LIFECYCLE: "Ec2Spot"}) == spot
    on_demand = Requirements.from_labels({EKSCTL_LIFECYCLE: "OnDemand"})
    assert on_demand.allowed(wk.CAPACITY_TYPE) == {wk.ON_DEMAND, wk.RESERVED}
    # ``lifecycle`` with values eksctl never uses stays an ordinary label
    custom = Requirements.from_labels({EKSCTL_LIFECYCLE: "stable"})
    assert custom.allowed(EKSCTL_LIFECYCLE) == {"stable"}
    assert wk.CAPACITY_TYPE not in custom


def test_nodes_labelled_only_by_eks_still_match() -> None:
    # an EKS managed node group's node: no karpenter.sh label at all
    eks_node = {EKS_CAPACITY_TYPE: "SPOT"}
    assert Requirements.from_labels({wk.CAPACITY_TYPE: wk.SPOT}).matches(eks_node)
    assert Requirements.from_labels({EKSCTL_LIFECYCLE: "Ec2Spot"}).matches(eks_node)
    assert not Requirements.from_labels({wk.CAPACITY_TYPE: wk.ON_DEMAND}).matches(eks_node)
    eksctl_node = {EKSCTL_LIFECYCLE: "OnDemand"}
    assert Requirements.from_labels({EKS_CAPACITY_TYPE: "ON_DEMAND"}).matches(eksctl_node)


@settings(max_examples=300, deadline=None)
@given(
    terms=st.lists(terms_st(), min_size=1, max_size=3),
    capacity_type=st.sampled_from(CAPACITY_TYPES),
)
def test_existing_nodes_agree_with_kubernetes(
    terms: list[NodeSelectorRequirement], capacity_type: str
) -> None:
    labels = node_labels(capacity_type)
    expected = all(kube_matches(t, labels) for t in terms)
    assert Requirements.from_terms(terms).matches(labels) == expected


@settings(max_examples=100, deadline=None)
@given(terms=st.lists(terms_st(), min_size=1, max_size=2))
def test_new_claims_only_get_capacity_types_the_pod_accepts(
    terms: list[NodeSelectorRequirement],
) -> None:
    offerings = offers(TYPES)  # spot and on-demand in every zone
    p = pod("p", required_affinity=(tuple(terms),))
    plan = schedule([p], [], [NodePoolTemplate("default")], TYPES, offerings)
    allowed = {
        ct for ct in (wk.SPOT, wk.ON_DEMAND) if all(kube_matches(t, node_labels(ct)) for t in terms)
    }
    if not allowed:
        assert p.key in plan.unschedulable
        return
    assert not plan.unschedulable
    (claim,) = plan.new_claims
    chosen = Requirements.from_terms(claim.requirements).allowed(wk.CAPACITY_TYPE)
    assert chosen is not None and chosen <= allowed and chosen
