from spotwright.model import labels as wk
from spotwright.model.objects import NodeSelectorRequirement as R
from spotwright.model.objects import Pod
from spotwright.scheduling import Requirements, pod_requirements


def test_in_notin_intersect() -> None:
    a = Requirements.from_terms([R("k", "In", ("a", "b", "c"))])
    b = Requirements.from_terms([R("k", "NotIn", ("b",))])
    both = a.intersect(b)
    assert both.allowed("k") == frozenset({"a", "c"})
    assert both.matches({"k": "a"}) and not both.matches({"k": "b"})
    assert not both.matches({})


def test_exists_and_does_not_exist() -> None:
    exists = Requirements.from_terms([R("k", "Exists")])
    absent = Requirements.from_terms([R("k", "DoesNotExist")])
    assert exists.matches({"k": "x"}) and not exists.matches({})
    assert absent.matches({}) and not absent.matches({"k": "x"})
    assert not exists.intersect(absent)["k"].satisfiable()


def test_gt_lt_bounds() -> None:
    reqs = Requirements.from_terms(
        [R(wk.INSTANCE_CPU, "Gt", ("3",)), R(wk.INSTANCE_CPU, "Lt", ("9",))]
    )
    assert reqs.matches({wk.INSTANCE_CPU: "4"}) and reqs.matches({wk.INSTANCE_CPU: "8"})
    assert not reqs.matches({wk.INSTANCE_CPU: "3"}) and not reqs.matches({wk.INSTANCE_CPU: "9"})
    assert not reqs.matches({wk.INSTANCE_CPU: "x"})
    narrow = reqs.intersect(Requirements.from_terms([R(wk.INSTANCE_CPU, "In", ("2", "4", "16"))]))
    assert narrow.allowed(wk.INSTANCE_CPU) == frozenset({"4"})
    empty = Requirements.from_terms([R("n", "Gt", ("5",)), R("n", "Lt", ("6",))])
    assert not empty["n"].satisfiable()


def test_compatible_karpenter_semantics() -> None:
    pool = Requirements.from_terms([R(wk.CAPACITY_TYPE, "In", ("spot",))])
    assert not pool.compatible(Requirements.from_labels({wk.CAPACITY_TYPE: "on-demand"}))
    assert pool.compatible(Requirements.from_labels({wk.CAPACITY_TYPE: "spot"}))
    # a well-known key the pool leaves out is decided by the instance type: allowed
    assert pool.compatible(Requirements.from_labels({wk.ZONE: "z-a"}))
    # a custom label the pool does not set will be missing on the node
    assert not pool.compatible(Requirements.from_labels({"team": "a"}))
    assert pool.compatible(Requirements.from_terms([R("team", "NotIn", ("a",))]))
    labelled = pool.intersect(Requirements.from_labels({"team": "a"}))
    assert labelled.compatible(Requirements.from_labels({"team": "a"}))
    assert (
        pool.conflict(Requirements.from_labels({wk.CAPACITY_TYPE: "on-demand"})) == wk.CAPACITY_TYPE
    )


def test_aliases_are_normalised() -> None:
    reqs = Requirements.from_labels({"failure-domain.beta.kubernetes.io/zone": "z-a"})
    assert reqs.allowed(wk.ZONE) == frozenset({"z-a"})
    assert reqs.matches({wk.ZONE: "z-a"})
    assert Requirements.from_labels({wk.ZONE: "z-a"}).matches(
        {"failure-domain.beta.kubernetes.io/zone": "z-a"}
    )


def test_hashable_equal_and_readable() -> None:
    a = Requirements.from_terms([R("k", "In", ("b", "a"))])
    b = Requirements.from_terms([R("k", "In", ("a", "b"))])
    assert a == b and hash(a) == hash(b)
    assert str(a) == "k In [a, b]"
    assert Requirements.from_terms(a.to_terms()) == a


def test_pod_requirements_or_terms() -> None:
    p = Pod(
        name="p",
        node_selector={wk.ARCH: "amd64"},
        required_affinity=((R(wk.ZONE, "In", ("z-a",)),), (R(wk.ZONE, "In", ("z-b",)),)),
    )
    terms = pod_requirements(p)
    assert len(terms) == 2
    assert all(t.allowed(wk.ARCH) == frozenset({"amd64"}) for t in terms)
    assert [t.allowed(wk.ZONE) for t in terms] == [frozenset({"z-a"}), frozenset({"z-b"})]
