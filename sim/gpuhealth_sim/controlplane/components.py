"""Command lines of the local control-plane components, and why each flag is there.

Where the cluster deliberately differs from production, it is so simulated
nodes behave predictably:
- no node-lifecycle or taint-eviction controller and no TaintNodesByCondition
  admission: nothing marks Nodes unreachable or evicts their Pods behind a
  test's back, and new Nodes are schedulable at once;
- no leader election in the controller manager and scheduler, so they ride
  out API-server outages instead of exiting;
- etcd skips fsync: test data is disposable.

Per-GPU quarantine needs what 1.36 keeps off by default: `DeviceTaintRule`
(feature gate and beta API version, see FEATURE_GATES and RUNTIME_CONFIG).
"""

from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path
from typing import Final

from gpuhealth_sim.controlplane import kubeconfigs, pki, ports

SERVICE_CIDR: Final = "10.96.0.0/16"
SERVICE_IP: Final = "10.96.0.1"
"""The `kubernetes` Service's ClusterIP, the first of SERVICE_CIDR; in the serving certificate."""
POD_CIDR: Final = "10.244.0.0/16"
SERVICE_ACCOUNT_ISSUER: Final = "https://kubernetes.default.svc.cluster.local"
DISABLED_CONTROLLERS: Final = (
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "node-ipam-controller",
    "cloud-node-lifecycle-controller",
    "node-route-controller",
    "service-lb-controller",
)
FEATURE_GATES: Final = "DRADeviceTaintRules=true"
"""Beta but off by default in 1.36: without it the scheduler and the device-taint-eviction
controller ignore DeviceTaintRules (a rule is stored and gets no status). With it a rule on one
DRA device (one GPU) stops the scheduler allocating it and, NoExecute, evicts only its pods.
Device taints themselves (DRADeviceTaints) are on by default. Set on every component alike."""
RUNTIME_CONFIG: Final = "resource.k8s.io/v1beta2=true"
"""DeviceTaintRule is served only in resource.k8s.io/v1beta2 in 1.36 (v1 has no such kind), and
a beta API version is off unless enabled: the feature gate alone does not serve it."""
KWOK_STAGES: Final = "kwok-stages.yaml"
"""Package data: how kwok plays kubelets (kwok 0.8 ships no built-in stages)."""
AUDIT_LOG: Final = "kube-apiserver-audit.log"
"""In the workdir: one JSON line per write to the API server (see AUDIT_POLICY)."""
AUDIT_POLICY: Final = """\
apiVersion: audit.k8s.io/v1
kind: Policy
rules:
  # kwok renews a Lease per Node every 10 s: noise for every question a test asks.
  - level: None
    namespaces: [kube-node-lease]
  - level: None
    verbs: [get, list, watch]
  # An eviction is audited when received too: if the API server is SIGKILLed after the pod went but
  # before it answered, that is the only trace of the eviction.
  - level: Metadata
    resources: [{group: "", resources: [pods/eviction]}]
  - level: Metadata
    omitStages: [RequestReceived]
"""
"""Who wrote what, when, with which user agent: tests prove write order from it (not reads)."""
KWOK_NODE_LEASE_SECONDS: Final = 40
"""As a kubelet's: the Lease is renewed every quarter of it (10 s)."""


@dataclasses.dataclass(frozen=True)
class Ports:
    """The loopback ports of one control plane."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int


def etcd_args(workdir: Path, free: Ports) -> list[str]:
    client = f"http://{ports.LOOPBACK}:{free.etcd_client}"
    peer = f"http://{ports.LOOPBACK}:{free.etcd_peer}"
    return [
        "--name=default",
        f"--data-dir={workdir / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        # Test data is disposable; skipping fsync makes every write (and startup) much faster.
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def dra_args(device_taint_rules: bool, *, apiserver: bool = False) -> list[str]:
    """The feature gate (and on kube-apiserver the API version) DeviceTaintRules need; none when off."""
    if not device_taint_rules:
        return []
    return [
        f"--feature-gates={FEATURE_GATES}",
        *([f"--runtime-config={RUNTIME_CONFIG}"] if apiserver else []),
    ]


def apiserver_args(
    workdir: Path, free: Ports, keys: pki.Pki, *, device_taint_rules: bool = True
) -> list[str]:
    policy = workdir / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    return [
        f"--etcd-servers=http://{ports.LOOPBACK}:{free.etcd_client}",
        f"--bind-address={ports.LOOPBACK}",
        f"--advertise-address={ports.LOOPBACK}",
        f"--secure-port={free.apiserver}",
        f"--cert-dir={workdir / 'apiserver-certs'}",
        f"--tls-cert-file={keys.serving.cert}",
        f"--tls-private-key-file={keys.serving.key}",
        f"--client-ca-file={keys.ca.cert}",
        "--authorization-mode=RBAC",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={keys.service_account_public_key}",
        f"--service-account-signing-key-file={keys.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        # Without the node-lifecycle controller nothing would lift the not-ready taint.
        "--disable-admission-plugins=TaintNodesByCondition",
        *dra_args(device_taint_rules, apiserver=True),
        "--profiling=false",
        f"--audit-policy-file={policy}",
        f"--audit-log-path={workdir / AUDIT_LOG}",
        "--audit-log-maxsize=200",
        "--audit-log-maxbackup=1",
    ]


def controller_manager_args(
    kubeconfig: Path, free: Ports, keys: pki.Pki, *, device_taint_rules: bool = True
) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--bind-address={ports.LOOPBACK}",
        f"--secure-port={free.controller_manager}",
        "--leader-elect=false",
        "--controllers=*," + ",".join(f"-{name}" for name in DISABLED_CONTROLLERS),
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={keys.service_account_key}",
        f"--root-ca-file={keys.ca.cert}",
        f"--cluster-signing-cert-file={keys.ca.cert}",
        f"--cluster-signing-key-file={keys.ca.key}",
        f"--cluster-name={kubeconfigs.CLUSTER_NAME}",
        *dra_args(device_taint_rules),
        "--profiling=false",
    ]


def scheduler_args(kubeconfig: Path, free: Ports, *, device_taint_rules: bool = True) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--bind-address={ports.LOOPBACK}",
        f"--secure-port={free.scheduler}",
        "--leader-elect=false",
        *dra_args(device_taint_rules),
        "--profiling=false",
        # Level 2 logs why a pod does not fit and where it is bound: a pod left Pending explains itself.
        "--v=2",
    ]


def kwok_args(
    workdir: Path,
    kubeconfig: Path,
    free: Ports,
    *,
    node_selector: str,
    lease_seconds: int = KWOK_NODE_LEASE_SECONDS,
) -> list[str]:
    """kwok managing the Nodes whose annotations match `node_selector` (key=value)."""
    # Our own stages (kwok 0.8 has no built-in ones), and never a developer's ~/.kwok/kwok.yaml.
    config = workdir / "kwok.yaml"
    config.write_text(
        resources.files("gpuhealth_sim.controlplane").joinpath(KWOK_STAGES).read_text(encoding="utf-8")
    )
    return [
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={node_selector}",
        f"--node-lease-duration-seconds={lease_seconds}",
        f"--server-address={ports.LOOPBACK}:{free.kwok}",
        f"--cidr={POD_CIDR}",
        f"--node-ip={ports.LOOPBACK}",
    ]
