"""The informer's memory: a list is converted page by page, and only records are kept.

Listing ten thousand pods used to gather every page's API objects (``managedFields``,
status and all) before converting any; the peak was the whole list as decoded JSON. Now
each page is converted as it arrives and then dropped. Shown here with a paged list
served by an in-process transport: when the second page is asked for, the first page's
pods are already in the cache.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
from lightkube import AsyncClient, KubeConfig

from spotwright.adapters.kube.client import PODS, Api
from spotwright.adapters.kube.convert import pod_from_api
from spotwright.adapters.kube.informer import Informer
from spotwright.model.objects import Pod

PAGE = 3


def api_pod(name: str, version: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "web",
            "resourceVersion": str(version),
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}] * 20,
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x" * 4096},
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def test_a_relist_converts_each_page_before_asking_for_the_next() -> None:
    cached_at_page: list[int] = []
    informer: Informer[Pod]

    def serve(request: httpx2.Request) -> httpx2.Response:
        assert request.url.params.get("limit") == "500"
        page = int(request.url.params.get("continue") or 0)
        cached_at_page.append(len(informer.items))
        items = [api_pod(f"p{page}-{i}", 10 * page + i + 1) for i in range(PAGE)]
        meta: dict[str, str] = {"resourceVersion": "99"}
        if page < 2:
            meta["continue"] = str(page + 1)
        body = json.dumps({"kind": "PodList", "items": items, "metadata": meta})
        return httpx2.Response(200, content=body, headers={"Content-Type": "application/json"})

    async def main() -> str:
        nonlocal informer
        config = KubeConfig.from_dict(
            {
                "clusters": [{"name": "c", "cluster": {"server": "https://fake.invalid"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
        api = Api(AsyncClient(config=config, transport=httpx2.MockTransport(serve)))
        informer = Informer(api, PODS, pod_from_api)
        try:
            return await informer.relist()
        finally:
            await api.close()

    version = asyncio.run(main())
    assert cached_at_page == [0, PAGE, 2 * PAGE]  # each page was cached before the next
    assert version == "99" and len(informer.items) == 3 * PAGE
    record = informer.items["web/p0-0"]
    assert record.annotations == {}  # the last-applied copy is not kept
