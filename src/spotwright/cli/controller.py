"""``spotwright controller``: the controllers against a real cluster, one leader at a time.

Wiring only. The caches start at once (a standby keeps them warm so it can take over in
seconds); the controllers (provisioner, node-claim lifecycle, termination, garbage
collection, and interruption handling when a queue is given) run only while this replica
holds the leader Lease. A controller that fails (an API error, a lost race) is logged and
started again: what matters is in the API server. Losing the Lease stops them all at once
and the process exits with status 1 for its supervisor to restart it; SIGTERM stops them,
releases the Lease so the standby takes over immediately, and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from prometheus_client import start_http_server

from spotwright.adapters.kube.client import Api, connect
from spotwright.adapters.kube.cluster import KubeCluster
from spotwright.adapters.kube.kwok import KwokCloud
from spotwright.adapters.kube.leader import LeaderElector, LostLeadership, default_identity
from spotwright.adapters.kube.nodeclasses import LiveNodeClasses
from spotwright.adapters.kube.nodepools import LiveNodePools, load_nodepool_files
from spotwright.adapters.kube.scope import CacheScope
from spotwright.adapters.memory_queue import MemoryQueue
from spotwright.catalog import CatalogError, default_zones, load_catalog
from spotwright.cli._errors import UserError
from spotwright.controllers import (
    Context,
    GarbageCollector,
    InterruptionHandler,
    NodeClaimLifecycle,
    NodePoolSource,
    Provisioner,
    Settings,
    Terminator,
)
from spotwright.controllers.nodegroups import NodeGroupController
from spotwright.model.errors import ScenarioError
from spotwright.model.nodegroup import load_nodegroup_files
from spotwright.observability.logs import configure_logging, get_logger
from spotwright.observability.metrics import Metrics
from spotwright.ports.clock import LoopClock
from spotwright.ports.cloud import Cloud
from spotwright.ports.queue import MessageQueue

__all__ = ["controller_command"]

log = get_logger("controller")


@dataclass(frozen=True)
class Options:
    """Every command-line option but the logging ones, by the option's parameter name.

    The command hands click's values straight to this class, so a new option needs its
    ``click.option`` and a field here, and nothing else.
    """

    kubeconfig: Path | None
    cloud: str
    nodepool_files: tuple[Path, ...]
    nodegroup_files: tuple[Path, ...]
    interruption_queue: str | None
    interruption_workers: int
    interruption_concurrency: int
    leader_elect: bool
    lease_namespace: str
    lease_name: str
    identity: str
    metrics_port: int
    kube_qps: float
    kube_burst: int
    region: str
    aws_endpoint_url: str | None
    cluster_name: str | None
    cluster_endpoint: str | None
    cluster_ca_file: Path | None
    service_cidr: str | None
    kubernetes_version: str
    ami_id: str | None
    instance_types: tuple[str, ...]
    sim_boot_seconds: float
    sim_interruptions: str


_FILE = click.Path(path_type=Path, dir_okay=False, exists=True)


def _shown(*decls: str, **attrs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """An option whose default the help shows: most of them, so it is the one place said."""
    return click.option(*decls, show_default=True, **attrs)


@click.command("controller")
@click.option(
    "--kubeconfig",
    type=_FILE,
    default=None,
    help="Kubeconfig file (default: in-cluster service account, else $KUBECONFIG).",
)
@_shown(
    "--cloud",
    type=click.Choice(["aws", "sim"]),
    default="aws",
    help="EC2, or the simulated market with kwok fake Nodes.",
)
@click.option(
    "--nodepools",
    "nodepool_files",
    multiple=True,
    type=_FILE,
    help="NodePool YAML file (repeatable); default: the cluster's NodePool objects.",
)
@click.option(
    "--nodegroups",
    "nodegroup_files",
    multiple=True,
    type=_FILE,
    help="eksctl ClusterConfig whose nodeGroups to keep (repeatable); see docs/nodegroups.md.",
)
@click.option(
    "--interruption-queue",
    default=None,
    metavar="URL",
    help="SQS queue URL to handle interruption events from.",
)
@_shown(
    "--interruption-workers",
    type=click.IntRange(min=1),
    default=Settings().interruption_workers,
    help="Long polls of the interruption queue at once (10 messages each).",
)
@_shown(
    "--interruption-concurrency",
    type=click.IntRange(min=1),
    default=Settings().interruption_concurrency,
    help="Interruption messages whose node is being tainted at once, each in its own task.",
)
@_shown(
    "--leader-elect/--no-leader-elect",
    default=True,
    help="Run the controllers only while holding the leader Lease.",
)
@click.option(
    "--leader-elect-namespace",
    "lease_namespace",
    default=lambda: os.environ.get("POD_NAMESPACE", "spotwright"),
    show_default="$POD_NAMESPACE or spotwright",
    help="Namespace of the Lease.",
)
@_shown(
    "--leader-elect-name", "lease_name", default="spotwright-controller", help="Name of the Lease."
)
@click.option("--identity", default=None, help="Leader-election identity (default: host_random).")
@_shown(
    "--metrics-port",
    type=int,
    default=8080,
    help="Prometheus /metrics port on all interfaces; 0 disables it.",
)
@_shown("--kube-qps", type=float, default=200.0)
@_shown("--kube-burst", type=int, default=300)
@_shown("--region", default="us-east-1")
@click.option("--aws-endpoint-url", default=None, help="AWS endpoint (an emulator such as moto).")
@click.option("--cluster-name", default=None, help="EKS cluster name (--cloud aws).")
@click.option(
    "--cluster-endpoint",
    default=None,
    help="--cloud aws: the API server URL nodes join (default: from EKS DescribeCluster).",
)
@click.option(
    "--cluster-ca-file",
    type=_FILE,
    default=None,
    help="--cloud aws: the cluster's CA bundle, PEM or base64 (default: from EKS).",
)
@click.option(
    "--service-cidr",
    default=None,
    help="--cloud aws: the service CIDR; nodes' DNS is its tenth address (default: from EKS).",
)
@_shown(
    "--kubernetes-version",
    default="1.36",
    help="--cloud aws: the version whose EKS-optimized AMIs (and EC2NodeClass aliases) nodes boot.",
)
@click.option(
    "--ami-id",
    default=None,
    help="--cloud aws: for NodePools without an EC2NodeClass, boot every type from this "
    "AMI, not the EKS-optimized one.",
)
@click.option(
    "--instance-types",
    multiple=True,
    metavar="PATTERN",
    help="--cloud aws: discover only these instance types (repeatable; wildcards such as "
    "'m5.*'); default: every type the region offers.",
)
@_shown(
    "--sim-boot-seconds",
    type=float,
    default=35.0,
    help="--cloud sim: how long an instance takes to boot.",
)
@_shown(
    "--sim-interruptions",
    type=click.Choice(["none", "advisor"]),
    default="none",
    help="--cloud sim: reclaim spot instances at Spot Advisor rates.",
)
@_shown("--log-format", type=click.Choice(["text", "json"]), default="text")
@_shown("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
def controller_command(
    *, identity: str | None, log_format: str, log_level: str, **values: Any
) -> None:
    """Run the provisioner, interruption handling, termination and garbage collection."""
    configure_logging(fmt="json" if log_format == "json" else "text", level=log_level)
    options = Options(identity=identity or default_identity(), **values)
    if options.cloud == "aws" and not options.cluster_name:
        raise UserError("--cloud aws needs --cluster-name")
    if options.cloud == "aws":
        _join_options(options)  # a bad CA file or CIDR is refused before connecting
    try:
        pools = load_nodepool_files(options.nodepool_files) if options.nodepool_files else None
        load_nodegroup_files(options.nodegroup_files)  # refuse a bad file before connecting
    except ScenarioError as exc:
        raise UserError(str(exc)) from exc
    code = asyncio.run(_main(options, pools))
    if code:
        raise SystemExit(code)


def _join_options(options: Options) -> tuple[str | None, str | None, str | None]:
    """What nodes need to join (endpoint, CA, service CIDR); EKS is asked for the rest."""
    from spotwright.adapters.aws.cluster_info import cluster_settings

    try:
        ca = options.cluster_ca_file.read_bytes() if options.cluster_ca_file else None
        return cluster_settings(options.cluster_endpoint, ca, options.service_cidr)
    except (OSError, ValueError) as exc:
        raise UserError(str(exc)) from None


async def _main(options: Options, pools: Sequence[NodePoolSource] | None) -> int:
    """Run until SIGTERM (0) or until the Lease is lost or a controller fails (1)."""
    try:
        client = connect(options.kubeconfig)
    except Exception as exc:  # lightkube raises several kinds for a bad kubeconfig
        raise UserError(f"cannot use the kubeconfig: {exc}") from exc
    api = Api(client, qps=options.kube_qps, burst=options.kube_burst)
    elector = (
        LeaderElector(
            api,
            namespace=options.lease_namespace,
            name=options.lease_name,
            identity=options.identity,
        )
        if options.leader_elect
        else None
    )
    cluster = KubeCluster(
        api,
        identity=options.identity,
        fence=(lambda: elector.is_leader) if elector is not None else None,
        # Nothing here reads PodDisruptionBudgets: the Eviction API enforces them.
        scope=CacheScope(pdbs=False),
    )
    live_pools = LiveNodePools(api) if pools is None else None
    classes = LiveNodeClasses(api) if options.cloud == "aws" else None
    metrics = Metrics()
    if options.metrics_port:
        start_http_server(options.metrics_port, registry=metrics.registry)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # boto3 calls run in threads; ten SQS long polls alone would fill the default pool.
    loop.set_default_executor(ThreadPoolExecutor(max_workers=32))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    extra: list[asyncio.Task[None]] = [asyncio.create_task(_watch_loop_lag())]
    try:

        async def sync() -> None:
            if live_pools is not None:
                extra.append(asyncio.create_task(live_pools.informer.run()))
                await live_pools.informer.synced.wait()
            if classes is not None:
                extra.append(asyncio.create_task(classes.informer.run()))
                await classes.informer.synced.wait()
            await cluster.start(timeout=60)

        syncing = asyncio.ensure_future(sync())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({syncing, stopping}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if not syncing.done():
            syncing.cancel()
            if not stop.is_set():
                log.error("could not list the cluster's objects in 60s; is the API reachable?")
                return 1
            return 0
        if syncing.exception() is not None:
            log.error("could not start the caches", error=str(syncing.exception()))
            return 1
        log.info("caches synced", identity=options.identity, nodes=len(cluster.nodes()))

        async def lead() -> None:
            await _run_controllers(
                options, api, cluster, metrics, pools or live_pools or [], classes
            )

        work = asyncio.ensure_future(elector.run(lead) if elector is not None else lead())
        done, _ = await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            failure = work.exception()
            if isinstance(failure, LostLeadership):
                log.error("stopping: leadership lost", error=str(failure))
            elif failure is not None:
                log.error(
                    "stopping: a controller failed", error=f"{type(failure).__name__}: {failure}"
                )
            return 1
        log.info("stopping: signal received")
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await work  # cancels the controllers, then releases the Lease
        await cluster.flush_events()
        return 0
    finally:
        for task in extra:
            task.cancel()
        await cluster.close()
        await api.close()


async def _run_controllers(
    options: Options,
    api: Api,
    cluster: KubeCluster,
    metrics: Metrics,
    nodepools: Sequence[NodePoolSource],
    classes: LiveNodeClasses | None = None,
) -> None:
    clock = LoopClock()
    queue: MessageQueue | None = None
    cloud: Cloud
    background: list[Coroutine[Any, Any, None]] = []
    if options.cloud == "sim":
        try:
            catalog = load_catalog()
        except CatalogError as exc:
            raise UserError(str(exc)) from exc
        local = MemoryQueue() if options.interruption_queue is None else None
        kwok = KwokCloud(
            cluster,
            api,
            catalog.types,
            region=options.region,
            zones=default_zones(options.region),
            clock=clock,
            boot_seconds=options.sim_boot_seconds,
            interruptions=options.sim_interruptions,
            publish=local.put if local is not None else None,
        )
        adopted = await kwok.adopt()
        if adopted:
            log.info("adopted instances of a previous controller", booted=adopted)
        cloud, queue = kwok, local
        background.append(kwok.run())
    else:
        from spotwright.adapters.aws.ec2 import EC2Cloud, EC2Settings

        endpoint, ca_bundle, cidr = _join_options(options)
        ec2 = EC2Cloud(
            EC2Settings(
                cluster_name=options.cluster_name or "",
                cluster_endpoint=endpoint,
                cluster_ca_bundle=ca_bundle,
                service_cidr=cidr,
                kubernetes_version=options.kubernetes_version,
                ami_id=options.ami_id,
                instance_type_patterns=options.instance_types,
            ),
            region=options.region,
            clock=clock,
            endpoint_url=options.aws_endpoint_url,
            node_classes=classes.get if classes is not None else None,
        )
        await ec2.refresh()
        cloud = ec2
        background.append(ec2.run())
    if options.interruption_queue:
        from spotwright.adapters.aws.sqs import SqsQueue

        queue = SqsQueue(
            options.interruption_queue,
            region=options.region,
            endpoint_url=options.aws_endpoint_url,
        )
    ctx = Context(
        cluster=cluster,
        cloud=cloud,
        clock=clock,
        metrics=metrics,
        nodepools=nodepools,
        instance_types={t.name: t for t in cloud.instance_types()},
        settings=Settings(
            interruption_workers=options.interruption_workers,
            interruption_concurrency=options.interruption_concurrency,
            plan_in_thread=True,
        ),
    )
    controllers: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
        "provisioner": Provisioner(ctx).run,
        "nodeclaim.lifecycle": NodeClaimLifecycle(ctx).run,
        "termination": Terminator(ctx).run,
        "nodeclaim.garbagecollection": GarbageCollector(ctx).run,
    }
    nodegroups = load_nodegroup_files(options.nodegroup_files)
    if nodegroups:
        controllers["nodegroups"] = NodeGroupController(ctx, nodegroups).run
    if queue is not None:
        # Auto Scaling lifecycle hooks arriving on the queue are completed through this port.
        from spotwright.adapters.aws.autoscaling import AwsAutoScaling

        autoscaling = AwsAutoScaling(
            region=options.region, endpoint_url=options.aws_endpoint_url, clock=clock
        )
        controllers["interruption"] = InterruptionHandler(ctx, queue, autoscaling).run
    log.info(
        "controllers started",
        cloud=options.cloud,
        nodepools=", ".join(p.name for p in nodepools) or "<none yet>",
        interruption_queue=options.interruption_queue or ("memory" if queue else "<none>"),
    )
    tasks = [asyncio.ensure_future(c) for c in background]
    tasks += [asyncio.ensure_future(_supervised(n, run)) for n, run in controllers.items()]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _supervised(name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a controller; if it fails, log why and start it again after a backoff.

    On a live cluster a write can race another (a claim removed while a node event about
    it is handled) or meet an API error; the state that matters is in the API server, so
    restarting the loop (whose watch replays every cached object) is the recovery.
    """
    delay = 1.0
    while True:
        started = time.monotonic()
        try:
            await run()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # supervising is this function's whole point
            if time.monotonic() - started > 60:
                delay = 1.0
            log.error(
                "controller failed, restarting it",
                controller=name,
                error=f"{type(exc).__name__}: {exc}",
                retry_in=f"{delay:.0f}s",
            )
            await asyncio.sleep(delay)
            delay = min(30.0, delay * 2)


async def _watch_loop_lag(period: float = 0.5, threshold: float = 1.0) -> None:
    """Warn when the event loop was blocked: every controller shares it, so a long
    synchronous stretch (a big scheduling round) delays taints and Lease renewals."""
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(period)
        lag = loop.time() - started - period
        if lag > threshold:
            log.warning("event loop was blocked", seconds=f"{lag:.1f}")
