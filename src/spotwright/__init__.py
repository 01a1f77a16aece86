"""spotwright: run Kubernetes workloads on EC2 Spot capacity.

The public surface is small: load the catalog and a scenario, and simulate it. Everything
else (controllers, ports, adapters) is importable from its own subpackage for those who
embed spotwright, but is not promised to stay put.
"""

from spotwright.catalog import Catalog, InstanceType, load_catalog

__all__ = ["Catalog", "InstanceType", "__version__", "load_catalog"]

__version__ = "0.1.0"
