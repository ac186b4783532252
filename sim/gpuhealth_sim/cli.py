"""`gpu-health-sim`: run a simulated GPU fleet against a cluster, or the self-contained demo.

gpu-health-sim run --kubeconfig K --fleet FILE [--workers N] [--delete-nodes] [--repair-namespace NS]
gpu-health-sim demo [--keep] [--duration SECONDS]
gpu-health-sim validate FILE   (or --fleet FILE, as `run` spells it)
gpu-health-sim record --kubeconfig K --out TRACE [--max-seconds S] [--max-bytes B]
gpu-health-sim trace generate --node-days N --seed S --out TRACE
gpu-health-sim backtest --policy P.yaml [--policy Q.yaml] --trace TRACE [--score] [-o json]

Each command imports what it runs when it runs (the demo, the fleet, the Kubernetes client): the
parser imports none of them, so `--version`, `--help` or a bad flag answers at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from gpuhealth_api import __version__, logformat
from gpuhealth_sim.backtest import subcommands
from gpuhealth_sim.demo import defaults as demo_defaults
from gpuhealth_sim.fleet import defaults as fleet_defaults

if TYPE_CHECKING:
    from kubernetes import client

    from gpuhealth_sim.fleet import agentpool, fleetfile

USAGE_ERROR = 2
INVALID_FLEET = 3


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="gpu-health-sim",
        description="Simulated GPU nodes running the real gpu-health agent (no GPU needed).",
    )
    top.add_argument("--version", action="version", version=f"gpu-health-sim {__version__}")
    commands = top.add_subparsers(dest="command", required=True)

    run = commands.add_parser(
        "run",
        help="create a fleet's kwok Nodes and run one agent per node until Ctrl-C",
        description="Create the fleet's Nodes (annotated for kwok) on the cluster and run one simulated "
        "agent per node until interrupted. The cluster needs the gpu-health CRDs and kwok.",
    )
    run.add_argument("--fleet", type=Path, required=True, help="fleet file (docs/fleet.md)")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    run.add_argument("--context", help="kubeconfig context (default: the current one)")
    run.add_argument(
        "--workers",
        type=int,
        help="threads driving the agents (default: the fleet's, else one per 16 nodes, 8 to 64)",
    )
    run.add_argument(
        "--duration", type=float, help="stop after this many seconds (default: run until Ctrl-C/SIGTERM)"
    )
    run.add_argument("--delete-nodes", action="store_true", help="delete the fleet's Nodes when stopping")
    run.add_argument(
        "--repair-namespace",
        default=fleet_defaults.DEFAULT_REPAIR_NAMESPACE,
        help="where the operator runs repair Jobs: their pods on the fleet's nodes end as each node's "
        f"scenario `repair:` says (default: {fleet_defaults.DEFAULT_REPAIR_NAMESPACE}; empty: leave them "
        "Running)",
    )
    run.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    logformat.add_argument(run)

    nodes = demo_defaults.fleet_node_count()
    show = commands.add_parser(
        "demo",
        help=f"local control plane + {nodes or 'the demo fleet of'} simulated GPU nodes with faults + the "
        "operator, shown live",
        description="Start a local control plane, the operator and a simulated fleet with scripted faults; "
        "show the fleet live and summarise what gpu-health detected and did.",
    )
    show.add_argument(
        "--duration",
        type=float,
        default=demo_defaults.DEFAULT_DURATION_SECONDS,
        help="seconds the fleet runs before the summary "
        f"(default: {demo_defaults.DEFAULT_DURATION_SECONDS:g})",
    )
    show.add_argument("--keep", action="store_true", help="keep the cluster running after the summary")
    show.add_argument(
        "--fleet", type=Path, default=demo_defaults.DEFAULT_FLEET, help="fleet file (default: the demo's)"
    )
    show.add_argument("--policy", type=Path, default=demo_defaults.DEFAULT_POLICY, help="policy to apply")
    show.add_argument("--summary-json", type=Path, help="also write the summary as JSON to this file")
    show.add_argument("--workdir", type=Path, help="keep logs and cluster state here (default: a temp dir)")
    show.add_argument(
        "--kubeconfig",
        type=Path,
        help="run on this existing cluster (kind, minikube, a dev cluster) instead of a local control plane: "
        "kwok, the operator and the agents run here; everything the demo creates there is removed at the end",
    )
    show.add_argument("--context", help="with --kubeconfig: its context (default: the current one)")
    show.add_argument(
        "--kwok", type=Path, help="with --kubeconfig: the kwok binary (default: $KWOK, else hack/kwok.sh)"
    )
    show.add_argument(
        "--plain",
        action="store_true",
        help="print lines instead of redrawing (automatic when not a terminal)",
    )

    check = commands.add_parser("validate", help="check a fleet file and list its nodes")
    check.add_argument("fleet", type=Path, nargs="?", help="fleet file (docs/fleet.md)")
    check.add_argument("--fleet", dest="fleet_option", type=Path, help="the same, spelt as `run` takes it")
    subcommands.add_commands(commands)
    return top


def _api_client(kubeconfig: str | None, context: str | None, workers: int) -> client.ApiClient:
    from kubernetes import client, config  # noqa: PLC0415 - only `run` needs the Kubernetes client

    configuration = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, context=context, client_configuration=configuration
    )
    # One connection per worker plus a few for the demo's watches; urllib3 blocks beyond the pool.
    configuration.connection_pool_maxsize = workers + 4
    return client.ApiClient(configuration)


def _run(args: argparse.Namespace, spec: fleetfile.Fleet) -> int:
    from gpuhealth_sim.controlplane import kubeconfigs  # noqa: PLC0415 - only `run` (and `record`) check one

    if (problem := kubeconfigs.unusable(args.kubeconfig, args.context)) is not None:
        print(f"gpu-health-sim: cannot load the {problem}", file=sys.stderr)  # one line, no traceback
        return USAGE_ERROR
    from gpuhealth_sim.fleet import agentpool, checks, repairs  # noqa: PLC0415 - the agent and the Kubernetes client

    logformat.configure(args.log_level, args.log_format)
    log = logging.getLogger("gpu-health-sim")
    workers = args.workers or spec.workers or agentpool.default_workers(len(spec.nodes))
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping the fleet", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.duration is not None:
        threading.Timer(args.duration, stop.set).start()
    api = _api_client(args.kubeconfig, args.context, workers)
    began = time.monotonic()
    try:
        companions = []
        if args.repair_namespace:

            def play_repairs(running: agentpool.Fleet) -> Callable[[], None]:
                executor = repairs.Executor(api, running, namespace=args.repair_namespace)
                executor.start()
                return executor.stop

            companions.append(play_repairs)

        def play_checks(running: agentpool.Fleet) -> Callable[[], None]:
            # Check pods are known by their label in any namespace; none exist until a policy has checks.
            executor = checks.Executor(api, running)
            executor.start()
            return executor.stop

        companions.append(play_checks)
        sim = agentpool.run(
            spec, api, stop, workers=workers, delete_nodes=args.delete_nodes, companions=companions
        )
    finally:
        api.close()  # type: ignore[no-untyped-call]
    stats = sim.stats
    log.info(
        "stopped after %.0fs: %d turns (%d failed), %d status writes (%d failed), max lateness %.2fs",
        time.monotonic() - began,
        stats.turns,
        stats.failed_turns,
        stats.writes,
        stats.write_failures,
        stats.max_lateness_seconds,
    )
    return 0


def _demo(args: argparse.Namespace) -> int:
    from gpuhealth_sim.demo import walkthrough  # noqa: PLC0415 - imports the whole simulator
    from gpuhealth_sim.fleet import fleetfile  # noqa: PLC0415

    options = walkthrough.Options(
        duration_seconds=args.duration,
        keep=args.keep,
        fleet_path=args.fleet,
        policy_path=args.policy,
        summary_json=args.summary_json,
        workdir=args.workdir,
        tty=False if args.plain else None,
        kubeconfig=args.kubeconfig,
        context=args.context,
        kwok=args.kwok or (Path(os.environ["KWOK"]) if os.environ.get("KWOK") else None),
    )
    try:
        return walkthrough.run(options)
    except fleetfile.FleetError as error:
        print(f"gpu-health-sim: {error}", file=sys.stderr)
        return INVALID_FLEET


def main(argv: Sequence[str] | None = None) -> int:
    top = parser()
    args = top.parse_args(argv)
    if args.command in ("record", "trace", "backtest"):
        return subcommands.run(args)
    if args.command == "demo":
        return _demo(args)
    if args.command == "validate":
        if (args.fleet is None) == (args.fleet_option is None):
            top.error("validate takes one fleet file: validate FILE or validate --fleet FILE")
        args.fleet = args.fleet or args.fleet_option
    from gpuhealth_sim.fleet import fleetfile  # noqa: PLC0415 - imports the agent's scenarios

    try:
        spec = fleetfile.load(args.fleet)
    except fleetfile.FleetError as error:
        print(f"gpu-health-sim: {error}", file=sys.stderr)
        return INVALID_FLEET
    if args.command == "validate":
        pools: dict[str, int] = {}
        for plan in spec.nodes:
            pools[plan.pool] = pools.get(plan.pool, 0) + 1
        print(f"{args.fleet}: {len(spec.nodes)} nodes in {len(pools)} pool(s): ", end="")
        print(", ".join(f"{name} ({count})" for name, count in pools.items()))
        return 0
    if args.workers is not None and args.workers < 1:
        print("gpu-health-sim: --workers must be at least 1", file=sys.stderr)
        return USAGE_ERROR
    return _run(args, spec)


if __name__ == "__main__":
    sys.exit(main())
