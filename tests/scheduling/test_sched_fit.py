from sched_fixtures import GIB, pod

from spotwright.model import labels as wk
from spotwright.model.objects import Taint, Toleration
from spotwright.model.resources import Resources
from spotwright.scheduling import node_fit, tolerates

FREE = Resources(cpu=2000, memory=4 * GIB, pods=10)


def test_tolerates() -> None:
    taint = Taint("dedicated", "NoSchedule", "gpu")
    assert tolerates((), [taint]) == taint
    assert tolerates((Toleration("dedicated", "Equal", "gpu"),), [taint]) is None
    assert tolerates((Toleration("dedicated", "Equal", "cpu"),), [taint]) == taint
    assert tolerates((Toleration("dedicated", "Exists"),), [taint]) is None
    assert tolerates((Toleration(operator="Exists"),), [taint]) is None
    assert tolerates((Toleration("dedicated", "Exists", effect="NoExecute"),), [taint]) == taint
    assert tolerates((), [Taint("soft", "PreferNoSchedule")]) is None


def test_node_fit_reasons() -> None:
    p = pod("p", cpu=500, mem_gib=1)
    assert node_fit(p, labels={}, taints=[], unschedulable=False, free=FREE) is None
    assert (
        node_fit(p, labels={}, taints=[], unschedulable=True, free=FREE) == "node is unschedulable"
    )
    big = pod("big", cpu=4000)
    assert node_fit(big, labels={}, taints=[], unschedulable=False, free=FREE) == "Insufficient cpu"
    assert (
        node_fit(p, labels={}, taints=[], unschedulable=False, free=Resources(4000, 8 * GIB, 0, 0))
        == "Too many pods"
    )
    reason = node_fit(
        p, labels={}, taints=[Taint("k", "NoSchedule", "v")], unschedulable=False, free=FREE
    )
    assert reason == "node(s) had untolerated taint {k: v}"
    sel = pod("sel", node_selector={wk.ARCH: "arm64"})
    assert (
        node_fit(sel, labels={wk.ARCH: "amd64"}, taints=[], unschedulable=False, free=FREE)
        == "node(s) didn't match Pod's node affinity/selector"
    )
    gpu = pod("gpu", gpu=1)
    assert node_fit(gpu, labels={}, taints=[], unschedulable=False, free=FREE) == (
        "Insufficient nvidia.com/gpu"
    )
