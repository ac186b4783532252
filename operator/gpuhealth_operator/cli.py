"""`gpu-health-operator`: parse flags, wait for leadership, run kopf with our context.

Order of things: serve /healthz and /metrics at once (a standby replica is
alive too), take the leader Lease, fill the cache with one LIST per kind (so
the first decisions, the budget above all, see the whole fleet), then run
kopf's watches and our timer until the Lease is lost (exit 1: the Deployment
restarts us as a standby) or a signal asks us to stop (exit 0, Lease released).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import pathlib
import signal
import socket
import sys
from collections.abc import Sequence

import kopf

from gpuhealth_api import resources
from gpuhealth_operator import context, handlers, health, kube, leader, metrics, settings, ticker

logger = logging.getLogger("gpuhealth_operator")

EXIT_LEASE_LOST = 1
"""Exit status when this replica stopped acting for any reason but a requested stop."""


def parse_args(argv: Sequence[str] | None = None) -> settings.Settings:
    parser = argparse.ArgumentParser(
        prog="gpu-health-operator",
        description="Judge GPUNode facts against GPUHealthPolicy resources and act on Nodes.",
    )
    default = settings.Settings()
    parser.add_argument(
        "--kubeconfig", type=pathlib.Path, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)"
    )
    parser.add_argument(
        "--metrics-port", type=int, default=default.metrics_port, help="Prometheus /metrics port (0: off)"
    )
    parser.add_argument("--health-port", type=int, default=default.health_port, help="/healthz port (0: off)")
    parser.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=default.leader_elect,
        help="hold a Lease before acting (default: on)",
    )
    parser.add_argument(
        "--lease-namespace", default=os.environ.get("POD_NAMESPACE") or default.lease_namespace
    )
    parser.add_argument("--lease-name", default=default.lease_name)
    parser.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}",
        help="holder identity in the Lease (default: $POD_NAME, else hostname-pid)",
    )
    parser.add_argument("--lease-duration-seconds", type=float, default=default.lease_duration_seconds)
    parser.add_argument("--lease-renew-seconds", type=float, default=default.lease_renew_seconds)
    parser.add_argument("--lease-retry-seconds", type=float, default=default.lease_retry_seconds)
    parser.add_argument(
        "--tick-seconds", type=float, default=default.tick_seconds, help="period of the timer pass"
    )
    parser.add_argument("--eviction-concurrency", type=int, default=default.eviction_concurrency)
    parser.add_argument(
        "--api-connections", type=int, default=default.api_connections, help="connections to the API server"
    )
    parser.add_argument(
        "--log-level", default=default.log_level, choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    args = parser.parse_args(argv)
    return settings.Settings(
        kubeconfig=args.kubeconfig,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        leader_elect=args.leader_elect,
        lease_namespace=args.lease_namespace,
        lease_name=args.lease_name,
        identity=args.identity,
        lease_duration_seconds=args.lease_duration_seconds,
        lease_renew_seconds=args.lease_renew_seconds,
        lease_retry_seconds=args.lease_retry_seconds,
        tick_seconds=args.tick_seconds,
        eviction_concurrency=args.eviction_concurrency,
        api_connections=args.api_connections,
        log_level=args.log_level,
    )


async def prime(ctx: context.Context) -> None:
    """Fill the cache before the first decision (kopf's own listing then keeps it current)."""
    base = f"/apis/{resources.GROUP}/{resources.VERSION}"
    for body in await ctx.client.list_all("/api/v1/nodes"):
        ctx.cache.put_node(body)
    for body in await ctx.client.list_all(f"{base}/{resources.GPUNODE_PLURAL}"):
        ctx.cache.put_gpunode(body)
    for body in await ctx.client.list_all(f"{base}/{resources.POLICY_PLURAL}"):
        handlers.store_policy(ctx, body)


async def run(config: settings.Settings) -> int:
    meters = metrics.Metrics.create()
    meters.serve(config.metrics_port)
    liveness = health.Health()
    await liveness.start(config.health_port)
    credentials = await kube.load_credentials(config.kubeconfig)
    client = kube.Kube(
        credentials,
        timeout_seconds=config.request_timeout_seconds,
        pool_size=config.api_connections,
        on_request=lambda verb: meters.api_requests.labels(verb).inc(),
    )
    elector = leader.Elector(
        client=client,
        namespace=config.lease_namespace,
        name=config.lease_name,
        identity=config.identity,
        duration_seconds=config.lease_duration_seconds,
        renew_seconds=config.lease_renew_seconds,
        retry_seconds=config.lease_retry_seconds,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        if config.leader_elect:
            acquiring = asyncio.create_task(elector.acquire())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                acquiring.cancel()
                return 0
            stopping.cancel()
        liveness.leading = True
        meters.leader.set(1)
        return await _lead(config, client, meters, elector, stop)
    finally:
        liveness.leading = False
        meters.leader.set(0)
        await liveness.stop()
        await client.close()


async def _lead(
    config: settings.Settings,
    client: kube.Kube,
    meters: metrics.Metrics,
    elector: leader.Elector,
    stop: asyncio.Event,
) -> int:
    ctx = context.Context.create(config, client, meters, instance=config.identity)
    await prime(ctx)
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    kopf_settings = kopf.OperatorSettings()
    handlers.configure(kopf_settings)
    kopf_stop = asyncio.Event()
    tasks = {
        asyncio.create_task(
            kopf.operator(
                registry=registry,
                settings=kopf_settings,
                memo=ctx,
                clusterwide=True,
                standalone=True,
                stop_flag=kopf_stop,
            ),
            name="kopf",
        ),
        asyncio.create_task(ticker.run(ctx), name="timer"),
        asyncio.create_task(stop.wait(), name="signal"),
    }
    if config.leader_elect:
        tasks.add(asyncio.create_task(elector.hold(), name="lease"))
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    exit_code = 0
    for task in done:
        error = task.exception()
        if isinstance(error, leader.LeaseLost):
            logger.error("stopping: %s", error)
            exit_code = EXIT_LEASE_LOST
        elif error is not None:
            logger.error("stopping: %s failed: %r", task.get_name(), error)
            exit_code = EXIT_LEASE_LOST
        else:
            # kopf installs its own SIGTERM/SIGINT handlers and returns once it has stopped on one.
            logger.info("stopping: %s ended", task.get_name())
    kopf_stop.set()
    for drain_task in ctx.drains.values():
        drain_task.cancel()
    for task in pending:
        if task.get_name() != "kopf":
            task.cancel()
    with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
        await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), timeout=5)
    if config.leader_elect and exit_code == 0:
        await elector.release()
    return exit_code


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(argv)
    logging.basicConfig(
        level=config.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if config.log_level != "DEBUG":
        # kopf logs every handler call at INFO; at fleet scale that is one line per watch event.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    sys.exit(asyncio.run(run(config)))


if __name__ == "__main__":
    main()
