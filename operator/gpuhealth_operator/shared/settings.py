"""Runtime settings of the operator: one dataclass, filled from the command line.

Durations carry their unit in the name. Defaults suit a production cluster;
tests shorten the leader-election durations and the reconcile period.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Final

from gpuhealth_api import keys

DEFAULT_AGENT_POD_SELECTOR: Final = keys.AGENT_POD_SELECTOR
"""The agent DaemonSet's pods as the Helm chart labels them (under its default name)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    kubeconfig: pathlib.Path | None = None
    """Kubeconfig file; None means in-cluster config, then $KUBECONFIG, then ~/.kube/config."""

    metrics_port: int = 8080
    """Port of the Prometheus /metrics endpoint (0 disables it)."""

    health_port: int = 8081
    """Port of the /healthz liveness endpoint (0 disables it)."""

    leader_elect: bool = True
    """Hold a coordination.k8s.io/v1 Lease before acting, so that only one replica acts."""

    lease_namespace: str = "gpu-health"
    """Namespace of the leader-election Lease."""

    lease_name: str = "gpu-health-operator"
    """Name of the leader-election Lease."""

    identity: str = ""
    """This replica's holder identity in the Lease (default: hostname and pid)."""

    lease_duration_seconds: float = 15.0
    """How long a Lease stays valid without renewal; a dead leader is replaced after this."""

    lease_renew_deadline_seconds: float = 10.0
    """The leader stops every write when it could not renew its Lease for this long (< the duration)."""

    lease_renew_seconds: float = 2.0
    """How often the leader renews its Lease while renewals succeed."""

    lease_retry_seconds: float = 2.0
    """How often a standby replica tries to acquire the Lease, and the leader retries a failed renewal."""

    agent_pod_selector: str = DEFAULT_AGENT_POD_SELECTOR
    """Label selector of the agents' DaemonSet pods, watched for liveness (`decisions.liveness`); "" turns
    the watch off (every node then goes by its GPUNode heartbeat alone)."""

    agent_pod_namespace: str | None = "gpu-health"
    """Namespace of the agents' DaemonSet (the chart's release namespace, the operator's own): a pod the
    selector matches elsewhere, or not controlled by a DaemonSet, is not an agent (`agent_pods.is_agent`).
    None accepts any namespace (a backtest replays the pods a recording kept as agents)."""

    node_selector: str = ""
    """Label selector of the Nodes this operator watches, caches and judges (with their GPUNodes, same
    names): one operator per node pool. "" is every Node."""

    tick_seconds: float = 1.0
    """Period of the time-based pass: forSeconds, staleness, budget queue, recovery, stragglers."""

    full_pass_seconds: float = 300.0
    """How often the timer judges every node, due or not: a safety net under `ticker.is_due` and its
    index (`decisions.due`), which already find every node time may change; like the resync, it only
    catches what a lost watch event left unjudged, so it runs as rarely (issue 29)."""

    resync_seconds: float = 300.0
    """How often the cache is checked against a fresh LIST (also done whenever a watch re-lists)."""

    eviction_concurrency: int = 16
    """Evictions in flight at once, across all drains."""

    eviction_backoff_initial_seconds: float = 1.0
    """First wait after an eviction refused by a PodDisruptionBudget (429)."""

    eviction_backoff_max_seconds: float = 30.0
    """Cap of the exponential backoff between refused evictions."""

    api_connections: int = 32
    """Most connections to the API server at once; idle ones close after 15 s (each holds ~256 KiB)."""

    request_timeout_seconds: float = 30.0
    """Timeout of one request to the API server (watches excluded)."""

    repair_templates: str | None = None
    """`NAMESPACE/NAME` of the ConfigMap of repair Job templates (`spec.repair`); None: the packaged
    defaults (`repair-templates.yaml`, the chart's ConfigMap holds the same)."""

    repair_namespace: str | None = None
    """Namespace the repair Jobs run in; None: the templates' ConfigMap's namespace, else `gpu-health`."""

    gpu_operator_namespace: str = "gpu-operator"
    """Namespace of the NVIDIA GPU Operator's operands. A Validation Job talks to the node's standalone DCGM
    host engine only where a pod in it, controlled by a DaemonSet, runs one (`decisions.hostengine`): a
    tenant's look-alike elsewhere must never be the judge of the GPUs it runs beside."""

    release_gpus: bool = True
    """Ask a node's agent to let go of NVML before a ResetGPU Job and wait for its answer (`gpu_release`);
    off in the backtest's replay, whose recorded agents cannot answer the replay's own asks."""

    run_checks: bool = True
    """Start, adopt and end the active checks' Jobs (`spec.activeChecks`, `ladder/check`); off in the
    backtest's replay, which cannot run Jobs: it hands the operator the runs its trace recorded
    (`replay.Operator.check_run`), whose condition the same judging derives."""

    check_dra_device_class: str = "gpu.nvidia.com"
    """DeviceClass of the GPUs a check claims on a node that publishes them through DRA (no
    `nvidia.com/gpu` capacity): its pod claims every device of the class on the node."""

    check_dra_driver: str = "gpu.nvidia.com"
    """DRA driver whose ResourceSlices publish a node's GPUs (NVIDIA's k8s-dra-driver-gpu): a node
    without `nvidia.com/gpu` capacity is checked through DRA where they list GPU devices for it."""

    log_level: str = "INFO"
    """Python logging level name."""

    log_format: str = "text"
    """`text` (lines for people) or `json` (one JSON object per line: `gpuhealth_api.logformat`)."""
