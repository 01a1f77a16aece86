"""EC2NodeClasses for the live controller, watched as custom resources.

A NodePool names its node class; the EC2 cloud looks the class up by that name at every
launch and every scheduling round, so an informer's current view is all it needs to follow
edits (a changed selector is resolved afresh, its hash being part of the cache key). A
class that fails validation (the CRD's schema cannot express every rule, such as amiFamily
being required without an alias) is logged and kept as the text of its problems: a NodePool
naming it then keeps its pods pending with that reason instead of stopping the controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spotwright.adapters.kube.client import NODECLASSES, Api
from spotwright.adapters.kube.informer import Informer
from spotwright.model.errors import ScenarioError
from spotwright.model.nodeclass import EC2NodeClass, parse_nodeclass
from spotwright.observability.logs import get_logger

__all__ = ["LiveNodeClasses"]

log = get_logger("kube.nodeclasses")


def _nodeclass(obj: Mapping[str, Any]) -> EC2NodeClass | str:
    name = (obj.get("metadata") or {}).get("name")
    try:
        return parse_nodeclass(dict(obj), source=f"ec2nodeclass/{name}")
    except ScenarioError as exc:
        log.warning("invalid EC2NodeClass", nodeclass=name, problems=str(exc))
        return f"invalid: {exc}"


class LiveNodeClasses:
    """The cluster's EC2NodeClasses by name, kept current by an informer."""

    def __init__(self, api: Api) -> None:
        self.informer: Informer[EC2NodeClass | str] = Informer(api, NODECLASSES, _nodeclass)

    def get(self, name: str) -> EC2NodeClass | str | None:
        """The class named ``name`` as the cluster has it now; why it is invalid, if it is;
        None if there is none."""
        return self.informer.items.get(name)
