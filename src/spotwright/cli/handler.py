"""``spotwright handler``: IMDS mode, one process per node (a DaemonSet), wiring only.

The pieces live elsewhere: ``events.imds_source`` polls this instance's metadata,
``controllers.node_handler`` acts on this node, ``observability.exporter`` keeps the
spot-termination-exporter gauges and ``observability.webhook`` reports each step. This
module builds them from the options, serves one ``/metrics`` endpoint for all of them, and
runs until SIGTERM. ``HandlerService`` takes any Cluster, so tests run the whole wiring
against the in-memory cluster and a real ``imds-mock``; the command gives it the live one,
scoped to this node (its Node and its pods, watched with field selectors; see
``adapters.kube.scope``), so a DaemonSet of handlers never caches the cluster once per node.

Every ``spotwright`` command imports this module for its options, so the parts that pull in
aiohttp (a noticeable part of a second) are imported when the handler actually starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import yaml
from pydantic import ValidationError

from spotwright.catalog import InstanceType
from spotwright.cli._errors import UserError
from spotwright.controllers.context import Context, Settings
from spotwright.events._common import is_instance_id
from spotwright.events.actions import ActionPolicy
from spotwright.model import labels as wk
from spotwright.model.durations import parse_duration
from spotwright.model.errors import ScenarioError, problems_from_validation
from spotwright.observability.logs import configure_logging, get_logger
from spotwright.observability.metrics import Metrics
from spotwright.ports.clock import LoopClock
from spotwright.ports.cloud import CloudError, Instance, LaunchRequest, Offering
from spotwright.ports.cluster import Cluster

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from spotwright.controllers.node_handler import CapacityView
    from spotwright.events.imds_source import ImdsPoller, PollerSettings
    from spotwright.observability.webhook import WebhookReporter, WebhookTemplate

__all__ = ["HandlerOptions", "HandlerService", "NoCloud", "handler_command"]

log = get_logger("handler")


class NoCloud:
    """The handler's cloud port: it never launches or ends instances, so every call refuses.

    Replacement capacity is the provisioner's business (spotwright's or Karpenter's), and
    EC2 ends the instance by itself; a handler that tried either would be a bug.
    """

    region = ""

    def instance_types(self) -> Sequence[InstanceType]:
        return []

    def offerings(self) -> Sequence[Offering]:
        return []

    async def launch(self, request: LaunchRequest) -> Instance:
        raise CloudError("Unsupported", "the IMDS-mode handler does not launch instances")

    async def terminate(self, instance_id: str) -> None:
        raise CloudError("Unsupported", "the IMDS-mode handler does not terminate instances")

    async def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        return []

    async def list_owned(self) -> list[Instance]:
        return []


@dataclass(frozen=True)
class HandlerOptions:
    node_name: str
    imds: PollerSettings
    policy: ActionPolicy
    replacement_wait: float = 600.0
    webhook_url: str | None = None
    webhook_template: WebhookTemplate | None = None
    metrics_host: str = "0.0.0.0"  # a DaemonSet pod is scraped from outside
    #: None: no endpoint; 0: any free port (tests read ``HandlerService.metrics_port``).
    metrics_port: int | None = 9189


class HandlerService:
    """The poller, the node handler, the metrics endpoint and the webhook, for one node."""

    def __init__(
        self,
        options: HandlerOptions,
        cluster: Cluster,
        *,
        capacity_view: CapacityView | None = None,
    ) -> None:
        """``capacity_view``: how a node-scoped cluster shows the cluster's Nodes and
        NodeClaims while a replace-then-drain waits (``KubeCluster.capacity_view``)."""
        from spotwright.events.imds_source import ImdsClient

        self.options = options
        self.cluster = cluster
        self.capacity_view = capacity_view
        self.metrics = Metrics()
        self.client = ImdsClient(options.imds)
        self.poller: ImdsPoller | None = None
        self.reporter: WebhookReporter | None = None
        self.metrics_port: int | None = None
        self._server: WSGIServer | None = None
        self._stop = asyncio.Event()

    async def start(self) -> bool:
        """Learn which instance this is, then open the metrics endpoint.

        False if ``stop()`` came first (IMDS had not answered yet): nothing was started.
        """
        from prometheus_client import start_http_server

        from spotwright.events.imds_source import ImdsPoller
        from spotwright.observability.exporter import TerminationExporter
        from spotwright.observability.webhook import WebhookReporter

        options = self.options
        identity = await self._identity()
        if identity is None:
            return False
        instance_id, instance_type = identity
        exporter = TerminationExporter(
            instance_id=instance_id, instance_type=instance_type, registry=self.metrics.registry
        )
        self.poller = ImdsPoller(
            options.imds,
            instance_id=instance_id,
            node=options.node_name,
            exporter=exporter,
            client=self.client,
            registry=self.metrics.registry,
        )
        if options.webhook_url:
            self.reporter = WebhookReporter(
                options.webhook_url, options.webhook_template, registry=self.metrics.registry
            )
        if options.metrics_port is not None:
            server, _ = start_http_server(
                options.metrics_port, addr=options.metrics_host, registry=self.metrics.registry
            )
            self._server = server
            self.metrics_port = server.server_port
        log.info(
            "handler started",
            node=options.node_name,
            instance_id=instance_id,
            instance_type=instance_type or "<unknown>",
            imds=options.imds.url,
            metrics_port=self.metrics_port,
        )
        return True

    async def _identity(self) -> tuple[str, str] | None:
        """From the Node's providerID when it has one; else asked of IMDS until it answers.

        A handler started before IMDS is reachable waits rather than exits: restarting
        would not make IMDS answer sooner, and a crash-looping pod hides the real cause.
        """
        from spotwright.events.imds_source import ImdsError, read_identity

        node = self.cluster.node(self.options.node_name)
        from_node = node.provider_id.rsplit("/", 1)[-1] if node is not None else ""
        if node is not None and is_instance_id(from_node):
            return from_node, node.labels.get(wk.INSTANCE_TYPE, "")
        delay = self.options.imds.poll_interval
        while True:
            try:
                return await read_identity(self.client)
            except ImdsError as exc:
                log.warning("cannot read the instance identity yet", error=str(exc), retry_in=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            if self._stop.is_set():
                return None
            delay = min(self.options.imds.backoff_max, delay * 2)

    async def run(self) -> None:
        """Poll and act until ``stop()``; the actions under way are then cancelled."""
        from spotwright.controllers.node_handler import NodeHandler

        poller = self.poller
        if poller is None:
            raise RuntimeError("HandlerService.start() first")
        settings = Settings(replacement_wait_seconds=self.options.replacement_wait)
        ctx = Context(
            cluster=self.cluster,
            cloud=NoCloud(),
            clock=LoopClock(),
            metrics=self.metrics,
            nodepools=[],
            instance_types={},
            settings=settings,
        )
        listeners = [self.reporter] if self.reporter is not None else []
        handler = NodeHandler(
            ctx,
            self.options.node_name,
            policy=self.options.policy,
            listeners=listeners,
            capacity_view=self.capacity_view,
        )
        stopping = asyncio.create_task(self._stop.wait())
        try:
            while not self._stop.is_set():
                work = asyncio.create_task(
                    handler.run(poller.events(), on_failure=lambda event: poller.forget(event.id))
                )
                await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not work.done():
                    work.cancel()
                    await asyncio.gather(work, return_exceptions=True)
                elif work.exception() is not None:  # a bug: log it, and keep handling
                    failure = work.exception()
                    log.error("handler loop failed, restarting it", error=repr(failure))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(stopping), poller.next_delay())
        finally:
            poller.stop()
            stopping.cancel()

    def stop(self) -> None:
        self._stop.set()

    async def aclose(self) -> None:
        if self.reporter is not None:
            await self.reporter.flush(timeout=5.0)
            await self.reporter.aclose()
        await self.client.aclose()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def load_policy(path: Path | None) -> ActionPolicy:
    """The action policy file (``rebalanceRecommendation: cordon``...), or the defaults."""
    if path is None:
        return ActionPolicy()
    try:
        data: Any = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"{path}: cannot read the policy: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of policy settings")
    try:
        return ActionPolicy.model_validate(data)
    except ValidationError as exc:
        problems = problems_from_validation(exc, data, ActionPolicy)
        raise UserError(str(ScenarioError(str(path), problems))) from None


def _seconds(option: str, text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise UserError(f"{option}: {exc}") from None


@click.command("handler")
@click.option("--node-name", envvar="NODE_NAME", required=True, help="This node ($NODE_NAME).")
@click.option(
    "--kubeconfig",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Kubeconfig file (default: in-cluster service account, else $KUBECONFIG).",
)
@click.option(
    "--imds-url",
    default="http://169.254.169.254",
    show_default=True,
    help="Instance metadata service (an imds-mock to test).",
)
@click.option("--poll-interval", default="2s", show_default=True, help="Time between polls.")
@click.option("--imdsv1-fallback", is_flag=True, help="Use IMDSv1 if tokens are refused.")
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="YAML action policy (rebalanceRecommendation, atDeadline, ...).",
)
@click.option(
    "--replacement-wait",
    default="10m",
    show_default=True,
    help="replace-then-drain: drain anyway after this long without the replacement.",
)
@click.option("--webhook-url", default=None, help="POST a report of every step here.")
@click.option(
    "--webhook-template",
    type=click.Path(path_type=Path, dir_okay=False),
    help="JSON body with ${field} placeholders (default: a Slack-style text).",
)
@click.option("--metrics-host", default="0.0.0.0", show_default=True, help="/metrics address.")
@click.option("--metrics-port", type=int, default=9189, show_default=True, help="0: off.")
@click.option("--kube-qps", type=float, default=20.0, show_default=True, help="API rate limit.")
@click.option("--kube-burst", type=int, default=40, show_default=True)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text")
@click.option(
    "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info"
)
def handler_command(
    node_name: str,
    kubeconfig: Path | None,
    imds_url: str,
    poll_interval: str,
    imdsv1_fallback: bool,
    policy_file: Path | None,
    replacement_wait: str,
    webhook_url: str | None,
    webhook_template: Path | None,
    metrics_host: str,
    metrics_port: int,
    kube_qps: float,
    kube_burst: int,
    log_format: str,
    log_level: str,
) -> None:
    """Handle this node's interruption notices from instance metadata (IMDS mode)."""
    from spotwright.events.imds_source import PollerSettings
    from spotwright.observability.webhook import WebhookTemplate

    configure_logging(fmt="json" if log_format == "json" else "text", level=log_level)
    interval = _seconds("--poll-interval", poll_interval)
    try:
        imds = PollerSettings(
            url=imds_url,
            poll_interval=interval,
            backoff_max=max(30.0, interval),
            imdsv1_fallback=imdsv1_fallback,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    template = None
    if webhook_template is not None:
        if webhook_url is None:
            raise UserError("--webhook-template needs --webhook-url")
        try:
            template = WebhookTemplate(webhook_template.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"{webhook_template}: {exc}") from None
    options = HandlerOptions(
        node_name=node_name,
        imds=imds,
        policy=load_policy(policy_file),
        replacement_wait=_seconds("--replacement-wait", replacement_wait),
        webhook_url=webhook_url,
        webhook_template=template,
        metrics_host=metrics_host,
        metrics_port=metrics_port or None,
    )
    raise SystemExit(asyncio.run(_main(options, kubeconfig, kube_qps, kube_burst)))


async def _main(options: HandlerOptions, kubeconfig: Path | None, qps: float, burst: int) -> int:
    from spotwright.adapters.kube.client import Api, connect
    from spotwright.adapters.kube.cluster import KubeCluster
    from spotwright.adapters.kube.scope import CacheScope

    try:
        client = connect(kubeconfig)
    except Exception as exc:  # lightkube raises several kinds for a missing config
        raise UserError(
            f"the handler needs --kubeconfig / in-cluster config to reach the API server "
            f"({type(exc).__name__}: {exc})"
        ) from None
    api = Api(client, qps=qps, burst=burst)
    cluster = KubeCluster(
        api,
        identity=f"spotwright-handler/{options.node_name}",
        scope=CacheScope.one_node(options.node_name),
    )
    service = HandlerService(options, cluster, capacity_view=cluster.capacity_view)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stop)
    try:
        try:
            await cluster.start(timeout=60)
        except TimeoutError:
            log.error(
                "could not list this node and its pods in 60s "
                "(is the API server reachable, and the handler's ClusterRole bound?)",
                node=options.node_name,
            )
            return 1
        if await service.start():
            await service.run()
        log.info("stopping: signal received")
        await cluster.flush_events()
        return 0
    finally:
        with contextlib.suppress(Exception):
            await service.aclose()
        await cluster.close()
        await api.close()
