"""The operator's command line: `gpu-health-operator [flags]` → `settings.Settings` (docs/operations.md).

Apart from `cli`, which runs what the flags say, so that the flags have a room of their own as they grow.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import socket
from collections.abc import Sequence

from gpuhealth_api import __version__, logformat
from gpuhealth_operator.runtime import leader
from gpuhealth_operator.shared import settings


def parse_args(argv: Sequence[str] | None = None) -> settings.Settings:
    parser = argparse.ArgumentParser(
        prog="gpu-health-operator",
        description="Judge GPUNode facts against GPUHealthPolicy resources and act on Nodes.",
    )
    default = settings.Settings()
    parser.add_argument("--version", action="version", version=f"gpu-health-operator {__version__}")
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
    parser.add_argument(
        "--lease-duration-seconds",
        type=float,
        default=default.lease_duration_seconds,
        help="a standby takes over after the holder's Lease stayed unrenewed this long (default: 15)",
    )
    parser.add_argument(
        "--lease-renew-deadline-seconds",
        type=float,
        help="the leader stops all writes when it could not renew for this long "
        "(default: two thirds of the lease duration, 10)",
    )
    parser.add_argument(
        "--lease-renew-seconds",
        type=float,
        help="how often the leader renews while renewals succeed (default: the retry period)",
    )
    parser.add_argument(
        "--lease-retry-seconds",
        type=float,
        default=default.lease_retry_seconds,
        help="how often a standby tries to acquire, and the leader retries a failed renewal (default: 2)",
    )
    parser.add_argument(
        "--agent-pod-selector",
        default=default.agent_pod_selector,
        help="label selector of the agent DaemonSet's pods, watched for liveness; '' = off, staleness by "
        f"the GPUNode heartbeat alone (default: {default.agent_pod_selector})",
    )
    parser.add_argument(
        "--agent-pod-namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="namespace of the agent DaemonSet: a pod the selector matches elsewhere, or not controlled by "
        "a DaemonSet, is not an agent (default: $POD_NAMESPACE, the operator's own, else --lease-namespace)",
    )
    parser.add_argument(
        "--node-selector",
        default=default.node_selector,
        help="label selector of the Nodes this operator watches and judges (and their GPUNodes): one "
        "operator per node pool, each with its own --lease-name; a policy must not select nodes of two "
        "pools (default: '', every Node)",
    )
    parser.add_argument(
        "--tick-seconds", type=float, default=default.tick_seconds, help="period of the timer pass"
    )
    parser.add_argument(
        "--full-pass-seconds",
        type=float,
        default=default.full_pass_seconds,
        help="judge every node, due or not, this often (a safety net; default: 300)",
    )
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=default.resync_seconds,
        help="re-list Nodes, GPUNodes and policies this often and forget what is gone "
        "(also done after every watch re-list; default: 300)",
    )
    parser.add_argument("--eviction-concurrency", type=int, default=default.eviction_concurrency)
    parser.add_argument(
        "--api-connections", type=int, default=default.api_connections, help="connections to the API server"
    )
    parser.add_argument(
        "--repair-templates",
        default=None,
        metavar="NAMESPACE/NAME",
        help="ConfigMap of the repair Job templates (keys ResetGPU, RebootNode, Validation) for policies "
        "with spec.repair (default: the templates packaged with the operator)",
    )
    parser.add_argument(
        "--repair-namespace",
        default=None,
        help="namespace the repair Jobs run in (default: the templates ConfigMap's, else gpu-health)",
    )
    # Active checks on nodes whose GPUs a DRA driver publishes (no nvidia.com/gpu capacity): docs/checks.md.
    parser.add_argument("--check-dra-device-class", default=default.check_dra_device_class)
    parser.add_argument("--check-dra-driver", default=default.check_dra_driver)
    parser.add_argument(
        "--gpu-operator-namespace",
        default=default.gpu_operator_namespace,
        help="namespace of the NVIDIA GPU Operator's operands: validation uses the node's DCGM host engine "
        f"only where a DaemonSet pod there runs it (default: {default.gpu_operator_namespace})",
    )
    parser.add_argument(
        "--log-level", default=default.log_level, choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    logformat.add_argument(parser, default.log_format)
    args = parser.parse_args(argv)
    timing = leader.Timing(
        duration_seconds=args.lease_duration_seconds,
        renew_deadline_seconds=leader.default_renew_deadline(args.lease_duration_seconds)
        if args.lease_renew_deadline_seconds is None
        else args.lease_renew_deadline_seconds,
        renew_seconds=args.lease_retry_seconds
        if args.lease_renew_seconds is None
        else args.lease_renew_seconds,
        retry_seconds=args.lease_retry_seconds,
    )
    if args.full_pass_seconds <= 0:
        parser.error("--full-pass-seconds must be positive")
    if args.resync_seconds <= 0:
        parser.error("--resync-seconds must be positive")
    if args.repair_templates is not None and len(args.repair_templates.split("/")) != 2:
        parser.error("--repair-templates must be NAMESPACE/NAME")
    if args.leader_elect and (problems := timing.problems()):
        parser.error("; ".join(problems))
    return settings.Settings(
        kubeconfig=args.kubeconfig,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        leader_elect=args.leader_elect,
        lease_namespace=args.lease_namespace,
        lease_name=args.lease_name,
        identity=args.identity,
        lease_duration_seconds=timing.duration_seconds,
        lease_renew_deadline_seconds=timing.renew_deadline_seconds,
        lease_renew_seconds=timing.renew_seconds,
        lease_retry_seconds=timing.retry_seconds,
        agent_pod_selector=args.agent_pod_selector,
        agent_pod_namespace=args.agent_pod_namespace or args.lease_namespace,
        node_selector=args.node_selector,
        tick_seconds=args.tick_seconds,
        full_pass_seconds=args.full_pass_seconds,
        resync_seconds=args.resync_seconds,
        eviction_concurrency=args.eviction_concurrency,
        api_connections=args.api_connections,
        repair_templates=args.repair_templates,
        repair_namespace=args.repair_namespace,
        gpu_operator_namespace=args.gpu_operator_namespace,
        check_dra_device_class=args.check_dra_device_class,
        check_dra_driver=args.check_dra_driver,
        log_level=args.log_level,
        log_format=args.log_format,
    )
