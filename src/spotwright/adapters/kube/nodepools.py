"""NodePools for the live controller: from files, or watched as custom resources.

The provisioner reads ``Context.nodepools`` afresh every round, so a sequence that
reflects the cluster's ``spotwright.io/v1alpha1`` NodePools as they are now is all it
needs to follow edits without a restart. A NodePool that fails validation is logged and
left out rather than stopping the controller: one bad object must not halt provisioning
for every other pool.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import yaml

from spotwright.adapters.kube.client import NODEPOOLS, Api
from spotwright.adapters.kube.informer import Informer
from spotwright.model.errors import Problem, ScenarioError
from spotwright.model.nodepool import NodePool, parse_nodepool
from spotwright.observability.logs import get_logger

__all__ = ["LiveNodePools", "load_nodepool_files"]

log = get_logger("kube.nodepools")


def load_nodepool_files(paths: Sequence[Path]) -> list[NodePool]:
    """Every NodePool document in the files (other kinds are skipped); raises ScenarioError."""
    pools: list[NodePool] = []
    for path in paths:
        try:
            documents = list(yaml.safe_load_all(path.read_text()))
        except (OSError, yaml.YAMLError) as exc:
            raise ScenarioError(str(path), [Problem("", f"cannot read it: {exc}")]) from exc
        for document in documents:
            if isinstance(document, dict) and document.get("kind") == "NodePool":
                pools.append(parse_nodepool(document, source=str(path)))
    return pools


def _nodepool(obj: Mapping[str, Any]) -> NodePool | None:
    name = (obj.get("metadata") or {}).get("name")
    try:
        return parse_nodepool(dict(obj), source=f"nodepool/{name}")
    except ScenarioError as exc:
        log.warning("ignoring invalid NodePool", nodepool=name, problems=str(exc))
        return None


class LiveNodePools(Sequence[NodePool]):
    """The cluster's NodePools, kept current by an informer, ordered by name."""

    def __init__(self, api: Api) -> None:
        self.informer: Informer[NodePool] = Informer(api, NODEPOOLS, _nodepool)

    def _current(self) -> list[NodePool]:
        return [self.informer.items[k] for k in sorted(self.informer.items)]

    @overload
    def __getitem__(self, index: int) -> NodePool: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[NodePool]: ...

    def __getitem__(self, index: int | slice) -> NodePool | Sequence[NodePool]:
        return self._current()[index]

    def __len__(self) -> int:
        return len(self.informer.items)

    def __iter__(self) -> Iterator[NodePool]:
        return iter(self._current())
