"""A cluster that grows a few pods at a time must cost close to what its demand needs.

The one-batch benchmark cannot see a packer that fills each small batch onto its own
exactly-fitting node: one such change made the packings of Karpenter's mix cheaper and
the bundled 100-node day 20 % dearer with half again as many nodes. Here demand grows
every ten minutes for two hours and the run's cost is held against the lower bound
``scenario_bound`` computes from the scenario alone (configuration-LP bound per stretch
of constant demand, every spot pool at the bottom of the market's price spread).

Why 1.35: the bound prices every pool at 0.85 of its savings-implied price while the
market draws each zone's factor from 0.85 to 1.15, which alone can put the cheapest
real offering up to about 1.18 times above it; the packer stays within 1.10 of the LP
bound on one batch (``bench scheduling``); nodes are also paid while they boot and
before pods arrive. 1.18 x 1.10 is about 1.30, and 1.35 leaves room for the boot time.
The regression above measured 1.49 on this scenario, and the packer before it 1.19.
"""

from __future__ import annotations

from pathlib import Path

from spotwright.benchmarks.incremental import demand_segments, scenario_bound
from spotwright.catalog import load_catalog
from spotwright.model.scenario import load_scenario
from spotwright.observability.logs import configure_logging
from spotwright.simulation import simulate

_GROWING = """\
apiVersion: spotwright.io/v1alpha1
kind: Scenario
metadata:
  name: growing-cluster
  description: Demand arriving a few pods at a time on a pool of up to 8-vCPU types
spec:
  duration: 3h
  seed: 11
  nodePools:
    - apiVersion: karpenter.sh/v1
      kind: NodePool
      metadata:
        name: general
      spec:
        template:
          spec:
            requirements:
              - key: karpenter.k8s.aws/instance-category
                operator: In
                values: [c, m, r]
              - key: karpenter.k8s.aws/instance-generation
                operator: Gte
                values: ["5"]
              - key: karpenter.k8s.aws/instance-cpu
                operator: Lte
                values: ["8"]
              - key: karpenter.sh/capacity-type
                operator: In
                values: [spot]
        disruption:
          consolidationPolicy: WhenEmpty
          consolidateAfter: 10m
  workloads:
    - name: web
      replicas: 6
      requests: {cpu: "1", memory: 2Gi}
    - name: api
      replicas: 3
      requests: {cpu: "2", memory: 4Gi}
    - name: worker
      replicas: 2
      requests: {cpu: "3", memory: 6Gi}
    - name: cache
      replicas: 1
      requests: {cpu: 500m, memory: 12Gi}
  market:
    interruptions: none
  events:
    - at: 10m
      scale: {workload: web, replicas: 10}
    - at: 10m
      scale: {workload: api, replicas: 5}
    - at: 20m
      scale: {workload: web, replicas: 14}
    - at: 20m
      scale: {workload: api, replicas: 7}
    - at: 20m
      scale: {workload: worker, replicas: 3}
    - at: 20m
      scale: {workload: cache, replicas: 2}
    - at: 30m
      scale: {workload: web, replicas: 18}
    - at: 30m
      scale: {workload: api, replicas: 9}
    - at: 40m
      scale: {workload: web, replicas: 22}
    - at: 40m
      scale: {workload: api, replicas: 11}
    - at: 40m
      scale: {workload: worker, replicas: 4}
    - at: 40m
      scale: {workload: cache, replicas: 3}
    - at: 50m
      scale: {workload: web, replicas: 26}
    - at: 50m
      scale: {workload: api, replicas: 13}
    - at: 60m
      scale: {workload: web, replicas: 30}
    - at: 60m
      scale: {workload: api, replicas: 15}
    - at: 60m
      scale: {workload: worker, replicas: 5}
    - at: 60m
      scale: {workload: cache, replicas: 4}
    - at: 70m
      scale: {workload: web, replicas: 34}
    - at: 70m
      scale: {workload: api, replicas: 17}
    - at: 80m
      scale: {workload: web, replicas: 38}
    - at: 80m
      scale: {workload: api, replicas: 19}
    - at: 80m
      scale: {workload: worker, replicas: 6}
    - at: 80m
      scale: {workload: cache, replicas: 5}
    - at: 90m
      scale: {workload: web, replicas: 42}
    - at: 90m
      scale: {workload: api, replicas: 21}
    - at: 100m
      scale: {workload: web, replicas: 46}
    - at: 100m
      scale: {workload: api, replicas: 23}
    - at: 100m
      scale: {workload: worker, replicas: 7}
    - at: 100m
      scale: {workload: cache, replicas: 6}
    - at: 110m
      scale: {workload: web, replicas: 50}
    - at: 110m
      scale: {workload: api, replicas: 25}
    - at: 120m
      scale: {workload: web, replicas: 54}
    - at: 120m
      scale: {workload: api, replicas: 27}
    - at: 120m
      scale: {workload: worker, replicas: 8}
    - at: 120m
      scale: {workload: cache, replicas: 7}
"""


def test_growing_cluster_costs_within_a_third_of_the_demand_bound(tmp_path: Path) -> None:
    configure_logging(sink=lambda _line: None)
    path = tmp_path / "growing.yaml"
    path.write_text(_GROWING)
    catalog = load_catalog()
    scenario = load_scenario(path, catalog)
    summary = simulate(scenario, catalog)
    bound = scenario_bound(scenario, list(catalog.types))
    cost = summary["cost"]["total_usd"]
    assert summary["pods"]["lost"] == 0
    assert bound > 0
    assert cost <= 1.35 * bound, (cost, bound, summary["nodes"])


def test_demand_segments_follow_scale_events(tmp_path: Path) -> None:
    path = tmp_path / "growing.yaml"
    path.write_text(_GROWING)
    scenario = load_scenario(path, load_catalog())
    segments = demand_segments(scenario)
    assert segments[0] == (0.0, 600.0, {"web": 6, "api": 3, "worker": 2, "cache": 1})
    assert segments[-1][1] == scenario.duration
    assert segments[-1][2] == {"web": 54, "api": 27, "worker": 8, "cache": 7}
