"""`record` against a real API server keeps only the agent's pods, as the operator takes them.

A tenant's own DaemonSet with the agent's labels, in the tenant's namespace, is matched by the
selector (labels are anyone's to copy) but is not the agent (`agent_pods.is_agent`): it is not
recorded, so it cannot make a node's agent stale, or keep a dead one live, in a replay.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from kubernetes import client

import agent_daemonset
import operator_harness
from gpuhealth_operator.shared import settings
from gpuhealth_sim import waiting
from gpuhealth_sim.backtest import tracerecord, traces
from gpuhealth_sim.controlplane import local

TIMEOUT = 60.0
AGENT_LABELS = dict(label.split("=") for label in settings.DEFAULT_AGENT_POD_SELECTOR.split(","))
SELECTOR = settings.DEFAULT_AGENT_POD_SELECTOR


def test_record_keeps_the_agents_pods_and_not_a_tenants_daemonset_with_their_labels(
    crds: local.ControlPlane, k8s: client.ApiClient, tmp_path: Path
) -> None:
    fleet = operator_harness.Fleet(k8s, label=f"rns-{secrets.token_hex(3)}")
    name = f"{fleet.label}-0"
    agents, tenant = "gpu-health", f"tenant-{fleet.label}"
    for namespace in (agents, tenant):
        operator_harness.ensure_namespace(k8s, namespace)
    daemonset = f"agent-{fleet.label}"
    api = crds.api_client()
    recorder: tracerecord.Recorder | None = None
    try:
        fleet.add_node(name, report=False)
        for namespace in (agents, tenant):
            agent_daemonset.create(k8s, namespace, daemonset, AGENT_LABELS, {fleet.LABEL_KEY: fleet.label})
        pods = {ns: agent_daemonset.pod_on(fleet.core, ns, SELECTOR, name) for ns in (agents, tenant)}
        recorder = tracerecord.Recorder(api, tmp_path / "t.jsonl.gz", agent_pod_namespace=agents).start()
        agent_daemonset.set_ready(fleet.core, tenant, pods[tenant], False)  # the tenant's pod first...
        written = recorder.records
        agent_daemonset.set_ready(fleet.core, agents, pods[agents], True)  # ...then the agent's, one stream
        waiting.wait_until(
            lambda: recorder is not None and recorder.records > written,
            timeout_seconds=TIMEOUT,
            message="the agent pod's change recorded",
        )
    finally:
        if recorder is not None:
            recorder.stop()
        for namespace in (agents, tenant):
            agent_daemonset.delete(k8s, namespace, daemonset)
        fleet.cleanup()
        api.close()  # type: ignore[no-untyped-call]

    with traces.open_trace(tmp_path / "t.jsonl.gz") as (header, records):
        recorded = {r["name"] for r in records if r["kind"] == "agentpod"}
    assert header["agentPodNamespace"] == agents
    assert f"{agents}/{pods[agents]}" in recorded, recorded
    assert not any(pod.startswith(f"{tenant}/") for pod in recorded), recorded
