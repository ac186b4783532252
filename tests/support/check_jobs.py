"""The active-check integration tests' Job side: a templates ConfigMap with a check template, the chart's
PriorityClass, and the test playing the node (listing a node's check Jobs, ending a check's pod as a
kubelet would, with a termination message).

kwok runs check pods (label `gpuhealth.io/check`) and leaves them Running (its stages): only the test
(or the simulated fleet's executor) ends them; kube-scheduler binds and preempts them.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from kubernetes import client

import operator_harness
import repair_jobs
from gpuhealth_api import keys
from gpuhealth_sim import waiting
from gpuhealth_sim.fleet import repairs

TEMPLATES: Final = repair_jobs.TEMPLATES
TEMPLATE: Final = "QuickTest"
"""The check template the tests' policies name: a pause container (kwok runs nothing)."""
TIMEOUT: Final = 30.0
PRIORITY_CLASS: Final = "gpu-health-check"


def check_template() -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"labels": {"template": TEMPLATE}},
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "check",
                                "image": "registry.k8s.io/pause:3.10",
                                "resources": {"limits": {keys.GPU_RESOURCE: "1"}},
                            }
                        ]
                    }
                }
            },
        }
    )


def ensure_priority_class(k8s: client.ApiClient) -> None:
    """The chart's PriorityClass of check pods (one per cluster: shared by every test module)."""
    body = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": PRIORITY_CLASS},
        "value": -100,
        "preemptionPolicy": "Never",
        "description": "gpu-health active checks: below every workload",
    }
    try:
        client.SchedulingV1Api(k8s).create_priority_class(body)
    except client.ApiException as error:
        if error.status != 409:  # another test module made it: one per cluster
            raise


def jobs_namespace_fixture(prefix: str) -> Any:
    """A module fixture `jobs_namespace`: a namespace holding the TEMPLATES ConfigMap (the repair
    templates and TEMPLATE), and the PriorityClass; the namespace is deleted after the module."""

    @pytest.fixture(scope="module", name="jobs_namespace")
    def jobs_namespace(k8s: client.ApiClient) -> Iterator[str]:
        ensure_priority_class(k8s)
        templates = {**repair_jobs.repair_templates(), TEMPLATE: check_template()}
        with repair_jobs.templates_namespace(k8s, prefix, templates) as name:
            yield name

    return jobs_namespace


def active_check(**overrides: Any) -> dict[str, Any]:
    """A check every minute (the CRD's minimum) on nodes idle for 1 s, of TEMPLATE."""
    return {
        "name": "quick",
        "template": TEMPLATE,
        "everySeconds": 60,
        "idleForSeconds": 1,
        "timeoutSeconds": 60,
        "maxConcurrent": 10,
        **overrides,
    }


def check_policy(fleet: operator_harness.Fleet, *checks: Mapping[str, Any], **spec: Any) -> None:
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": "100%",
            # A rule is required; this one never fires on the tests' healthy facts.
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Event"}],
            "activeChecks": [dict(c) for c in checks or (active_check(),)],
            **spec,
        },
    )


def jobs(k8s: client.ApiClient, namespace: str, node: str | None = None) -> list[dict[str, Any]]:
    """The check Jobs (of `node`, or all) not being deleted."""
    selector = keys.CHECK_LABEL + (f",{keys.NODE_LABEL}={node}" if node else "")
    listed = client.BatchV1Api(k8s).list_namespaced_job(
        namespace, label_selector=selector, _preload_content=False
    )
    items: list[dict[str, Any]] = yaml.safe_load(listed.data)["items"]
    return [j for j in items if not j["metadata"].get("deletionTimestamp")]


def wait_job(k8s: client.ApiClient, namespace: str, node: str) -> dict[str, Any]:
    waiting.wait_until(
        lambda: jobs(k8s, namespace, node), timeout_seconds=TIMEOUT, message=f"{node}: a check Job"
    )
    (job,) = jobs(k8s, namespace, node)
    return job


