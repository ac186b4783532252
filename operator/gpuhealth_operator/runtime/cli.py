"""`gpu-health-operator`: parse flags, wait for leadership, run kopf with our context.

Order of things: serve /healthz and /metrics at once (a standby replica is
alive too), take the leader Lease, fill the cache with paged LISTs of each
kind (`priming`: the first decisions, the budget above all, see the whole
fleet), then run the watches (`watching` for Nodes and GPUNodes, and for the
pods using GPUs while a policy wants active checks: `gpu_pod_watch`; kopf for
policies and agent pods) and our timer until the Lease is lost or a
signal asks us to stop (exit 0, Lease released). A lost Lease ends the term:
every write stops at once (the term fences our client), the watches, the
timer and the drains stop, and the same process campaigns again. Its next term keeps
the cache (only the view of the cluster; every other memory of the old term
is dropped) and lists into it again before it acts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import kopf

from gpuhealth_api import logformat
from gpuhealth_operator.client import kube, kubeconfigs
from gpuhealth_operator.runtime import (
    flags,
    gpu_pod_watch,
    handlers,
    health,
    heap,
    leader,
    passes,
    priming,
    resync,
    ticker,
)
from gpuhealth_operator.shared import context, metrics, settings
from gpuhealth_operator.state import cache

logger = logging.getLogger("gpuhealth_operator")

EXIT_FAILED = 1
"""Exit status when a part of the operator failed (a lost Lease is not a failure: we campaign again)."""
EXIT_USAGE = 2
"""Exit status of a bad command line or an unusable kubeconfig (as argparse's own errors)."""
STOP_SECONDS = 5.0
"""How long the tasks of an ended term get to finish before they are cancelled."""


parse_args = flags.parse_args
"""The command line's settings (`runtime/flags.py`); named here too, as the entry point's."""


def timing(config: settings.Settings) -> leader.Timing:
    return leader.Timing(
        duration_seconds=config.lease_duration_seconds,
        renew_deadline_seconds=config.lease_renew_deadline_seconds,
        renew_seconds=config.lease_renew_seconds,
        retry_seconds=config.lease_retry_seconds,
    )


def _client(
    config: settings.Settings,
    credentials: kube.Credentials,
    meters: metrics.Metrics,
    *,
    pool_size: int,
    fence: Callable[[], bool] | None = None,
) -> kube.Kube:
    return kube.Kube(
        credentials,
        timeout_seconds=config.request_timeout_seconds,
        pool_size=pool_size,
        on_request=lambda verb: meters.api_requests.labels(verb).inc(),
        fence=fence,
        # The API server's audit log then says which replica wrote what (managedFields keep the part
        # before the "/", "gpu-health-operator", as before).
        user_agent=f"gpu-health-operator/{config.identity}",
    )


def _on_signals(stop: asyncio.Event) -> None:
    """(Re)install our SIGINT/SIGTERM handlers: kopf replaces them while it runs and leaves its own."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)


async def _signals_after(kopf_ready: asyncio.Event, stop: asyncio.Event) -> None:
    """Take SIGTERM/SIGINT back from kopf once it has started (it installs its own handlers as it
    starts). On its own signal kopf stops first and then waits up to 5 s for the tasks it did not
    start (our watches, timer and drains) before it returns and we could end them: a rolling update
    would wait for nothing. Through `stop`, the term ends everything at once (`_end_term`)."""
    await kopf_ready.wait()
    _on_signals(stop)
    await asyncio.Event().wait()  # a task of the term: it ends when the term cancels it


async def _campaign(elector: leader.ElectionThread, stop: asyncio.Event) -> leader.Term | None:
    """Wait for the Lease; the new term, or None when a signal asked us to stop first."""
    acquiring = asyncio.create_task(elector.acquire())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if stop.is_set():
        acquiring.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await acquiring
        return None
    return acquiring.result()


async def run(config: settings.Settings) -> int:
    """Serve health and metrics for the life of the process; lead whenever this replica holds the Lease.

    A term that ends because the Lease was lost (not renewed in time, or taken
    by another replica) stops every write at once, stops kopf, the timer and
    the drains, and campaigns again in the same process: an API-server outage
    costs no restart. A new term starts from a fresh context over the same cache, listed again.
    """
    meters = metrics.Metrics.create()
    meters.serve(config.metrics_port)
    liveness = health.Health()
    await liveness.start(config.health_port)
    credentials = await kube.load_credentials(config.kubeconfig)
    # Renewals on their own thread and connections: nothing the operator does can delay them.
    elector = leader.ElectionThread(
        leader.Elector(
            client=_client(config, credentials, meters, pool_size=2),
            namespace=config.lease_namespace,
            name=config.lease_name,
            identity=config.identity,
            timing=timing(config),
        )
    )
    stop = asyncio.Event()
    cluster = cache.ClusterCache()
    """Outlives a term: a re-acquired Lease lists into it instead of building the cache from nothing."""
    try:
        while True:
            _on_signals(stop)
            term: leader.Term | None = None
            if config.leader_elect:
                term = await _campaign(elector, stop)
                if term is None:
                    return 0
            liveness.leading = True
            meters.set_leading(True)  # a new term: the last term's fleet gauges cleared
            exit_code = await _lead(
                config,
                credentials,
                meters,
                elector=elector,
                term=term,
                stop=stop,
                liveness=liveness,
                cluster=cluster,
            )
            if exit_code is not None:
                return exit_code
            logger.warning("lost the leader Lease: stopped acting; campaigning again")
    finally:
        liveness.leading = False
        meters.set_leading(False)
        await liveness.stop()
        await elector.close()


async def _lead(
    config: settings.Settings,
    credentials: kube.Credentials,
    meters: metrics.Metrics,
    *,
    elector: leader.ElectionThread,
    term: leader.Term | None,
    stop: asyncio.Event,
    liveness: health.Health,
    cluster: cache.ClusterCache,
) -> int | None:
    """Act for one term: the exit status, or None when the Lease was lost (campaign again)."""
    client = _client(
        config, credentials, meters, pool_size=config.api_connections, fence=term.holds if term else None
    )
    ctx = context.Context.create(config, client, meters, instance=config.identity, cluster=cluster)
    meters.follow_passes(lambda: len(ctx.passes))
    tasks: set[asyncio.Task[Any]] = {asyncio.create_task(stop.wait(), name="signal")}
    if term is not None:
        tasks.add(asyncio.create_task(elector.hold(term), name="lease"))
    primed = asyncio.create_task(priming.prime_until_done(ctx, config.lease_retry_seconds), name="prime")
    done, _ = await asyncio.wait({*tasks, primed}, return_when=asyncio.FIRST_COMPLETED)
    kopf_stop, kopf_ready = asyncio.Event(), asyncio.Event()
    if primed in done and not primed.exception():
        registry = kopf.OperatorRegistry()
        handlers.register(registry, config.agent_pod_selector)
        relists = resync.Relists()
        relists.register(registry)
        kopf_settings = kopf.OperatorSettings()
        handlers.configure(kopf_settings, config.agent_pod_selector)
        tasks.add(
            asyncio.create_task(
                kopf.operator(
                    registry=registry,
                    settings=kopf_settings,
                    memo=ctx,
                    clusterwide=True,
                    standalone=True,
                    stop_flag=kopf_stop,
                    ready_flag=kopf_ready,
                ),
                name="kopf",
            )
        )
        tasks.add(asyncio.create_task(_signals_after(kopf_ready, stop), name="signals"))
        tasks.add(asyncio.create_task(passes.run(ctx), name="passes"))
        for watch in handlers.watches(ctx, relists.relisted, since=primed.result().versions):
            tasks.add(asyncio.create_task(watch.run(), name=f"watch {watch.kind}"))
        tasks.add(asyncio.create_task(ticker.run(ctx), name="timer"))
        tasks.add(asyncio.create_task(gpu_pod_watch.run(ctx), name="gpu pods"))
        tasks.add(asyncio.create_task(resync.run(ctx, relists), name="resync"))
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    else:
        tasks.add(primed)
    # Not leading from this moment (`_end_term` fences the writes next), even while its tasks stop.
    liveness.leading = False
    meters.set_leading(False)  # fleet gauges hidden: the last counts are stale
    exit_code: int | None = 0
    for task in done:
        if task.cancelled():  # kopf cancels, as it stops, every task started after it (and their waits)
            logger.info("stopping: %s was cancelled", task.get_name())
            continue
        error = task.exception()
        if isinstance(error, leader.LeaseLost):
            logger.error("stopping to act: %s", error)
            exit_code = None
        elif error is not None:
            logger.error("stopping: %s failed: %r", task.get_name(), error)
            exit_code = EXIT_FAILED
        else:
            logger.info("stopping: %s ended", task.get_name())
    await _end_term(ctx, term, tasks, kopf_stop)
    meters.follow_passes(lambda: 0)  # the ended term's queue (and context) is let go
    await client.close()
    if config.leader_elect and exit_code == 0:
        await elector.release()
    return exit_code


async def _end_term(
    ctx: context.Context,
    term: leader.Term | None,
    tasks: set[asyncio.Task[Any]],
    kopf_stop: asyncio.Event,
) -> None:
    """Stop every write of this term at once, then its tasks; nothing of it outlives this call."""
    if term is not None:
        term.end()
    kopf_stop.set()
    ctx.steps.drain.cancel_all()
    pending = {task for task in tasks if not task.done()}
    for task in pending:
        if task.get_name() != "kopf":
            task.cancel()
    if pending:
        _, still = await asyncio.wait(pending, timeout=STOP_SECONDS)
        for task in still:
            task.cancel()
        if still:
            await asyncio.wait(still, timeout=STOP_SECONDS)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: asyncio would otherwise log it again at exit


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["apply-crds"]:
        # The chart's init container: the CRDs Helm never upgrades, before the operator starts.
        from gpuhealth_operator.runtime import crd_upgrade  # noqa: PLC0415  (loads the Kubernetes client)

        sys.exit(crd_upgrade.main(args[1:]))
    heap.tune_allocator()
    config = parse_args(argv)
    logformat.configure(config.log_level, config.log_format)
    if config.log_level != "DEBUG":
        # kopf logs every handler call at INFO; at fleet scale that is one line per watch event.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    try:
        sys.exit(asyncio.run(run(config)))
    except kubeconfigs.ConfigError as error:
        # A missing file, bad YAML, an unknown context: one line that names the file, not a traceback.
        print(f"gpu-health-operator: {error}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


if __name__ == "__main__":
    main()