def bound_pod(k8s: client.ApiClient, namespace: str, job: Mapping[str, Any]) -> dict[str, Any]:
    """The Job's pod once the scheduler bound it and kwok runs it."""
    selector = f"job-name={job['metadata']['name']}"

    def running() -> dict[str, Any] | None:
        listed = client.CoreV1Api(k8s).list_namespaced_pod(
            namespace, label_selector=selector, _preload_content=False
        )
        for pod in yaml.safe_load(listed.data)["items"]:
            if pod["spec"].get("nodeName") and (pod.get("status") or {}).get("phase") == "Running":
                return dict(pod)
        return None

    pod: dict[str, Any] = waiting.wait_until(
        running, timeout_seconds=TIMEOUT, message=f"the pod of {job['metadata']['name']} bound and Running"
    )
    return pod


def end(
    k8s: client.ApiClient, namespace: str, job: Mapping[str, Any], *, ok: bool, message: str = ""
) -> None:
    """Play the node: the check's pod exits (0 or 1) with `message` as its termination message."""
    pod = bound_pod(k8s, namespace, job)
    outcome = repairs.Outcome(ok, 0 if ok else 1, message)
    client.CoreV1Api(k8s).patch_namespaced_pod_status(
        pod["metadata"]["name"],
        namespace,
        repairs.terminal_status(pod, outcome, time.time()),
        _content_type="application/merge-patch+json",
    )


def condition(fleet: operator_harness.Fleet, node: str, kind: str) -> dict[str, object] | None:
    """The GPUNode's status condition of type `kind` (ActiveCheckFailed), or None while it has none."""
    found = [
        c for c in (fleet.gpunode(node).get("status") or {}).get("conditions") or [] if c["type"] == kind
    ]
    return found[0] if found else None


def runs(fleet: operator_harness.Fleet, node: str) -> list[dict[str, Any]]:
    """The node's GPUNode `status.checks[]`."""
    return list((fleet.gpunode(node).get("status") or {}).get("checks") or [])


def wait_run(fleet: operator_harness.Fleet, node: str, result: str, count: int = 1) -> list[dict[str, Any]]:
    return waiting.wait_until(
        lambda: (found := [r for r in runs(fleet, node) if r.get("result") == result])[count - 1 :] and found,
        timeout_seconds=TIMEOUT,
        message=f"{node}: {count} run(s) {result} in status.checks[]",
    )


RESTART_ARGS: Final = (
    "--lease-duration-seconds=2",
    "--lease-renew-seconds=0.5",
    "--lease-retry-seconds=0.5",
    "--tick-seconds=0.5",
)
"""A short Lease, so that the next operator leads soon after one is killed."""


def start_leader(
    kubeconfig: Path, log: Path, lease: str, jobs_namespace: str
) -> operator_harness.OperatorProcess:
    """An operator on `lease` (RESTART_ARGS, the tests' templates), once it leads: the restart tests
    start one, kill it and start the next on the same Lease."""
    process = operator_harness.OperatorProcess(
        kubeconfig=kubeconfig,
        log_path=log,
        lease_name=lease,
        identity=log.stem,
        extra_args=[*RESTART_ARGS, f"--repair-templates={jobs_namespace}/{TEMPLATES}"],
    ).start()
    waiting.wait_until(process.is_leading, timeout_seconds=30, message=f"{log.stem} leads")
    return process


def restart_fleet_fixture(prefix: str) -> Any:
    """A `fleet` fixture without the `operator` fixture: the restart tests start their own operators."""

    @pytest.fixture(name="fleet")
    def fleet(k8s: client.ApiClient) -> Iterator[operator_harness.Fleet]:
        with operator_harness.Fleet(k8s, label=f"{prefix}-{secrets.token_hex(3)}") as nodes:
            yield nodes

    return fleet
